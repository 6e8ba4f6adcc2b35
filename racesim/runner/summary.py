"""The record of one exploration run, shared by every exploration strategy."""

from __future__ import annotations

from dataclasses import dataclass

from racesim.sim import Decision

__all__ = ["RunSummary"]


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One exploration run. ``trace_hash`` is "" for runs made without hashing: their delays
    are trace events, so the schedule alone tells two traces apart."""

    run: int
    trace_hash: str
    violated: tuple[str, ...]
    schedule: tuple[Decision, ...]
    #: the run's ``(point, occurrence)`` passes whose width was "yield" (RunResult.widened)
    widened: tuple[tuple[str, int], ...] = ()
    #: the run shows the exploration's target (its invariant, with its symptom text if any)
    hit: bool = False
    #: the invariants the run evaluated with a live incarnation (RunResult.evaluated)
    evaluated: tuple[str, ...] = ()
