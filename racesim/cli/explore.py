"""``racesim explore``: search a scenario's schedules for a race (parse, call, render)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click

from racesim.cli.options import backend_options as _backend
from racesim.cli.options import explore_options as _explore_options
from racesim.cli.options import ids_option as _ids
from racesim.cli.options import vllm_option as _vllm_option
from racesim.cli.progress import ProgressBar
from racesim.cli.render import print_explore
from racesim.cli.support import BUDGET as _BUDGET
from racesim.cli.support import check_workers as _check_workers
from racesim.cli.support import console as _console
from racesim.cli.support import emit_json as _emit_json
from racesim.cli.support import output_dir as _output_dir
from racesim.cli.support import output_file as _output_file
from racesim.cli.support import parse_options as _options
from racesim.cli.support import say_written as _say_written
from racesim.cli.support import warn_accounting as _warn_accounting
from racesim.explore import explore
from racesim.reports.verdict import exit_status
from racesim.runner import MODEL, Backend, replay_command
from racesim.scenarios import load_scenario

__all__ = ["explore_cmd"]


@click.command("explore")
@click.argument("scenario")
@click.option("-p", "--policy", default="buggy", show_default=True,
              help="Policy name or package.module:ClassName.")
@click.option("--policy-opt", "policy_opts", multiple=True, metavar="KEY=VALUE",
              help="A policy option (repeatable).")
@click.option("--budget", type=_BUDGET, default=300, show_default=True,
              help="Runs to try (run 0 is the unperturbed baseline).")
@click.option("--reach", type=click.Choice(["all", "live"]), default="all", show_default=True,
              help="'live': delay only await points that are live or yield in the vLLM "
                   "profile (races vLLM can hit as released).")
@_vllm_option()
@_backend()
@_ids
@_explore_options
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False),
              help="Write the HTML explore report.")
def explore_cmd(scenario: str, policy: str, policy_opts: Sequence[str], budget: int,
                strict: bool, time_limit: float | None, reach: str, ids: str | None,
                vllm: str | None,
                backend: Backend | None, skip: Sequence[str], strategy: str, seed: int,
                workers: int | None, dask: str | None, out_dir: str, as_json: bool,
                html_file: str | None) -> None:
    """Search SCENARIO's schedules for a race under POLICY (the [witness] is never read)."""
    from racesim.explore import counterexample_path, unshrunk_path

    backend = backend or MODEL
    scen = load_scenario(scenario).with_vllm(vllm or (backend.base if backend.has_tree else None))
    options = _options(policy_opts)
    out = _output_dir("--out", out_dir)  # first: --html may name a file inside it
    _output_file("--html", html_file)
    _check_workers(workers, dask)
    cx_path = counterexample_path(out, scen.name, policy, strategy, seed, backend.file_tag)
    _output_file("--out", str(cx_path))
    _output_file("--out", str(unshrunk_path(cx_path)))
    bar = ProgressBar(not as_json, f"{scen.name} / {policy}", time_limit=time_limit)
    try:
        res = explore(scen, policy, options=options, strategy=strategy, budget=budget,
                      time_limit=time_limit, seed=seed, workers=workers, dask=dask, skip=skip,
                      out_dir=out, progress=bar, reach=reach, engine=backend,
                      ids=ids)
    finally:
        bar.close()
    doc = res.document()
    after = res.final_run
    before = None
    if html_file and after is not None and res.found_run is not None:
        before = res.spec.run(schedule=res.found_run.schedule)
    if html_file:
        from racesim.reports import write_explore_report
        write_explore_report(Path(html_file), doc, scen, before, after)
    if as_json:
        _emit_json(doc)
    else:
        print_explore(_console(), doc, after,
                      replay_command(res.counterexample_path, policy, res.engine,
                                     backend.cli_args() if backend.has_tree else ())
                      if res.counterexample_path else "")
        _say_written(html_file, None)
    for line in res.warnings:
        click.echo(f"racesim: {line}", err=True)
    if res.interrupted:
        click.echo("racesim: interrupted; kept what was found"
                   + (f" ({res.counterexample_path})" if res.counterexample_path else ""),
                   err=True)
        sys.exit(130)
    if not as_json:
        _warn_accounting(res.invariants, strict)
    sys.exit(exit_status(res.invariants, strict=strict))
