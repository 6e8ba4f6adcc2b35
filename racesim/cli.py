"""The ``racesim`` command line: parse, call the library, render. Nothing else lives here."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console

from engine_model import INVARIANTS, POINTS, POLICIES
from engine_model.checker import check_invariant_names
from engine_model.policies import policy_spec
from racesim.documents import read_counterexample, run_document
from racesim.render import print_run
from racesim.runner import parse_delay_option, replay_command, run_command, run_scenario
from scenarios import bundled_names, load_scenario
from sim import InputError

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


def _emit_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, ensure_ascii=False))


def _console() -> Console:
    return Console(highlight=False, soft_wrap=False)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="racesim")
def cli() -> None:
    """Deterministic race-condition simulator for vLLM V1 request lifecycles.

    Replays, explores and shrinks request-ID races (vLLM #15326, #29355, #20139, #27711)
    against lifecycle policies, checks invariants, and writes HTML race reports.
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
    result = run_scenario(scen, policy, options=options, seed=seed, witness=witness,
                          delays=plan, skip=skip)
    command = run_command(scenario, policy, options, seed, result.schedule, skip)
    _finish_run(scen, policy, options, result, command, skip, as_json, html_file, trace_file)


def _finish_run(scen: Any, policy: str, options: dict[str, str], result: Any, command: str,
                skip: Sequence[str], as_json: bool, html_file: str | None,
                trace_file: str | None) -> None:
    if html_file:
        from reports import write_run_report
        write_run_report(Path(html_file), scen, policy, options, result, command)
    if trace_file:
        from reports import write_chrome_trace
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
    result = run_scenario(cx.scenario, cx.policy, options=cx.options, seed=cx.seed,
                          schedule=cx.schedule, skip=cx.skip)
    if not as_json and result.trace_hash != cx.trace_hash:
        click.echo(f"warning: trace hash {result.trace_hash} differs from the recorded "
                   f"{cx.trace_hash} (the model changed since it was written)", err=True)
    _finish_run(cx.scenario, cx.policy, dict(cx.options), result,
                replay_command(counterexample), cx.skip, as_json, html_file, trace_file)


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
    sys.exit(0)


_ = (check_invariant_names, policy_spec)
