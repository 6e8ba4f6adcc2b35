"""``racesim run`` (a scenario once) and ``racesim replay`` (a counterexample file): parse,
call, render."""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from racesim.cli.options import backend_options as _backend
from racesim.cli.options import output_options as _outputs
from racesim.cli.options import run_options as _run_options
from racesim.cli.options import strict_option as _strict
from racesim.cli.options import vllm_option as _vllm_option
from racesim.cli.render import print_run
from racesim.cli.support import console as _console
from racesim.cli.support import emit_json as _emit_json
from racesim.cli.support import output_file as _output_file
from racesim.cli.support import parse_options as _options
from racesim.cli.support import replay_note as _replay_note
from racesim.cli.support import say_written as _say_written
from racesim.cli.support import warn_accounting as _warn_accounting
from racesim.documents import read_counterexample, run_document
from racesim.engine_model import POLICIES
from racesim.engine_model.versions import PROFILES
from racesim.explore.unreached import unreached_warnings
from racesim.runner.determinism import check_determinism
from racesim.reports.verdict import exit_status
from racesim.runner import (
    MODEL,
    Backend,
    RunSpec,
    as_backend,
    from_record,
    parse_delay_option,
    policy_title,
    replay_command,
    run_command,
)
from racesim.scenarios import load_scenario
from racesim.sim import InputError

__all__ = ["run_cmd", "replay_cmd"]


@click.command("run")
@click.argument("scenario")
@_run_options
@_vllm_option()
@_backend()
@click.option("--witness", is_flag=True, help="Apply the scenario's [witness] schedule.")
@click.option("--delay", "delays", multiple=True, metavar="POINT[#K]=SECONDS",
              help="Delay every occurrence of a point, or only its K-th (from 0).")
@_outputs
def run_cmd(scenario: str, policy: str, policy_opts: Sequence[str], seed: int,
            skip: Sequence[str], ids: str | None, vllm: str | None, backend: Backend | None,
            strict: bool, witness: bool, delays: Sequence[str], check_det: bool,
            as_json: bool, html_file: str | None, trace_file: str | None) -> None:
    """Run SCENARIO (bundled name or path) once and check every invariant."""
    backend = backend or MODEL
    spec = RunSpec(load_scenario(scenario).with_vllm(_profile(vllm, backend)), policy,
                   tuple(_options(policy_opts).items()), seed, tuple(skip), backend, ids)
    plan = [parse_delay_option(d) for d in delays]
    _check_outputs(html_file, trace_file)
    result = spec.run(witness=witness, delays=plan)
    command = run_command(scenario, policy, spec.option_dict, seed, result.schedule, skip,
                          vllm=result.vllm, engine=result.engine, ids=spec.ids,
                          backend_args=backend.cli_args() if backend.has_tree else (),
                          frontend=backend.frontend, runner=backend.runner)
    warnings = [*unreached_warnings("[delays]", spec.scenario.delays, result.occurrences),
                *(unreached_warnings("[witness]", spec.scenario.witness, result.occurrences)
                  if witness else ()),
                *unreached_warnings("--delay", plan, result.occurrences)]
    det = check_determinism(result, lambda: spec.run(witness=witness, delays=plan), check_det)
    _finish_run(spec, result, command, as_json, html_file, trace_file, strict, warnings, det)


def _profile(vllm: str | None, backend: Backend) -> str | None:
    """The profile a run takes: ``--vllm``, else a tree's generation, else the scenario's."""
    return vllm or (backend.base if backend.has_tree else None)


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
                trace_file: str | None, strict: bool, warnings: Sequence[str] = (),
                det: Any = None) -> None:
    if html_file:
        from racesim.reports import write_run_report
        write_run_report(Path(html_file), spec.scenario, spec.policy, spec.option_dict, result,
                         command)
    if trace_file:
        from racesim.reports import write_chrome_trace
        write_chrome_trace(Path(trace_file), result)
    if as_json:
        _emit_json({**run_document(spec, result),
                    **({"determinism": det.as_dict()} if det is not None else {})})
    else:
        print_run(_console(), f"{spec.scenario.name} under {policy_title(spec.policy)}", result,
                  command, spec.skip)
        _say_written(html_file, trace_file)
    for line in warnings:
        click.echo(f"racesim: {line}", err=True)
    if not as_json:
        _warn_accounting(result.violated, strict)
        for line in det.lines() if det is not None else ():
            click.echo(line)
    if det is not None and not det.same:
        sys.exit(1)
    sys.exit(exit_status(result.violated, strict=strict))


@click.command("replay")
@click.argument("counterexample", type=click.Path(dir_okay=False))
@click.option("--vllm", type=click.Choice(list(PROFILES)), default=None,
              help="Replay on another vLLM profile [default: the file's; 0.8 for files "
                   "written before profiles].")
@click.option("--allow-import", is_flag=True,
              help="Let the file's module:Class policy be imported (it runs that code).")
@_backend("the file's")
@_strict
@_outputs
def replay_cmd(counterexample: str, vllm: str | None, allow_import: bool,
               backend: Backend | None, strict: bool, check_det: bool, as_json: bool,
               html_file: str | None, trace_file: str | None) -> None:
    """Replay a counterexample file: the same trace, byte for byte, anywhere.

    Only built-in policies are loaded unless --allow-import is given: a shared file must not
    run code on the reader's machine by surprise."""
    cx = read_counterexample(counterexample)
    if cx.policy not in POLICIES and not allow_import:
        raise InputError(f"{counterexample}: its policy {cx.policy!r} is not built in; replay "
                         f"imports a module:Class policy only with --allow-import")
    _check_outputs(html_file, trace_file)
    # the file's own tree (its hash checked) unless another backend is asked for
    recorded = from_record(cx.vllm_tree, counterexample) if cx.vllm_tree and backend is None \
        else None
    backend = backend or recorded or as_backend(cx.engine)
    if backend.is_vllm and backend.frontend is None and cx.frontend == "model":
        # found on the model's frontend over vLLM's engine: replay it there (its schedule may
        # name only points vLLM's own frontend passes too, and would run there by default)
        backend = dataclasses.replace(backend, frontend="model")
    if backend.is_vllm and backend.runner is None and cx.runner == "model":
        # found on the model's runner (RACESIM_VLLM_RUNNER=model): its trace is that runner's
        backend = dataclasses.replace(backend, runner="model")
    spec = RunSpec(cx.scenario.with_vllm(vllm), cx.policy, tuple(cx.options.items()), cx.seed,
                   cx.skip, backend, cx.ids)
    result = spec.run(schedule=cx.schedule)
    note = _replay_note(counterexample, cx, result, as_json)
    if note:
        click.echo(note, err=True)
    if cx.vllm_tree and backend.sha256 != cx.vllm_tree.get("sha256"):
        click.echo(f"racesim: {counterexample} was recorded on {cx.vllm_tree['kind']} "
                   f"{cx.vllm_tree['path']} (sha256 {str(cx.vllm_tree['sha256'])[:12]}); "
                   f"replayed on {backend.label}", err=True)
    _finish_run(spec, result, replay_command(counterexample, cx.policy, result.engine,
                                             backend.cli_args() if backend.has_tree else ()),
                as_json, html_file, trace_file, strict, (),
                check_determinism(result, lambda: spec.run(schedule=cx.schedule), check_det))
