"""``racesim matrix``: every scenario under every policy (parse, call, render)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from racesim.cli.options import backend_options as _backend
from racesim.cli.options import ids_option as _ids
from racesim.cli.options import matrix_options as _matrix_options
from racesim.cli.options import vllm_option as _vllm_option
from racesim.cli.support import BUDGET as _BUDGET
from racesim.cli.support import check_workers as _check_workers
from racesim.cli.support import console as _console
from racesim.cli.support import emit_json as _emit_json
from racesim.cli.support import fail as _fail
from racesim.cli.support import output_dir as _output_dir
from racesim.cli.support import output_file as _output_file
from racesim.engine_model.checker import check_invariant_names
from racesim.engine_model.policies import id_scheme, policy_spec
from racesim.runner.engines import cannot_run, why_not_run
from racesim.explore.matrix import DEFAULT_POLICIES, cell_outcome, run_matrix
from racesim.cli.progress import ProgressBar
from racesim.cli.render import matrix_summary, print_matrix
from racesim.reports.verdict import exit_status
from racesim.runner import MODEL, Backend, import_from_cwd
from racesim.scenarios import bundled_names, load_scenario
from racesim.sim import InputError

__all__ = ["matrix_cmd"]


@click.command("matrix")
@click.option("-s", "--scenario", "scenario_names", multiple=True,
              help="Scenario (repeatable) [default: every bundled scenario].")
@click.option("-p", "--policy", "policies", multiple=True,
              help="Policy (repeatable) [default: shipped, the release as shipped, first; then "
                   "buggy, abort-scope, engine-final (vllm backend: shipped, buggy)].")
@click.option("--budget", type=_BUDGET, default=100, show_default=True, help="Runs per cell.")
@_vllm_option()
@_backend()
@_ids
@_matrix_options
@click.option("--fail-on-race", is_flag=True,
              help="Exit 1 when a cell races (with --strict, also when one is accounting-only).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False),
              help="Write the HTML matrix report (and a run report per failing cell).")
def matrix_cmd(scenario_names: Sequence[str], policies: Sequence[str], budget: int,
               ids: str | None, vllm: str | None, backend: Backend | None, strict: bool,
               time_limit: float | None,
               skip: Sequence[str],
               strategy: str, seed: int, workers: int | None, dask: str | None, out_dir: str,
               fail_on_race: bool, as_json: bool, html_file: str | None) -> None:
    """Explore every scenario under every policy on the same seeds: what each release ships
    first (policy shipped), then the other configurations.

    Exits 0 when it completed, whatever it found; 1 with --fail-on-race and a racing cell."""
    backend = backend or MODEL
    engine = backend.engine
    vllm = vllm or (backend.base if backend.has_tree else None)
    scens = [load_scenario(n).with_vllm(vllm) for n in (scenario_names or bundled_names())]
    if not scenario_names:  # every bundled scenario the profile (and backend) can run
        left = [s.name for s in scens if cannot_run(s.workload, engine)]
        scens = [s for s in scens if s.name not in left]
        if left:
            on = f"vLLM {vllm}" if vllm else "each scenario's vLLM profile"
            click.echo(f"racesim: matrix on {on} ({backend.label} backend) leaves out "
                       f"{', '.join(left)} "
                       f"(engine features not modelled on that profile, or model-only on that "
                       f"backend)", err=True)
    for s in scens:  # a scenario asked for by name: refused before any cell runs
        if (why := why_not_run(s.workload, engine)) is not None:
            raise InputError(f"{s.name}: {why}")
    pols = list(policies or DEFAULT_POLICIES[engine or "model"])
    for p in pols:
        import_from_cwd(p)
        id_scheme(policy_spec(p), ids)  # --ids refused for a policy with its own IDs
    check_invariant_names(tuple(skip))
    if time_limit is not None and not time_limit > 0:
        raise InputError(f"--time-limit must be > 0 seconds, got {time_limit}")
    out = _output_dir("--out", out_dir)  # first: --html may name a file inside it
    _output_file("--html", html_file)
    if html_file:
        from racesim.documents.report_files import check_cells_dir
        if (why := check_cells_dir(Path(html_file))) is not None:
            raise InputError(f"--html {html_file!r}: {why}")
    _check_workers(workers, dask)
    bar = ProgressBar(not as_json, "matrix", time_limit=time_limit)

    def on_cell(done: int, total: int, res: Any) -> None:
        if res is None:  # a cell starts: on a terminal its bar, in a log its line when done
            scen, policy = divmod(done, len(pols))
            bar.start(f"{scens[scen].name} / {pols[policy]}", steps=total)
        else:
            bar.finish(cell_outcome(res))

    try:
        result = run_matrix(scens, pols, budget=budget, seed=seed, strategy=strategy,
                            workers=workers, dask=dask, skip=skip, out_dir=out,
                            on_cell=on_cell, progress=bar, time_limit=time_limit,
                            engine=backend or "model", ids=ids)
    finally:
        bar.close()
    doc = result.document()
    cells = None
    if html_file:
        from racesim.documents.report_files import write_matrix_reports
        cells = write_matrix_reports(Path(html_file), doc, result)
    if as_json:
        _emit_json(doc)
    else:
        console = _console()
        print_matrix(console, doc)
        written = [c["counterexample"]["path"] for c in doc["cells"]
                   if c.get("counterexample") and c["counterexample"].get("path")]
        console.print(matrix_summary(doc) + f"; {len(written)} counterexample file"
                      f"{'' if len(written) == 1 else 's'} written", markup=False)
        for c in doc["cells"]:
            if c.get("stopped_early"):
                console.print(f"stopped before --budget: {c['scenario']} / {c['policy']}: "
                              f"{c['stopped_early']}", markup=False)
        if written:  # the folder alone: a path is never wrapped, so it must stay short
            click.echo(f"counterexamples: {out}/")
        if html_file:
            click.echo(f"report: {html_file}" + (f" (failing cells' reports in {cells}/)"
                                                   if cells is not None and cells.is_dir()
                                                   else ""))
    for line in dict.fromkeys(w for c in doc["cells"] for w in c.get("warnings") or ()):
        click.echo(f"racesim: {line}", err=True)
    if result.errors:
        _fail(result.errors[0])
    if result.interrupted:
        click.echo("racesim: interrupted; kept the cells finished so far", err=True)
        sys.exit(130)
    worst = max((exit_status(c["invariants"], strict=strict) for c in doc["cells"]), default=0)
    sys.exit(worst if fail_on_race else 0)
