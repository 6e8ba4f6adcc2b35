"""The ``racesim`` command line: parse, call the library, render. Nothing else lives here."""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from racesim.cli.conform import conform_cmd
from racesim.cli.corpus import corpus_cmd
from racesim.cli.matrix import matrix_cmd
from racesim.cli.options import engine_option as _engine
from racesim.cli.options import explore_options as _explore_options
from racesim.cli.options import output_options as _outputs
from racesim.cli.options import run_options as _run_options
from racesim.cli.options import strict_option as _strict
from racesim.cli.options import vllm_option as _vllm_option
from racesim.cli.support import BUDGET as _BUDGET
from racesim.cli.support import PipeAwareGroup, PipeClosed, quiet_stdout
from racesim.cli.support import check_workers as _check_workers
from racesim.cli.support import console as _console
from racesim.cli.support import emit_json as _emit_json
from racesim.cli.support import fail as _fail
from racesim.cli.support import output_dir as _output_dir
from racesim.cli.support import output_file as _output_file
from racesim.cli.support import parse_options as _options
from racesim.cli.support import replay_note as _replay_note
from racesim.cli.support import warn_accounting as _warn_accounting
from racesim.documents import read_counterexample, run_document
from racesim.engine_model import INVARIANTS, POINTS, POLICIES
from racesim.engine_model.versions import DEFAULT_VLLM, MID_STEP_WIDTHS, PROFILES, get_profile
from racesim.explore import explore
from racesim.cli.progress import ProgressBar
from racesim.cli.render import print_explore, print_run
from racesim.reports.verdict import exit_status
from racesim.runner import (
    RunSpec,
    parse_delay_option,
    policy_title,
    replay_command,
    run_command,
)
from racesim.scenarios import bundled_names, corpus_names, load_scenario
from racesim.sim import InputError, build_info
from racesim.explore.unreached import unreached_warnings

__all__ = ["main", "cli"]


@click.group(cls=PipeAwareGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="racesim",
                      message=f"%(prog)s %(version)s, {build_info()}")
def cli() -> None:
    """Deterministic race-condition simulator for vLLM V1 request lifecycles.

    Replays, explores and shrinks request-ID races (vLLM #15326, #29355, #20139, #27711)
    against lifecycle policies on a vLLM release profile (--vllm, default 0.33), checks
    invariants, labels each race live (reachable in vLLM as released) or latent (needs a delay
    where that release never yields), and writes HTML race reports.

    \b
    Exit status: 0 no race (an accounting-only violation such as metrics-exact is a warning;
    --strict counts it), 1 a race (a safety or liveness invariant broke), 2 bad input or a
    user policy that raised, 130 interrupted (after writing what was found). matrix exits 0
    when it completed, 1 only with --fail-on-race and a racing cell.
    """


# -- list ---------------------------------------------------------------------------------------

@cli.command("list")
@click.argument("what", required=False,
                type=click.Choice(["scenarios", "corpus", "policies", "points", "invariants",
                                   "versions"]))
@_vllm_option(f"{DEFAULT_VLLM}; the profile whose await-point widths are listed")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def list_cmd(what: str | None, vllm: str | None, as_json: bool) -> None:
    """List bundled scenarios, corpus entries (real vLLM bugs), policies, await points (with
    their width in a vLLM profile), invariants or vLLM version profiles."""
    profile = get_profile(vllm)
    sections: dict[str, list[dict[str, Any]]] = {}
    if what in (None, "scenarios"):
        sections["scenarios"] = [{"name": n, "meaning": load_scenario(n).summary}
                                 for n in bundled_names()]
    if what in (None, "corpus"):
        sections["corpus"] = [_corpus_row(n) for n in corpus_names()]
    if what in (None, "policies"):
        sections["policies"] = [{"name": n, "meaning": f"{c.summary} [{c.source}]"}
                                for n, c in POLICIES.items()]
    if what in (None, "points"):
        sections["points"] = [{"name": p.name, "width": profile.width(p.name),
                               **({"width_mid_step": MID_STEP_WIDTHS[p.name]}
                                  if p.name in MID_STEP_WIDTHS else {}),
                               "meaning": p.meaning + (f" (default: {p.natural})"
                                                       if p.natural != "0" else "")}
                              for p in POINTS]
    if what in (None, "invariants"):
        sections["invariants"] = [{"name": n, "meaning": m} for n, m in INVARIANTS.items()]
    if what in (None, "versions"):
        sections["versions"] = _versions_rows()
    if as_json:
        _emit_json(sections)
        return
    console = _console()
    for title, rows in sections.items():
        console.print(f"[bold]{title}[/bold]"
                      + (f" (widths in vLLM {profile.name})" if title == "points"
                         else " (first sentence; 'racesim show NAME' prints the whole scenario)"
                         if title == "scenarios"
                         else " (real vLLM bugs; 'racesim corpus' explores them)"
                         if title == "corpus" else ""))
        width = max(len(r["name"]) for r in rows) if rows else 0
        for r in rows:
            width_tag = f"[{r['width']}] " if "width" in r else ""
            if "width_mid_step" in r:  # a width that depends on the step's size
                width_tag = f"[{r['width']}; {r['width_mid_step']} mid-step] "
            meaning = _first_sentence(r["meaning"]) if title == "scenarios" else r["meaning"]
            console.print(f"  {r['name'].ljust(width)}  {width_tag}{meaning}", markup=False)
            for b in r.get("behaviours", ()):
                console.print(f"      - {b['text']} ({b['source']})", markup=False)


