"""Delays that never applied: an entry at an await point no event passed in the run, or at an
occurrence ``#K`` beyond the times the point was passed. Such a delay changes nothing, so a
run that looks safe may only mean the delay was misplaced; the CLI warns after the run."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["unreached", "unreached_warnings"]

PlanEntry = tuple[str, int | None, float]


def unreached(entries: Iterable[PlanEntry],
              occurrences: Mapping[str, int]) -> list[tuple[str, int | None, int]]:
    """``(point, k, times passed)`` of each entry the run never reached, in entry order."""
    out = []
    for point, k, _delay in entries:
        passed = occurrences.get(point, 0)
        if passed == 0 or (k is not None and k >= passed):
            out.append((point, k, passed))
    return out


def unreached_warnings(source: str, entries: Iterable[PlanEntry],
                       occurrences: Mapping[str, int]) -> list[str]:
    """One warning line per entry of ``source`` (``--delay``, ``[delays]``, ``[witness]``)
    that the run never reached."""
    lines = []
    for point, k, passed in unreached(entries, occurrences):
        key = point if k is None else f"{point}#{k}"
        if passed == 0:
            why = f"await point {point} was never passed in this run"
        else:
            why = (f"await point {point} was passed only {passed} time"
                   f"{'' if passed == 1 else 's'} (occurrences 0..{passed - 1})")
        lines.append(f"warning: {source} {key}: {why}; that delay had no effect")
    return lines
