"""runner-books and input-integrity: the model runner's books against the scheduler's truth.

The runner keeps its own per-ID request states and persistent batch rows (vLLM's
``GPUModelRunner.requests`` and ``InputBatch.req_ids``); a bug that mixes them up often raises
nothing (#23440, #15041 on 0.20+, #29355, #35755). The engine that owns the runner records
``runner.books`` / ``runner.input`` when they differ from the scheduler's live requests and
the incarnation's true sequence; this monitor makes each a violation.
"""

from __future__ import annotations

from typing import cast

from racesim.engine_model.events.runner import RunnerBooks, RunnerInput
from racesim.engine_model.monitors.truth import GroundTruth, Handler, Reporter
from racesim.sim.trace import TraceEvent

__all__ = ["RunnerBooksMonitor"]


class RunnerBooksMonitor:
    def __init__(self, truth: GroundTruth, report: Reporter) -> None:
        self.truth = truth
        self.report = report

    def handlers(self) -> list[tuple[str, Handler]]:
        return [(RunnerBooks.KIND, self.books), (RunnerInput.KIND, self.input)]

    def books(self, ev: TraceEvent) -> None:
        rec = cast(RunnerBooks, ev.detail)
        engine = self.truth.engine_of(ev.component)
        for line in rec.problems:
            self.report.violate("runner-books", (engine, line), ev, ev.request,
                                f"{engine} step {rec.step}: {line}")

    def input(self, ev: TraceEvent) -> None:
        rec = cast(RunnerInput, ev.detail)
        engine = self.truth.engine_of(ev.component)
        pos, token, what = rec.problems[0]
        more = f" (and {len(rec.problems) - 1} more)" if len(rec.problems) > 1 else ""
        self.report.violate("input-integrity", (engine, ev.request, ev.inc), ev, ev.request,
                            f"{engine} step {rec.step}: model input of {ev.request!r} "
                            f"(inc {ev.inc}) at position {pos} is token {token}: {what}{more}")
