"""What a set of violated invariants means to a reader: a race, accounting only, or safe.

The one verdict shared by the terminal, the HTML reports and the exit status, so a cell the
terminal calls "accounting" is never red on the page.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

from racesim.engine_model.invariants import INVARIANTS, SAFETY_INVARIANTS

__all__ = ["Verdict", "RACE", "ACCOUNTING", "SAFE", "verdict", "reach_label", "found_words",
           "accounting_warning", "exit_status"]

Verdict = Literal["race", "accounting", "safe"]
RACE: Final = "race"
ACCOUNTING: Final = "accounting"
SAFE: Final = "safe"


def verdict(invariants: Iterable[str]) -> Verdict:
    """``race`` when a safety or liveness invariant broke, ``accounting`` when only
    bookkeeping ones did (``metrics-exact``: a stats gap vLLM still has; ``stranded-hold``:
    capacity a lease gives back), else ``safe``."""
    names = set(invariants)
    if names & set(SAFETY_INVARIANTS):
        return RACE
    return ACCOUNTING if names else SAFE


def reach_label(invariants: Iterable[str], reach: str | None) -> str:
    """The verdict with its reach, as a matrix cell reads: "live race" (reachable in vLLM as
    released), "latent hazard" (needs a delay where that release never yields), "accounting
    gap" or "safe"."""
    v = verdict(invariants)
    if v == RACE:
        return "latent hazard" if reach == "latent" else "live race"
    return "accounting gap" if v == ACCOUNTING else "safe"


def found_words(invariants: Iterable[str], reach: str | None, runs: int,
                exhaustive: bool = False) -> str:
    """A search's result as a reader should take it: its :func:`reach_label`, except that a
    search that found nothing says "not found in N runs" unless it was exhaustive (every
    schedule of a bounded grid): racesim has blind spots, and N random runs prove nothing."""
    label = reach_label(invariants, reach)
    if label != "safe" or exhaustive:
        return label if label != "safe" else f"safe (exhaustive: all {runs} grid schedules)"
    return f"not found in {runs} run{'' if runs == 1 else 's'}"


def accounting_warning(invariants: Iterable[str]) -> str:
    """The one warning line for an accounting-only result."""
    names = [n for n in dict.fromkeys(invariants) if n in INVARIANTS
             and n not in SAFETY_INVARIANTS]
    why = []
    if "metrics-exact" in names or not names:
        why.append("vLLM does not count frontend-initiated aborts in its stats")
    if "stranded-hold" in names:
        why.append("a prefill hold outlived its decode request until its lease or timeout")
    return (f"warning: accounting only, not a race: {', '.join(names)} violated "
            f"({'; '.join(why)}; --strict fails on it,"
            f" --skip {names[0] if names else 'metrics-exact'} hides it)")


def exit_status(invariants: Iterable[str], *, strict: bool = False) -> int:
    """The exit status: 1 for a race (or, with ``strict``, any violation), else 0."""
    v = verdict(invariants)
    return 1 if v == RACE or (strict and v == ACCOUNTING) else 0
