"""One line of plain English per trace event, in vLLM's words (for timelines and reports).

Each kind's text is its record's :meth:`~racesim.sim.trace.EventRecord.describe`, declared with
the kind in ``racesim.engine_model.events``.
"""

from __future__ import annotations

from racesim.engine_model.events import KEY_KINDS, MESSAGE_NAMES
from racesim.sim.trace import TraceEvent

__all__ = ["describe", "KEY_KINDS", "MESSAGE_NAMES"]


def describe(event: TraceEvent) -> str:
    return event.detail.describe(event)
