"""The ``racesim`` command line: parse, call the library, render. Nothing else lives here."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console

from racesim.documents import read_counterexample, run_document
from racesim.engine_model import INVARIANTS, POINTS, POLICIES
from racesim.engine_model.checker import check_invariant_names
from racesim.engine_model.policies import policy_spec
from racesim.explore import explore
from racesim.matrix import run_matrix
from racesim.render import print_explore, print_matrix, print_run
from racesim.runner import parse_delay_option, replay_command, run_command, run_scenario
from racesim.scenarios import bundled_names, load_scenario
from racesim.sim import InputError, build_info
from racesim.sim.strategies import STRATEGIES

__all__ = ["main", "cli"]


def _fail(message: str) -> NoReturn:
    click.echo(f"racesim: error: {' '.join(str(message).split())}", err=True)
    sys.exit(2)


def _options(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"--policy-opt {pair!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _output_file(option: str, path: str | None) -> None:
    """Refuse an output file whose folder does not exist, before any work is done."""
    if path is None:
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise InputError(f"{option} {path!r}: folder {str(parent)!r} does not exist")
    if Path(path).is_dir():
        raise InputError(f"{option} {path!r}: is a folder, not a file")


def _output_dir(option: str, path: str) -> Path:
    """Create the output folder now, so that a bad one fails before exploring, not after."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{option} {path!r}: cannot create it ({exc.strerror})") from None
    return Path(path)


_BUDGET = click.IntRange(1, 2**31)


def _emit_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, ensure_ascii=False))


def _console() -> Console:
    return Console(highlight=False, soft_wrap=False)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="racesim",
                      message=f"%(prog)s %(version)s, {build_info()}")
def cli() -> None:
    """Deterministic race-condition simulator for vLLM V1 request lifecycles.

    Replays, explores and shrinks request-ID races (vLLM #15326, #29355, #20139, #27711)
    against lifecycle policies, checks invariants, and writes HTML race reports.

    Exit status: 0 no violation, 1 a violation was found, 2 bad input.
    """


# -- list ---------------------------------------------------------------------------------------

@cli.command("list")
@click.argument("what", required=False,
                type=click.Choice(["scenarios", "policies", "points", "invariants"]))
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def list_cmd(what: str | None, as_json: bool) -> None:
    """List bundled scenarios, policies, await points or invariants."""
    sections: dict[str, list[tuple[str, str]]] = {}
    if what in (None, "scenarios"):
        sections["scenarios"] = [(n, load_scenario(n).summary) for n in bundled_names()]
    if what in (None, "policies"):
        sections["policies"] = [(n, f"{c.summary} [{c.source}]") for n, c in POLICIES.items()]
    if what in (None, "points"):
        sections["points"] = [(p.name, p.meaning + (f" (default: {p.natural})"
                                                    if p.natural != "0" else ""))
                              for p in POINTS]
    if what in (None, "invariants"):
        sections["invariants"] = list(INVARIANTS.items())
    if as_json:
        _emit_json({k: [{"name": n, "meaning": m} for n, m in v] for k, v in sections.items()})
        return
    console = _console()
    for title, rows in sections.items():
        console.print(f"[bold]{title}[/bold]")
        width = max(len(n) for n, _ in rows) if rows else 0
        for name, meaning in rows:
            console.print(f"  {name.ljust(width)}  {meaning}", markup=False)


# -- run ----------------------------------------------------------------------------------------

def _run_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--skip", multiple=True, metavar="INVARIANT",
                     help="Leave an invariant unchecked (repeatable).")(f)
    f = click.option("--seed", type=int, default=0, show_default=True, help="Run seed.")(f)
    f = click.option("--policy-opt", "policy_opts", multiple=True, metavar="KEY=VALUE",
                     help="A policy option (repeatable).")(f)
    f = click.option("-p", "--policy", default="buggy", show_default=True,
                     help="Policy name or package.module:ClassName.")(f)
    return f


def _outputs(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--trace", "trace_file", type=click.Path(dir_okay=False),
                     help="Write Chrome trace-event JSON (opens in Perfetto).")(f)
    f = click.option("--html", "html_file", type=click.Path(dir_okay=False),
                     help="Write a self-contained HTML race report.")(f)
    f = click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")(f)
    return f


@cli.command("run")
@click.argument("scenario")
@_run_options
@click.option("--witness", is_flag=True, help="Apply the scenario's [witness] schedule.")
@click.option("--delay", "delays", multiple=True, metavar="POINT[#K]=SECONDS",
              help="Delay every occurrence of a point, or only its K-th (from 0).")
