"""Trace event kinds of data parallelism's load balancer on the frontend (``dp.*``)."""

from __future__ import annotations

from racesim.sim.trace import EventRecord, TraceEvent

__all__ = ["DpRoute", "DpAbortUnrouted"]


class DpRoute(EventRecord):
    """dp.route: the load balancer sends a request to ``engine`` (``affinity``: by its
    reqs_in_flight entry rather than by load)."""

    KIND = "dp.route"
    KEY = True
    __slots__ = ("engine", "affinity")

    def __init__(self, engine: int, affinity: bool) -> None:
        self.engine = engine
        self.affinity = affinity

    def describe(self, ev: TraceEvent) -> str:
        how = " (reqs_in_flight affinity)" if self.affinity else ""
        return f"load balancer sends {ev.request!r} to engine {self.engine}{how}"


class DpAbortUnrouted(EventRecord):
    """dp.abort_unrouted: an ABORT of ``ids`` goes nowhere (no reqs_in_flight entry)."""

    KIND = "dp.abort_unrouted"
    KEY = True
    __slots__ = ("ids",)

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids

    def describe(self, ev: TraceEvent) -> str:
        return f"ABORT {', '.join(repr(i) for i in self.ids)} sent nowhere: " \
               f"no reqs_in_flight entry"