def _corpus_row(name: str) -> dict[str, Any]:
    info = load_scenario(name).corpus
    assert info is not None  # corpus files are checked to carry [corpus] (tests)
    return {"name": name, "issue": info.issue, "fix_pr": info.fix_pr, "fix_kind": info.fix_kind,
            "buggy_release": info.buggy_release, "fixed_release": info.fixed_release,
            "invariant": info.invariant,
            "meaning": f"#{info.issue} ({info.fix_text}): {info.title} "
                       f"[{info.buggy_release} -> {info.fixed_release}, {info.invariant}]"}


def _versions_rows() -> list[dict[str, Any]]:
    """One row per profile: its release, what each backend runs of it, and the install state
    (read from package metadata, without importing vLLM)."""
    from racesim.engine_model.versions import RELEASE_OF
    from racesim.runner.engines import SUPPORTED_VLLM, install_command, installed_vllm

    installed = installed_vllm()
    rows = []
    for v in PROFILES.values():
        release = RELEASE_OF.get(v.name, f"{v.name}.x (main at f90d34b)")
        backend = v.name in SUPPORTED_VLLM
        here = backend and installed is not None and \
            (installed == release or installed.startswith(f"{v.name}."))
        state = ("installed" if here else f"not installed: {install_command(release)}"
                 ) if backend else "model only"
        tag = (f"[release {release}; model: yes; vllm backend: "
               f"{'yes' if backend else 'no'} ({state})] ")
        rows.append({"name": v.name, "release": release, "model": True, "vllm_backend": backend,
                     "installed": here,
                     "meaning": tag + v.release + (" (default)" if v.name == DEFAULT_VLLM
                                                   else ""),
                     "behaviours": [{"text": b.text, "source": b.source} for b in v.behaviours]})
    return rows