@_outputs
def run_cmd(scenario: str, policy: str, policy_opts: Sequence[str], seed: int,
            skip: Sequence[str], witness: bool, delays: Sequence[str], as_json: bool,
            html_file: str | None, trace_file: str | None) -> None:
    """Run SCENARIO (bundled name or path) once and check every invariant."""
    scen = load_scenario(scenario)
    options = _options(policy_opts)
    plan = [parse_delay_option(d) for d in delays]
    _output_file("--html", html_file)
    _output_file("--trace", trace_file)
    result = run_scenario(scen, policy, options=options, seed=seed, witness=witness,
                          delays=plan, skip=skip)
    command = run_command(scenario, policy, options, seed, result.schedule, skip)
    _finish_run(scen, policy, options, result, command, skip, as_json, html_file, trace_file)


def _finish_run(scen: Any, policy: str, options: dict[str, str], result: Any, command: str,
                skip: Sequence[str], as_json: bool, html_file: str | None,
                trace_file: str | None) -> None:
    if html_file:
        from racesim.reports import write_run_report
        write_run_report(Path(html_file), scen, policy, options, result, command)
    if trace_file:
        from racesim.reports import write_chrome_trace
        write_chrome_trace(Path(trace_file), result)
    if as_json:
        _emit_json(run_document(scen, policy, options, result))
    else:
        print_run(_console(), f"{scen.name} under {policy}", result, command, skip)
    sys.exit(1 if result.violations else 0)


@cli.command("replay")
@click.argument("counterexample", type=click.Path(dir_okay=False))
@_outputs
def replay_cmd(counterexample: str, as_json: bool, html_file: str | None,
               trace_file: str | None) -> None:
    """Replay a counterexample file: the same trace, byte for byte, anywhere."""
    cx = read_counterexample(counterexample)
    _output_file("--html", html_file)
    _output_file("--trace", trace_file)
    result = run_scenario(cx.scenario, cx.policy, options=cx.options, seed=cx.seed,
                          schedule=cx.schedule, skip=cx.skip)
    if not as_json and result.trace_hash != cx.trace_hash:
        click.echo(f"warning: trace hash {result.trace_hash} differs from the recorded "
                   f"{cx.trace_hash} (the model changed since it was written)", err=True)
    _finish_run(cx.scenario, cx.policy, dict(cx.options), result,
                replay_command(counterexample), cx.skip, as_json, html_file, trace_file)


# -- explore / matrix ---------------------------------------------------------------------------

class _Bar:
    """A rich progress bar on stderr that appears only once work has taken over a second."""

    def __init__(self, enabled: bool, label: str) -> None:
        self.enabled = enabled
        self.label = label
        self.started = time.monotonic()
        self.progress: Any = None
        self.task: Any = None

    def __call__(self, done: int, total: int, violating: int) -> None:
        if not self.enabled:
            return
        if self.progress is None:
            if time.monotonic() - self.started < 1.0:
                return
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                     MofNCompleteColumn(), TextColumn("{task.fields[v]}"),
                                     console=Console(stderr=True), transient=True)
            self.progress.start()
            self.task = self.progress.add_task(self.label, total=total, v="")
        self.progress.update(self.task, completed=done, total=total,
                             v=f"{violating} violating")

    def relabel(self, label: str) -> None:
        self.label = label
        if self.progress is not None:
            self.progress.update(self.task, description=label, completed=0)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _explore_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--out", "out_dir", type=click.Path(file_okay=False),
                     default="racesim-out", show_default=True,
                     help="Where counterexample files are written.")(f)
    f = click.option("--dask", default=None, metavar="ADDRESS",
                     help="Run on a Dask cluster (pip install 'racesim[dask]').")(f)
    f = click.option("--workers", type=int, default=None,
                     help="Worker processes [default: all cores].")(f)
    f = click.option("--seed", type=int, default=0, show_default=True, help="Base seed.")(f)
    f = click.option("--strategy", type=click.Choice(list(STRATEGIES)), default="random",
                     show_default=True,
                     help="How delays are chosen (hypothesis runs in this process).")(f)
    f = click.option("--skip", multiple=True, metavar="INVARIANT",
                     help="Leave an invariant unchecked (repeatable).")(f)
    return f


@cli.command("explore")
@click.argument("scenario")
@click.option("-p", "--policy", required=True, help="Policy name or package.module:ClassName.")
@click.option("--policy-opt", "policy_opts", multiple=True, metavar="KEY=VALUE",
              help="A policy option (repeatable).")
@click.option("--budget", type=_BUDGET, default=300, show_default=True,
              help="Runs to try (run 0 is the unperturbed baseline).")
@click.option("--time-limit", type=float, default=None,
              help="Stop exploring after this many seconds (shrinking is bounded by runs).")
