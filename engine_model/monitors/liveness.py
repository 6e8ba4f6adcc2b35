"""ID liveness: unique-live-id, frontend-covers-engine and abort-precision.

This monitor also keeps the incarnations' lifecycle in the shared ground truth (registered, sent,
live, in a step in flight, held for transfer, finished) that the other monitors read.
"""

from __future__ import annotations

from collections import deque
from typing import cast

from racesim.engine_model.events import (
    DpAbortUnrouted,
    EngineReject,
    EngineResume,
    FeAbortIssue,
    FeAdd,
    FePop,
    IpcSend,
    PdHold,
    PdRelease,
    SchedAbortMiss,
    SchedAdd,
    SchedFinish,
    SchedStep,
    SchedUpdate,
)
from racesim.engine_model.monitors.truth import GroundTruth, Handler, Inc, Reporter
from racesim.sim.trace import TraceEvent

__all__ = ["IdLiveness"]


class IdLiveness:
    """Follows each incarnation from frontend to engine and judges IDs and aborts."""

    def __init__(self, truth: GroundTruth, report: Reporter) -> None:
        self.truth = truth
        self.report = report
        self._issued: dict[tuple[str, str], deque[list[int]]] = {}
        self._snaps: dict[tuple[int, str], list[int]] = {}
        self._applied: set[tuple[int, str]] = set()
        self._steps: dict[tuple[str, int], list[int]] = {}

    def handlers(self) -> list[tuple[str, Handler]]:
        return [
            (FeAdd.KIND, self.fe_add), (FePop.KIND, self.fe_pop),
            (FeAbortIssue.KIND, self.fe_abort_issue), (IpcSend.KIND, self.ipc_send),
            (SchedAdd.KIND, self.sched_add), (SchedFinish.KIND, self.sched_finish),
            (SchedAbortMiss.KIND, self.sched_abort_miss), (SchedStep.KIND, self.sched_step),
            (SchedUpdate.KIND, self.sched_update), (PdHold.KIND, self.pd_hold),
            (PdRelease.KIND, self.pd_release), (DpAbortUnrouted.KIND, self.abort_unrouted),
            (EngineReject.KIND, self.engine_reject), (EngineResume.KIND, self.engine_resume),
        ]

    # -- frontend -------------------------------------------------------------------------------

    def fe_add(self, ev: TraceEvent) -> None:
        d = cast(FeAdd, ev.detail)
        truth = self.truth
        engine = truth.fe_engine.get(ev.component, "")
        if d.dp_engine is not None:  # data parallelism: the load balancer's choice
            engine = truth.engine_names[d.dp_engine]
        i = Inc(ev.inc, d.uid, d.index, ev.component, engine, ev.request or "", ev.seq)
        if d.tracked is False:  # vLLM 0.33: its ADD is sent, its frontend never knew it
            i.tracked = False
            i.ended = "never registered (taken as a streaming update of the state its ID held)"
        truth.incs[ev.inc] = i
        truth.by_id.setdefault((engine, i.rid), []).append(i)

    def fe_pop(self, ev: TraceEvent) -> None:
        i = self.truth.incs.get(ev.inc)
        if i is not None:
            i.tracked = False
            i.ended = cast(FePop, ev.detail).why  # missing stats are judged at the end

    def fe_abort_issue(self, ev: TraceEvent) -> None:
        truth = self.truth
        engine = truth.fe_engine.get(ev.component, "")
        d = cast(FeAbortIssue, ev.detail)
        engines = d.engines
        for n, rid in enumerate(d.ids):
            if engines is not None:
                engine = truth.engine_names[engines[n]]
            snap = truth.snapshot(engine, rid)
            self._issued.setdefault((ev.component, rid), deque()).append(snap)
            for inc in snap:
                truth.incs[inc].abort_pending += 1

    def ipc_send(self, ev: TraceEvent) -> None:
        d = cast(IpcSend, ev.detail)
        kind = d.type
        truth = self.truth
        if kind == "EngineCoreRequest":
            for inc in d.incs or ():
                i = truth.incs.get(inc)
                if i is not None:
                    i.status = "sent"
        elif kind == "AbortMessage":
            fe = truth.channel_fe.get(ev.component, "")
            engine = truth.channel_engine.get(ev.component) or truth.fe_engine.get(fe, "")
            for rid in d.ids:
                queue = self._issued.get((fe, rid))
                if queue:
                    snap = queue.popleft()
                else:
                    snap = truth.snapshot(engine, rid)
                    for inc in snap:
                        truth.incs[inc].abort_pending += 1
                self._snaps[(d.tag or 0, rid)] = snap

    def abort_unrouted(self, ev: TraceEvent) -> None:
        """Data parallelism: an ABORT the load balancer sent nowhere (no reqs_in_flight entry)
        ends nothing, so the incarnations it meant have no ABORT pending any more."""
        for rid in cast(DpAbortUnrouted, ev.detail).ids:
            queue = self._issued.get((ev.component, rid))
            if queue:
                for inc in queue.popleft():
                    i = self.truth.incs.get(inc)
                    if i is not None and i.abort_pending > 0:
                        i.abort_pending -= 1

    # -- engine ---------------------------------------------------------------------------------

    def engine_reject(self, ev: TraceEvent) -> None:
        """An ADD the engine answered with an ERROR output and never scheduled."""
        i = self.truth.incs.get(ev.inc)
        if i is not None:
            i.status = "finished"

    def sched_add(self, ev: TraceEvent) -> None:
        truth = self.truth
        engine = truth.engine_of(ev.component)
        rid = ev.request or ""
        i = truth.incs.get(ev.inc)
        if i is None:  # an ADD no frontend registered (cannot happen with built-in clients)
            i = Inc(ev.inc, 0, 0, "", engine, rid, ev.seq)
            truth.incs[ev.inc] = i
        others = truth.by_id.setdefault((engine, rid), [])
        others[:] = [o for o in others if o is i or o.live or o.status in ("registered", "sent")]
        live = [o for o in others if o is not i and o.live]
        if live:
            o = live[0]
            where = ("held for KV transfer" if o.held else
                     "finished but still in a step in flight" if o.status == "finished"
                     else "waiting or running")
            self.report.violate(
                "unique-live-id", ev.inc, ev, rid,
                f"{engine}: ADD {rid!r} for {truth.who(ev.inc)} while {truth.who(o.inc)}"
                f" is still live under that ID ({where}); Scheduler.requests[{rid!r}] "
                f"is overwritten")
        i.status = "live"
        i.add_seq = ev.seq
        if i not in others:
            others.append(i)

    def _apply_abort(self, tag: int, rid: str) -> list[int] | None:
        snap = self._snaps.get((tag, rid))
        if snap is not None and (tag, rid) not in self._applied:
            self._applied.add((tag, rid))  # eager aborts (#29987) apply one ABORT twice
            for inc in snap:
                i = self.truth.incs.get(inc)
                if i is not None and i.abort_pending > 0:
                    i.abort_pending -= 1
        return snap

    def sched_finish(self, ev: TraceEvent) -> None:
        truth = self.truth
        i = truth.incs.get(ev.inc)
        if i is not None:
            i.status = "finished"
        tag = cast(SchedFinish, ev.detail).abort
        if tag:
            snap = self._apply_abort(tag, ev.request or "")
            if snap is not None and ev.inc not in snap:
                issued = ", ".join(truth.who(x) for x in snap) or "nothing live"
                self.report.violate(
                    "abort-precision", ev.inc, ev, ev.request,
                    f"ABORT {ev.request!r} ended {truth.who(ev.inc)}, but when it was "
                    f"issued the ID meant: {issued}")

    def sched_abort_miss(self, ev: TraceEvent) -> None:
        tag = cast(SchedAbortMiss, ev.detail).abort
        if tag:
            self._apply_abort(tag, ev.request or "")

    def sched_step(self, ev: TraceEvent) -> None:
        truth = self.truth
        engine = truth.engine_of(ev.component)
        d = cast(SchedStep, ev.detail)
        incs = []
        for rid, inc, _n in d.batch:
            incs.append(inc)
            i = truth.incs.get(inc)
            if i is None:
                continue
            i.inflight += 1
            if not (i.tracked or i.abort_pending or i.held):
                self.report.violate(
                    "frontend-covers-engine", inc, ev, rid,
                    f"{engine} runs {rid!r} ({truth.who(inc)}) but {i.frontend} no "
                    f"longer tracks it and no ABORT for it is pending "
                    f"(frontend state ended: {i.ended or 'never registered'})")
        self._steps[(engine, d.step)] = incs

    def sched_update(self, ev: TraceEvent) -> None:
        truth = self.truth
        engine = truth.engine_of(ev.component)
        for inc in self._steps.pop((engine, cast(SchedUpdate, ev.detail).step), ()):
            i = truth.incs.get(inc)
            if i is not None:
                i.inflight -= 1

    def engine_resume(self, ev: TraceEvent) -> None:
        """Fault tolerance: the batches in flight were discarded, never applied."""
        truth = self.truth
        engine = truth.engine_of(ev.component)
        for step in cast(EngineResume, ev.detail).dropped:
            for inc in self._steps.pop((engine, step), ()):
                i = truth.incs.get(inc)
                if i is not None:
                    i.inflight -= 1

    # -- P/D holds ------------------------------------------------------------------------------

    def pd_hold(self, ev: TraceEvent) -> None:
        i = self.truth.incs.get(ev.inc)
        if i is not None:
            i.held = True
            i.expiry = cast(PdHold, ev.detail).expiry

    def pd_release(self, ev: TraceEvent) -> None:
        i = self.truth.incs.get(ev.inc)
        if i is not None:
            i.held = False
