"""P/D transfers: kv-destination (decode side) and stranded-hold (prefill side).

kv-destination: the decode side's read of remote KV writes into the blocks its scheduler gave
the reading request when the read started (``update_state_after_alloc`` hands the worker the
request's unhashed block IDs, vLLM 0.33 nixl/pull_scheduler.py:149-177). If those blocks are
freed before the read completes, the read writes into blocks that are free or another request's:
silent KV corruption of that request (#32255: before it, ``finish_requests`` freed the blocks of a
request aborted in WAITING_FOR_REMOTE_KVS at once, v1/core/sched/scheduler.py:1489-1492 in
0.14.0; since, they wait for the read, :3017-3025 in 0.33.0). Safety: another request's KV is
overwritten. The violation names the read's completion (``pd.read``), and the free that took
the block away.

stranded-hold: a prefill hold (``pd.hold``) exists so that the decode request can read it. Once
that decode request is gone (its client has its terminal output, and every decode incarnation of
that client has finished or never existed), nothing will read the hold; only a transfer-done
notice already on its way (vLLM's abort path sends one: nixl/pull_scheduler.py:219-230 in 0.33,
#19223) releases it in time. A hold released otherwise (its lease or timeout ran out) or still
held at the end of the run is reported at the event that left it stranded, with how long it had
been held and how long it stayed held after that. A hold whose notice has reached the prefill
engine is not stranded: before 0.33 an engine holding only finished requests does not step, so
the notice is applied at its next request's step (0.10.1.1 v1/engine/core.py:722-731).
Accounting, not safety (see :data:`racesim.engine_model.invariants.ACCOUNTING_INVARIANTS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from racesim.engine_model.events import (
    ClientDone,
    EngineReject,
    PdHold,
    PdNotice,
    PdRead,
    PdReadFailed,
    PdRecvStart,
    PdRelease,
    SchedFinish,
)
from racesim.engine_model.monitors.kv import KvOwnership
from racesim.engine_model.monitors.truth import GroundTruth, Handler, Reporter
from racesim.sim.trace import TraceEvent

__all__ = ["PdTransfers"]


@dataclass(slots=True)
class _Hold:
    """One prefill hold: where and since when, and the event that stranded it (if any)."""

    engine: str
    rid: str
    inc: int
    uid: int
    since: float
    expiry: float
    stranded: TraceEvent | None = None
    #: its transfer-done notice reached the prefill engine (applied at that engine's next step)
    notified: bool = False


class PdTransfers:
    """Follows remote reads on the decode side and holds on the prefill side."""

    def __init__(self, truth: GroundTruth, report: Reporter, kv: KvOwnership) -> None:
        self.truth = truth
        self.report = report
        self.kv = kv
        #: (decode engine, reading incarnation) -> the blocks the read writes into
        self._dest: dict[tuple[str, int], list[int]] = {}
        #: (prefill engine, held incarnation) -> its hold, in the order holds began
        self._holds: dict[tuple[str, int], _Hold] = {}

    def handlers(self) -> list[tuple[str, Handler]]:
        return [(PdRecvStart.KIND, self.recv_start), (PdRead.KIND, self.read),
                (PdReadFailed.KIND, self.read_failed), (PdHold.KIND, self.hold),
                (PdRelease.KIND, self.release), (PdNotice.KIND, self.notice),
                (ClientDone.KIND, self.maybe_gone),
                (SchedFinish.KIND, self.maybe_gone), (EngineReject.KIND, self.maybe_gone)]

    # -- kv-destination -------------------------------------------------------------------------

    def recv_start(self, ev: TraceEvent) -> None:
        engine = self.truth.engine_of(ev.component)
        self._dest[(engine, ev.inc)] = self.kv.blocks_of(engine, ev.inc)

    def read_failed(self, ev: TraceEvent) -> None:
        self._dest.pop((self.truth.engine_of(ev.component), ev.inc), None)

    def read(self, ev: TraceEvent) -> None:
        truth = self.truth
        engine = truth.engine_of(ev.component)
        for b in self._dest.pop((engine, ev.inc), ()):
            if self.kv.owns(engine, ev.inc, b):
                continue
            owner = self.kv.owner(engine, b)
            now = f"owned by {truth.who(owner)}" if owner else "free"
            freed = self.kv.freed_at(engine, b)
            self.report.violate(
                "kv-destination", ("read", engine, ev.inc), ev, ev.request,
                f"{engine}: the remote KV read for {truth.who(ev.inc)} completed into block "
                f"{b}, which is {now}"
                + (f" (freed from it at event {freed})" if freed >= 0 else ""))
            return

    # -- stranded-hold --------------------------------------------------------------------------

    def hold(self, ev: TraceEvent) -> None:
        truth = self.truth
        engine = truth.engine_of(ev.component)
        if engine in truth.decode_engines:
            # a decode-side hold for bidirectional transfer (nixl/pull_scheduler.py:232-269)
            # waits for a later turn's reader, not for this request: it strands nothing
            return
        i = truth.incs.get(ev.inc)
        d = cast(PdHold, ev.detail)
        h = _Hold(engine, ev.request or "", ev.inc, i.uid if i is not None else 0,
                  float(ev.time), float(d.expiry))
        self._holds[(engine, ev.inc)] = h
        if self._gone(h.uid):
            h.stranded = ev  # held for a decode request that is already gone

    def notice(self, ev: TraceEvent) -> None:
        h = self._holds.get((self.truth.engine_of(ev.component), ev.inc))
        if h is not None:
            h.notified = True

    def release(self, ev: TraceEvent) -> None:
        engine = self.truth.engine_of(ev.component)
        h = self._holds.pop((engine, ev.inc), None)
        if h is None or h.stranded is None:
            return
        cause = cast(PdRelease, ev.detail).cause
        if cause in ("notify", "abort"):
            # a transfer-done notice (vLLM's abort path sends one) ended it in time, or (before
            # #25067) an ABORT freed the held blocks at once
            return
        self._report(h, float(ev.time), f"until its release ({cause}) at t={float(ev.time):.6g}")

    def maybe_gone(self, ev: TraceEvent) -> None:
        """A client's terminal output or a decode incarnation's end: are its holds stranded?"""
        if not self._holds:
            return
        truth = self.truth
        if ev.kind == ClientDone.KIND:
            uid = cast(ClientDone, ev.detail).uid
        else:
            i = truth.incs.get(ev.inc)
            if i is None:
                return
            uid = i.uid
        if not self._gone(uid):
            return
        for h in self._holds.values():
            if h.uid == uid and h.stranded is None:
                h.stranded = ev

    def _gone(self, uid: int) -> bool:
        """The client has its terminal output and no decode incarnation of it can still read."""
        truth = self.truth
        if not uid or truth.client_waiting(uid):
            return False
        decode = truth.decode_engines
        return all(i.status == "finished" for i in truth.incs.values()
                   if i.uid == uid and i.engine in decode)

    def finish(self, now: float | int, dead: frozenset[str]) -> None:
        """Holds still there at the end (not on an engine that died: its blocks died too)."""
        for h in self._holds.values():
            if h.stranded is not None and not h.notified and h.engine not in dead:
                self._report(h, float(now), f"to the end of the run at t={float(now):.6g} (its "
                             f"lease or timeout would end it at t={h.expiry:.6g})")

    def _report(self, h: _Hold, until: float, how: str) -> None:
        ev = h.stranded
        assert ev is not None
        gone = float(ev.time)
        self.report.violate(
            "stranded-hold", ("hold", h.engine, h.inc), ev, h.rid,
            f"{h.engine} held {h.rid!r} ({self.truth.who(h.inc)}) from t={h.since:.6g} "
            f"{how}: {until - h.since:.6g} s in all, {until - gone:.6g} s after its decode "
            f"request was gone (event {ev.seq}, t={gone:.6g}), with no transfer-done notice")