@_explore_options
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False),
              help="Write the HTML explore report.")
def explore_cmd(scenario: str, policy: str, policy_opts: Sequence[str], budget: int,
                time_limit: float | None, skip: Sequence[str], strategy: str, seed: int,
                workers: int | None, dask: str | None, out_dir: str, as_json: bool,
                html_file: str | None) -> None:
    """Search SCENARIO's schedules for a race under POLICY (the [witness] is never read)."""
    scen = load_scenario(scenario)
    options = _options(policy_opts)
    _output_file("--html", html_file)
    out = _output_dir("--out", out_dir)
    bar = _Bar(not as_json, f"{scen.name} / {policy}")
    try:
        res = explore(scen, policy, options=options, strategy=strategy, budget=budget,
                      time_limit=time_limit, seed=seed, workers=workers, dask=dask, skip=skip,
                      out_dir=out, progress=bar)
    finally:
        bar.close()
    doc = res.document()
    after = res.final_run
    before = None
    if html_file and after is not None and res.found_run is not None:
        before = run_scenario(scen, policy, options=options, seed=seed,
                              schedule=res.found_run.schedule, skip=res.skip)
    if html_file:
        from racesim.reports import write_explore_report
        write_explore_report(Path(html_file), doc, scen, before, after)
    if as_json:
        _emit_json(doc)
    else:
        print_explore(_console(), doc, after,
                      replay_command(res.counterexample_path) if res.counterexample_path else "")
    if res.interrupted:
        click.echo("racesim: interrupted; kept what was found", err=True)
    sys.exit(1 if res.violating_runs else (130 if res.interrupted else 0))


@cli.command("matrix")
@click.option("-s", "--scenario", "scenario_names", multiple=True,
              help="Scenario (repeatable) [default: every bundled scenario].")
@click.option("-p", "--policy", "policies", multiple=True,
              help="Policy (repeatable) [default: every built-in policy].")
@click.option("--budget", type=_BUDGET, default=100, show_default=True, help="Runs per cell.")
@_explore_options
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False),
              help="Write the HTML matrix report (and a run report per failing cell).")
def matrix_cmd(scenario_names: Sequence[str], policies: Sequence[str], budget: int,
               skip: Sequence[str], strategy: str, seed: int, workers: int | None,
               dask: str | None, out_dir: str, as_json: bool, html_file: str | None) -> None:
    """Explore every scenario under every policy on the same seeds: which policy closes what."""
    scens = [load_scenario(n) for n in (scenario_names or bundled_names())]
    pols = list(policies or POLICIES)
    for p in pols:
        policy_spec(p)
    check_invariant_names(tuple(skip))
    _output_file("--html", html_file)
    out = _output_dir("--out", out_dir)
    bar = _Bar(not as_json, "matrix")

    def on_cell(done: int, total: int, res: Any) -> None:
        if res is None:
            bar.relabel(f"cell {done + 1}/{total}")

    try:
        result = run_matrix(scens, pols, budget=budget, seed=seed, strategy=strategy,
                            workers=workers, dask=dask, skip=skip, out_dir=out,
                            on_cell=on_cell, progress=bar)
    finally:
        bar.close()
    doc = result.document()
    if html_file:
        from racesim.report_files import write_matrix_reports
        write_matrix_reports(Path(html_file), doc, result)
    if as_json:
        _emit_json(doc)
    else:
        print_matrix(_console(), doc)
        if html_file:
            click.echo(f"report: {html_file}")
    sys.exit(1 if any(c["violating_runs"] for c in doc["cells"]) else 0)


@cli.command("bench")
@click.option("--quick", is_flag=True, help="Tiny sizes (a smoke run, figures not meaningful).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def bench_cmd(quick: bool, as_json: bool) -> None:
    """Measure simulation speed against bare simpy, time to first bug, scaling and speedup."""
    from racesim.bench import run_bench
    from racesim.bench_render import print_bench

    console = Console(stderr=True)
    if as_json:
        doc = run_bench(quick=quick)
        _emit_json(doc)
        return
    with console.status("benchmarking") as status:
        doc = run_bench(quick=quick, progress=lambda what: status.update(what))
    print_bench(_console(), doc)


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: bad input is one line on stderr and exit status 2."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="racesim",
                 standalone_mode=False)
    except InputError as exc:
        _fail(str(exc))
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        sys.exit(2)
    except click.UsageError as exc:
        _fail(exc.format_message())
    except click.exceptions.Abort:
        click.echo("racesim: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        _fail(exc.format_message())
    except OSError as exc:  # an output file that cannot be written after all (disk full, ...)
        _fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))
    sys.exit(0)


