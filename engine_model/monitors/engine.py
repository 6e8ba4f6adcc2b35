"""engine-alive: no engine reached a fatal error."""

from __future__ import annotations

from typing import cast

from racesim.engine_model.events import EngineFatalEvent
from racesim.engine_model.monitors.truth import GroundTruth, Handler, Reporter
from racesim.sim.trace import TraceEvent

__all__ = ["EngineAlive"]


class EngineAlive:
    """Reports each engine's fatal error, and remembers which engines died of what."""

    def __init__(self, truth: GroundTruth, report: Reporter) -> None:
        self.truth = truth
        self.report = report
        self.dead: dict[str, str] = {}

    def handlers(self) -> list[tuple[str, Handler]]:
        return [(EngineFatalEvent.KIND, self.engine_fatal)]

    def engine_fatal(self, ev: TraceEvent) -> None:
        engine = self.truth.engine_of(ev.component)
        fatal = cast(EngineFatalEvent, ev.detail)
        error = fatal.error
        self.dead[engine] = error
        # vLLM's own exception (the vllm backend) names the file:line that raised it
        at = f" at vllm/{fatal.where}" if fatal.where else ""
        self.report.violate("engine-alive", engine, ev, None,
                            f"{engine} died: {error}{at} (EngineDeadError for every "
                            f"request on it)", where=fatal.where)
