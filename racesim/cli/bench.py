"""``racesim bench``: simulation speed, time to first bug, scaling (parse, call, render)."""

from __future__ import annotations

import click

from racesim.cli.progress import ProgressBar
from racesim.cli.support import console as _console
from racesim.cli.support import emit_json as _emit_json

__all__ = ["bench_cmd"]


@click.command("bench")
@click.option("--quick", is_flag=True, help="Tiny sizes (a smoke run, figures not meaningful).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def bench_cmd(quick: bool, as_json: bool) -> None:
    """Measure simulation speed against bare simpy, time to first bug, scaling and speedup."""
    from racesim.bench import run_bench
    from racesim.bench.render import print_bench

    if as_json:
        doc = run_bench(quick=quick)
        _emit_json(doc)
        return
    bar = ProgressBar(True, "bench")  # a bar on a terminal, one line per phase in a log
    try:
        doc = run_bench(quick=quick, progress=bar.start)
        bar.finish()
    finally:
        bar.close()
    print_bench(_console(), doc)
