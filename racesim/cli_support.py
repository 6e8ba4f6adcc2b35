"""Small pieces every ``racesim`` command shares: failing in one line, options, output checks."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click
from rich.console import Console

from racesim.reports._io import check_output_dir, check_output_file
from racesim.reports.text import printable
from racesim.reports.verdict import ACCOUNTING, accounting_warning, verdict
from racesim.sim import InputError

__all__ = ["fail", "parse_options", "output_file", "output_dir", "warn_accounting", "BUDGET",
           "emit_json", "console", "check_workers"]


def fail(message: str) -> NoReturn:
    """Bad input: one line on stderr (control characters escaped), exit status 2."""
    click.echo(f"racesim: error: {printable(' '.join(str(message).split()))}", err=True)
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
    from racesim.parallel import check_workers as check

    if dask is None:
        check(workers)


def warn_accounting(invariants: Sequence[str], strict: bool) -> None:
    """One warning line on stderr for an accounting-only result (it fails only with --strict)."""
    if verdict(invariants) == ACCOUNTING:
        click.echo("racesim: " + accounting_warning(invariants), err=True)


BUDGET = click.IntRange(1, 2**31)


def emit_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, ensure_ascii=False))


def console() -> Console:
    return Console(highlight=False, soft_wrap=False)
