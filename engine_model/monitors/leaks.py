"""no-leak: at the end, every live component's ID-keyed tables and blocks hold nothing stale.

The audit reads no events: it asks each component of each live engine (scheduler, runner, KV
manager) and frontend (output processor) for the IDs it still holds (``live_ids``), and judges
each against the ground truth.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from racesim.engine_model.monitors.truth import GroundTruth, Reporter

if TYPE_CHECKING:
    from racesim.engine_model.system_view import EngineView, SystemView

__all__ = ["LeakAudit"]


class LeakAudit:
    """The end-of-run audit of what engines and frontends still hold."""

    def __init__(self, truth: GroundTruth, report: Reporter) -> None:
        self.truth = truth
        self.report = report

    def _leak(self, key: object, where: str, rid: str | None, inc: int,
              now: float | int) -> None:
        i = self.truth.incs.get(inc)
        self.report.violate("no-leak", key, None, rid,
                            f"{where} still holds {rid!r} ({self.truth.who(inc)}) at the end"
                            + (f"; added at event {i.add_seq}" if i is not None else ""),
                            time=now)

    def finish(self, system: SystemView, now: float | int) -> None:
        # One deployment's engines go down together: when one engine process exits, the
        # client's monitor shuts every process of its engine manager down (vLLM 0.33
        # v1/engine/core_client.py:822-850, v1/engine/utils.py:356-372), so what a surviving DP
        # rank held is gone with it. The prefill and decode engines of P/D are two deployments.
        roles = {n.index: n.role for n in system.topology.engines}
        down = {roles.get(i, "") for i, e in enumerate(system.engines) if e.dead is not None}
        for i, engine in enumerate(system.engines):
            if engine.dead is None and roles.get(i, "") not in down:
                self._engine(engine, now)
        for fe in system.frontends:
            if all(system.engines[e].dead is None for e in fe.engines):
                self._frontend(fe, now)

    def _engine(self, engine: EngineView, now: float | int) -> None:
        truth = self.truth
        leaky = truth.leaky
        name = engine.name
        for table, rid, inc in engine.scheduler.live_ids():
            if leaky(inc, now):
                if table == "requests":
                    self._leak((name, "requests", rid), f"{name} Scheduler.requests", rid, inc,
                               now)
                else:
                    self._leak((name, "queues", inc), f"{name} waiting/running", rid, inc, now)
        for rid, inc in engine.runner.live_ids():
            if leaky(inc, now):
                self._leak((name, "runner", rid), f"{name} GPUModelRunner.requests", rid, inc,
                           now)
        kv = engine.kv
        for rid, owners in kv.live_ids():
            if all(leaky(o, now) for o in owners) and not any(
                    not leaky(i.inc, now) for i in truth.by_id.get((name, rid), ())):
                self._leak((name, "req_to_blocks", rid), f"{name} req_to_blocks", rid,
                           owners[0] if owners else 0, now)
        for b, o in kv.owned_blocks():
            if leaky(o, now):
                self._leak((name, "block", o), f"{name} block {b} (not free)",
                           truth.incs[o].rid if o in truth.incs else None, o, now)

    def _frontend(self, fe: Any, now: float | int) -> None:
        op = fe.output_processor
        for rid, inc in op.live_ids():
            if self.truth.leaky(inc, now):
                self._leak((fe.name, "request_states", rid),
                           f"{fe.name} OutputProcessor.request_states", rid, inc, now)
        if fe.dp is not None:
            for rid, inc in fe.dp.live_ids():
                if self.truth.leaky(inc, now):
                    self._leak((fe.name, "reqs_in_flight", rid),
                               f"{fe.name} DPLBAsyncMPClient.reqs_in_flight", rid, inc, now)
        for pid, inc in op.orphan_parents():
            if self.truth.leaky(inc, now):
                self._leak((fe.name, "parent_requests", pid),
                           f"{fe.name} OutputProcessor.parent_requests", pid, inc, now)
        for ext in op.orphan_external_ids():
            self._leak((fe.name, "external", ext),
                       f"{fe.name} OutputProcessor.external_req_ids", ext, 0, now)
