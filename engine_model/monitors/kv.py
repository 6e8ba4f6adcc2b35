"""KV ownership: who owns each block, checked at alloc, free, transfer release and P/D read."""

from __future__ import annotations

from typing import cast

from racesim.engine_model.events import KvAlloc, KvFree, PdNotice, PdRead, PdRelease
from racesim.engine_model.monitors.truth import GroundTruth, Handler, Reporter
from racesim.sim.trace import TraceEvent

__all__ = ["KvOwnership"]


class KvOwnership:
    """Block owners per engine, and the transfer-done notices not yet applied."""

    def __init__(self, truth: GroundTruth, report: Reporter) -> None:
        self.truth = truth
        self.report = report
        self._owners: dict[str, dict[int, int]] = {}
        self._notice: dict[tuple[str, str], int] = {}

    def handlers(self) -> list[tuple[str, Handler]]:
        return [(KvAlloc.KIND, self.kv_alloc), (KvFree.KIND, self.kv_free),
                (PdNotice.KIND, self.pd_notice), (PdRelease.KIND, self.pd_release),
                (PdRead.KIND, self.pd_read)]

    def kv_alloc(self, ev: TraceEvent) -> None:
        truth = self.truth
        engine = truth.engine_of(ev.component)
        owners = self._owners.setdefault(engine, {})
        d = cast(KvAlloc, ev.detail)
        new = d.blocks
        for b in new:
            o = owners.get(b, 0)
            if o:
                self.report.violate(
                    "kv-ownership", ("alloc", ev.inc), ev, ev.request,
                    f"{engine}: block {b} allocated to {truth.who(ev.inc)} while still "
                    f"owned by {truth.who(o)} (the free queue held it twice)")
            owners[b] = ev.inc
        for b in d.table:
            o = owners.get(b, 0)
            if o != ev.inc:
                self.report.violate(
                    "kv-ownership", ("shared", ev.inc), ev, ev.request,
                    f"{engine}: req_to_blocks[{ev.request!r}] of {truth.who(ev.inc)} "
                    f"includes block {b} owned by {truth.who(o)}: two incarnations "
                    f"share one block table")
                break

    def kv_free(self, ev: TraceEvent) -> None:
        truth = self.truth
        engine = truth.engine_of(ev.component)
        owners = self._owners.setdefault(engine, {})
        for b in cast(KvFree, ev.detail).blocks:
            o = owners.get(b, 0)
            if o == 0:
                self.report.violate("kv-ownership", ("double", ev.inc, b), ev, ev.request,
                                    f"{engine}: block {b} freed twice (free of {ev.request!r})")
            elif o != ev.inc:
                oi = truth.incs.get(o)
                if oi is not None and (oi.status != "finished" or oi.held):
                    state = "held for KV transfer" if oi.held else "still running"
                    self.report.violate(
                        "kv-ownership", ("freed", o), ev, ev.request,
                        f"{engine}: block {b} of {truth.who(o)} ({state}) freed by the "
                        f"free of {ev.request!r} for {truth.who(ev.inc)}")
            owners[b] = 0

    def pd_notice(self, ev: TraceEvent) -> None:
        self._notice[(self.truth.engine_of(ev.component), ev.request or "")] = ev.inc

    def pd_release(self, ev: TraceEvent) -> None:
        truth = self.truth
        engine = truth.engine_of(ev.component)
        meant = self._notice.pop((engine, ev.request or ""), 0)
        if cast(PdRelease, ev.detail).cause == "notify" and meant and meant != ev.inc:
            self.report.violate(
                "kv-ownership", ("release", ev.inc), ev, ev.request,
                f"{engine}: the transfer-done notice for {truth.who(meant)} released "
                f"the held blocks of {truth.who(ev.inc)} before its own transfer")

    def pd_read(self, ev: TraceEvent) -> None:
        d = cast(PdRead, ev.detail)
        truth = self.truth
        remote = truth.engine_names[d.remote_engine] if truth.engine_names else ""
        owners = self._owners.get(remote, {})
        want = d.remote_inc
        for b in d.remote_blocks:
            o = owners.get(b, 0)
            if o != want:
                now = f"owned by {truth.who(o)}" if o else "free"
                self.report.violate(
                    "kv-ownership", ("read", ev.inc), ev, ev.request,
                    f"decode read block {b} of {remote} for {truth.who(want)}, but the "
                    f"block is {now}")
                break
