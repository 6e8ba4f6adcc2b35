"""The tail of a failing check's message, in the order a reader acts on it: the coverage of the
run, then the seed, the command that replays it, the shrink statistics and the artifacts."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from racesim.engine_model import RunResult
    from racesim.runner import RunSpec

__all__ = ["failure_lines"]


def failure_lines(spec: RunSpec, result: RunResult, command: str,
                  stem: str | None) -> list[str]:
    """``stem``: the absolute path of the ``--racesim-report`` files without their suffix
    (None: no report folder)."""
    from racesim.engine_model.invariants import INVARIANTS

    never = [i for i in INVARIANTS if i not in result.evaluated and i not in spec.skip]
    artifact = (f"artifact: {stem}.json (counterexample), {stem}.html (report)" if stem
                else "artifact: none (pytest --racesim-report DIR writes the counterexample "
                     "and its HTML report)")
    return [
        f"coverage: one run, {len(result.schedule)} delay(s); invariants evaluated on a live "
        f"incarnation: {', '.join(result.evaluated) or 'none'}; never evaluated: "
        f"{', '.join(never) or 'none'}",
        f"seed: {result.seed}",
        f"replay: {command}",
        f"shrink: not shrunk (check() runs the schedule it is given once: "
        f"{len(result.schedule)} delay(s))",
        artifact,
    ]