#: a sentence ends at ". " (or "): ") before a word, not after "e.g." or "i.e."
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.(?=\s+[\w(])")


def _first_sentence(text: str) -> str:
    """A scenario summary's first sentence: one index line per scenario in ``racesim list``."""
    end = _SENTENCE_END.search(text)
    return text if end is None else text[:end.start() + 1]


@cli.command("show")
@click.argument("scenario")
def show_cmd(scenario: str) -> None:
    """Print SCENARIO's TOML (a bundled name or a path): a start for your own scenario."""
    from racesim.scenarios.loader import scenario_to_toml

    click.echo(scenario_to_toml(load_scenario(scenario)), nl=False)


# -- run ----------------------------------------------------------------------------------------

@cli.command("run")
@click.argument("scenario")
@_run_options
@_vllm_option()
@_engine()
@click.option("--witness", is_flag=True, help="Apply the scenario's [witness] schedule.")
@click.option("--delay", "delays", multiple=True, metavar="POINT[#K]=SECONDS",
              help="Delay every occurrence of a point, or only its K-th (from 0).")
@_outputs
def run_cmd(scenario: str, policy: str, policy_opts: Sequence[str], seed: int,
            skip: Sequence[str], vllm: str | None, engine: str | None, strict: bool,
            witness: bool, delays: Sequence[str],
            as_json: bool, html_file: str | None, trace_file: str | None) -> None:
    """Run SCENARIO (bundled name or path) once and check every invariant."""
    spec = RunSpec(load_scenario(scenario).with_vllm(vllm), policy,
                   tuple(_options(policy_opts).items()), seed, tuple(skip), engine or "model")
    plan = [parse_delay_option(d) for d in delays]
    _check_outputs(html_file, trace_file)
    result = spec.run(witness=witness, delays=plan)
    command = run_command(scenario, policy, spec.option_dict, seed, result.schedule, skip,
                          vllm=result.vllm, engine=result.engine)
    warnings = [*unreached_warnings("[delays]", spec.scenario.delays, result.occurrences),
                *(unreached_warnings("[witness]", spec.scenario.witness, result.occurrences)
                  if witness else ()),
                *unreached_warnings("--delay", plan, result.occurrences)]
    _finish_run(spec, result, command, as_json, html_file, trace_file, strict, warnings)


def _check_outputs(html_file: str | None, trace_file: str | None) -> None:
    """Each output file can be written, and no two of them are one file."""
    _output_file("--html", html_file)
    _output_file("--trace", trace_file)
    if html_file and trace_file and \
            os.path.realpath(html_file) == os.path.realpath(trace_file) and \
            not _is_char_device(html_file):  # /dev/null may take both
        raise InputError(f"--html {html_file!r} and --trace {trace_file!r} name the same file; "
                         f"give each its own")


def _is_char_device(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def _finish_run(spec: RunSpec, result: Any, command: str, as_json: bool, html_file: str | None,
                trace_file: str | None, strict: bool, warnings: Sequence[str] = ()) -> None:
    if html_file:
        from racesim.reports import write_run_report
        write_run_report(Path(html_file), spec.scenario, spec.policy, spec.option_dict, result,
                         command)
    if trace_file:
        from racesim.reports import write_chrome_trace
        write_chrome_trace(Path(trace_file), result)
    if as_json:
        _emit_json(run_document(spec, result))
    else:
        print_run(_console(), f"{spec.scenario.name} under {policy_title(spec.policy)}", result,
                  command, spec.skip)
        _say_written(html_file, trace_file)
    for line in warnings:
        click.echo(f"racesim: {line}", err=True)
    if not as_json:
        _warn_accounting(result.violated, strict)
    sys.exit(exit_status(result.violated, strict=strict))


def _say_written(html_file: str | None, trace_file: str | None) -> None:
    """Where the files asked for went (on stdout after the human-readable output)."""
    if html_file:
        click.echo(f"report: {html_file}")
    if trace_file:
        click.echo(f"trace: {trace_file} (open it in https://ui.perfetto.dev)")


@cli.command("replay")
@click.argument("counterexample", type=click.Path(dir_okay=False))
@click.option("--vllm", type=click.Choice(list(PROFILES)), default=None,
              help="Replay on another vLLM profile [default: the file's; 0.8 for files "
                   "written before profiles].")
@click.option("--allow-import", is_flag=True,
              help="Let the file's module:Class policy be imported (it runs that code).")
@_engine("the file's")
@_strict
@_outputs
def replay_cmd(counterexample: str, vllm: str | None, allow_import: bool, engine: str | None,
               strict: bool, as_json: bool, html_file: str | None,
               trace_file: str | None) -> None:
    """Replay a counterexample file: the same trace, byte for byte, anywhere.

    Only built-in policies are loaded unless --allow-import is given: a shared file must not
    run code on the reader's machine by surprise."""
    cx = read_counterexample(counterexample)
    if cx.policy not in POLICIES and not allow_import:
        raise InputError(f"{counterexample}: its policy {cx.policy!r} is not built in; replay "
                         f"imports a module:Class policy only with --allow-import")
    _check_outputs(html_file, trace_file)
    spec = RunSpec(cx.scenario.with_vllm(vllm), cx.policy, tuple(cx.options.items()), cx.seed,
                   cx.skip, engine or cx.engine)
    result = spec.run(schedule=cx.schedule)
    note = _replay_note(counterexample, cx, result, as_json)
    if note:
        click.echo(note, err=True)
    _finish_run(spec, result, replay_command(counterexample, cx.policy, result.engine), as_json,
                html_file, trace_file, strict)


# -- explore / matrix ---------------------------------------------------------------------------

@cli.command("explore")
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
@_engine()
@_explore_options
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False),
              help="Write the HTML explore report.")
def explore_cmd(scenario: str, policy: str, policy_opts: Sequence[str], budget: int,
                strict: bool, time_limit: float | None, reach: str, vllm: str | None,
                engine: str | None, skip: Sequence[str], strategy: str, seed: int,
                workers: int | None, dask: str | None, out_dir: str, as_json: bool,
                html_file: str | None) -> None:
    """Search SCENARIO's schedules for a race under POLICY (the [witness] is never read)."""
    from racesim.explore import counterexample_path, unshrunk_path

    scen = load_scenario(scenario).with_vllm(vllm)
    options = _options(policy_opts)
    out = _output_dir("--out", out_dir)  # first: --html may name a file inside it
    _output_file("--html", html_file)
    _check_workers(workers, dask)
    cx_path = counterexample_path(out, scen.name, policy, strategy, seed, engine or "model")
    _output_file("--out", str(cx_path))
    _output_file("--out", str(unshrunk_path(cx_path)))
    bar = ProgressBar(not as_json, f"{scen.name} / {policy}", time_limit=time_limit)
    try:
        res = explore(scen, policy, options=options, strategy=strategy, budget=budget,
                      time_limit=time_limit, seed=seed, workers=workers, dask=dask, skip=skip,
                      out_dir=out, progress=bar, reach=reach, engine=engine or "model")
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
                      replay_command(res.counterexample_path, policy, res.engine)
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


@cli.command("bench")
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


cli.add_command(matrix_cmd)
cli.add_command(conform_cmd)
cli.add_command(corpus_cmd)


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
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("racesim: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        _fail(exc.format_message())
    except PipeClosed:  # the reader of stdout has gone (| head): what it wanted, it has
        quiet_stdout()
        sys.exit(0)
    except OSError as exc:  # an output file that cannot be written after all (disk full, ...)
        _fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))
    sys.exit(0)


