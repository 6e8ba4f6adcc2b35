"""Small pieces every ``racesim`` command shares: failing in one line, options, output checks."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click
from rich.console import Console

from racesim.reports._io import check_output_dir, check_output_file
from racesim.reports.text import printable
from racesim.reports.verdict import ACCOUNTING, accounting_warning, verdict
from racesim.sim import InputError

__all__ = ["fail", "clip", "MAX_ERROR_LINE", "parse_options", "output_file", "output_dir",
           "warn_accounting", "BUDGET", "emit_json", "console", "check_workers", "replay_note",
           "PipeClosed", "PipeAwareGroup", "quiet_stdout", "say_written"]


class PipeClosed(Exception):
    """Whoever read our stdout has stopped (``racesim list | head -1``): not an error."""


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what is still
    buffered does not fail again ("Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is no file (pytest's capture, ...): nothing to flush
        pass


class PipeAwareGroup(click.Group):
    """A click group that reports a closed stdout as :class:`PipeClosed`: click itself would
    turn it into exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise PipeClosed from None


class _Console(Console):
    def on_broken_pipe(self) -> None:  # rich's own handler exits with status 1
        raise PipeClosed


#: the longest error line: room for a list of known names, not for a pasted megabyte
MAX_ERROR_LINE = 1000


def clip(text: str, limit: int = MAX_ERROR_LINE) -> str:
    """``text`` cut to ``limit`` characters, the cut marked: a value a user pasted by mistake
    must not flood the terminal (the scenario loader clips the values it shows the same way)."""
    return text if len(text) <= limit else text[:limit - 20] + f"... ({len(text)} chars)"


def fail(message: str) -> NoReturn:
    """Bad input: one line on stderr (control characters escaped, clipped), exit status 2."""
    click.echo(f"racesim: error: {clip(printable(' '.join(str(message).split())))}", err=True)
    sys.exit(2)


def parse_options(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"--policy-opt {pair!r}: expected KEY=VALUE")
        out[key] = value
    return out


output_file = check_output_file  # before any work starts: errors name the user's path
output_dir = check_output_dir


def check_workers(workers: int | None, dask: str | None) -> None:
    """A worker count that is not sane fails now, not after the pool has started."""
    from racesim.explore.parallel import check_workers as check

    if dask is None:
        check(workers)


def warn_accounting(invariants: Sequence[str], strict: bool) -> None:
    """One warning line on stderr for an accounting-only result (it fails only with --strict)."""
    if verdict(invariants) == ACCOUNTING:
        click.echo("racesim: " + accounting_warning(invariants), err=True)


BUDGET = click.IntRange(1, 2**31)


def emit_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, ensure_ascii=False))


#: the width of stdout off a terminal (a pipe, a file, a CI log) when COLUMNS does not set one:
#: a line is as long as it is, where rich would wrap every table at 80 columns
UNWRAPPED = 10_000


def console() -> Console:
    out = _Console(highlight=False, soft_wrap=False)
    if not out.is_terminal and not os.environ.get("COLUMNS", "").strip().isdigit():
        out = _Console(highlight=False, soft_wrap=False, width=UNWRAPPED)
    return out


def replay_note(path: str, cx: Any, result: Any, as_json: bool) -> str | None:
    """What ``replay`` says on stderr about a replayed file: that it no longer reproduces,
    what it showed on another backend than the one that wrote it, that its trace hash changed
    (on the model: the model changed since it was written; on the vllm backend: vLLM's
    behaviour or the backend did), or that another vLLM release replayed it than the one that
    wrote it; None when there is nothing to say."""
    from racesim.documents import release_of_run

    recorded = list(dict.fromkeys(str(v.get("invariant")) for v in cx.violations))
    on = f" ({result.engine} backend)" if result.engine != cx.engine else ""
    now = ", ".join(result.violated) or "nothing"
    release = release_of_run(result.vllm, result.engine)
    moved = (f"written on vLLM {cx.vllm_release}, replayed on vLLM {release}"
             if cx.vllm_release and release and cx.vllm_release != release else "")
    if recorded and set(recorded) != set(result.violated):
        return (f"racesim: {path} no longer reproduces on vLLM {result.vllm}{on} "
                f"(recorded {', '.join(recorded)}; now {now}" + (f"; {moved})" if moved else ")"))
    if on:
        return f"racesim: {path} reproduces on vLLM {result.vllm}{on}: {now}"
    if not as_json and result.trace_hash != cx.trace_hash:
        why = ("vLLM's behaviour or the backend changed" if result.engine == "vllm"
               else "the model changed")
        return (f"warning: trace hash {result.trace_hash} differs from the recorded "
                f"{cx.trace_hash} ({why} since it was written" +
                (f"; {moved})" if moved else ")"))
    if moved:
        return f"racesim: {path} was {moved}"
    return None


def say_written(html_file: str | None, trace_file: str | None) -> None:
    """Where the files asked for went (on stdout after the human-readable output)."""
    if html_file:
        click.echo(f"report: {html_file}")
    if trace_file:
        click.echo(f"trace: {trace_file} (open it in https://ui.perfetto.dev)")
