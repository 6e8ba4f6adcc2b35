"""metrics-exact: every request a frontend ended is counted once in finished-request stats."""

from __future__ import annotations

from racesim.engine_model.events import FeStats
from racesim.engine_model.monitors.truth import GroundTruth, Handler, Reporter
from racesim.sim.trace import TraceEvent

__all__ = ["Metrics"]


class Metrics:
    """Counts each incarnation's finished-request stats; a missing count is judged at the end."""

    def __init__(self, truth: GroundTruth, report: Reporter) -> None:
        self.truth = truth
        self.report = report
        self._stats: dict[int, int] = {}

    def handlers(self) -> list[tuple[str, Handler]]:
        return [(FeStats.KIND, self.fe_stats)]

    def fe_stats(self, ev: TraceEvent) -> None:
        n = self._stats.get(ev.inc, 0) + 1
        self._stats[ev.inc] = n
        if n > 1:
            self.report.violate("metrics-exact", ("double", ev.inc), ev, ev.request,
                                f"{ev.component}: request {ev.request!r} "
                                f"({self.truth.who(ev.inc)}) counted {n} times in "
                                f"finished-request stats")

    def finish(self, now: float | int) -> None:
        for i in self.truth.incs.values():
            if i.ended and i.ended != "error" and self._stats.get(i.inc, 0) == 0 \
                    and i.status != "registered":
                self.report.violate(
                    "metrics-exact", ("missing", i.inc), None, i.rid,
                    f"{i.frontend}: request {i.rid!r} ({self.truth.who(i.inc)}) ended "
                    f"({i.ended}) but was never counted in finished-request stats", time=now)
