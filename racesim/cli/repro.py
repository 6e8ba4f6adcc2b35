"""``racesim repro``: write a counterexample's reproducer script (parse, call, render)."""

from __future__ import annotations

from pathlib import Path

import click

from racesim.sim import InputError

__all__ = ["repro_cmd"]


@click.command("repro")
@click.argument("counterexample", type=click.Path(dir_okay=False))
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="The script to write [default: COUNTEREXAMPLE's name with _repro.py, in the "
                   "current directory].")
def repro_cmd(counterexample: str, out: str | None) -> None:
    """Write a Python script that reproduces a counterexample on vLLM alone.

    The counterexample is replayed on the vllm backend with its calls into vLLM's classes
    recorded; the script makes the same calls on the same objects in the same order and fails
    with the same vLLM exception (or, for NIXL push mode's pairing, an assertion on vLLM's own
    state). It needs only the vLLM release it names. A counterexample whose violation is seen
    only in a part racesim simulates is refused (exit 2)."""
    from racesim.repro import make_repro

    if not Path(counterexample).is_file():
        raise InputError(f"{counterexample}: no such counterexample file")
    repro = make_repro(counterexample)
    target = Path(out) if out else Path(f"{Path(counterexample).stem}_repro.py")
    target.write_text(repro.script)
    target.chmod(0o755)
    click.echo(f"wrote {target}: {repro.calls} calls into vLLM {repro.release}'s classes")
    click.echo(f"expected failure: {repro.expect}")
    click.echo(f"run it with vLLM {repro.release} installed (no racesim): python {target}")
