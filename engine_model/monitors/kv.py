"""KV ownership: who owns each block, checked at alloc, free, transfer release and P/D read.

With prefix caching a block may have several owners: every incarnation that hit it. A hit is
right only when the block holds the same tokens at the same position of the hitter's sequence
(a full block of a prompt both share, or the hitter's own block after a preemption): a private
block (another request's own prompt or output) is never shared. A block whose count reaches 0
while one of its owners still runs is freed under it, as before.
"""

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
        #: the owners of a shared block besides the one in _owners
        self._extra: dict[str, dict[int, list[int]]] = {}
        #: who computed each block, and its position in that incarnation's table
        self._written: dict[str, dict[int, tuple[int, int]]] = {}
        self._notice: dict[tuple[str, str], int] = {}
        #: the seq of the event that last freed each block (kv-destination names it)
        self._freed: dict[str, dict[int, int]] = {}

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
        table = d.table
        hit = d.hit
        if hit is not None:
            self._share(ev, engine, owners, self._extra.setdefault(engine, {}), hit,
                        len(table) - len(new) - len(hit))
        for b in new:
            o = owners.get(b, 0)
            if o:
                self.report.violate(
                    "kv-ownership", ("alloc", ev.inc), ev, ev.request,
                    f"{engine}: block {b} allocated to {truth.who(ev.inc)} while still "
                    f"owned by {truth.who(o)} (the free queue held it twice)")
            owners[b] = ev.inc
        if truth.caching:
            written = self._written.setdefault(engine, {})
            at = len(table) - len(new)
            for k, b in enumerate(new):
                written[b] = (ev.inc, at + k)
        for b in table:
            o = owners.get(b, 0)
            if o != ev.inc and ev.inc not in self._extra.get(engine, {}).get(b, ()):
                self.report.violate(
                    "kv-ownership", ("shared", ev.inc), ev, ev.request,
                    f"{engine}: req_to_blocks[{ev.request!r}] of {truth.who(ev.inc)} "
                    f"includes block {b} owned by {truth.who(o)}: two incarnations "
                    f"share one block table")
                break

    def _share(self, ev: TraceEvent, engine: str, owners: dict[int, int],
               extra: dict[int, list[int]], hit: list[int], at: int) -> None:
        """A prefix hit: each block must hold the hitter's own tokens at that position."""
        truth = self.truth
        written = self._written.setdefault(engine, {})
        bs = truth.block_sizes.get(engine, 1)
        mine, mine_len = truth.prompt_of(ev.inc)
        for k, b in enumerate(hit):
            j = at + k
            w, wj = written.get(b, (0, -1))
            theirs, their_len = truth.prompt_of(w)
            same = wj == j and (w == ev.inc or (
                theirs == mine and (j + 1) * bs <= min(mine_len, their_len)))
            if not same:
                self.report.violate(
                    "kv-ownership", ("hit", ev.inc), ev, ev.request,
                    f"{engine}: {truth.who(ev.inc)} shares block {b}, computed by "
                    f"{truth.who(w)} for other tokens: a private block is shared")
            o = owners.get(b, 0)
            if o:
                extra.setdefault(b, []).append(ev.inc)
            else:
                owners[b] = ev.inc

    def kv_free(self, ev: TraceEvent) -> None:
        truth = self.truth
        engine = truth.engine_of(ev.component)
        owners = self._owners.setdefault(engine, {})
        extra = self._extra.get(engine) if self.truth.caching else None
        d = cast(KvFree, ev.detail)
        kept = (d.kept or ()) if extra else ()
        freed = self._freed.setdefault(engine, {})
        for b in d.blocks:
            others = extra.get(b) if extra else None
            if extra is not None and others is not None:
                # a shared block: this incarnation lets go of its share
                if ev.inc in others:
                    others.remove(ev.inc)
                elif owners.get(b, 0) == ev.inc:
                    owners[b] = others.pop(0)
                if not others:
                    del extra[b]
                if b in kept:
                    continue
                for o in [owners.get(b, 0), *others]:
                    self._freed_under(ev, engine, b, o)
                freed[b] = ev.seq
                extra.pop(b, None)
                owners[b] = 0
                continue
            o = owners.get(b, 0)
            freed[b] = ev.seq
            if o == 0:
                self.report.violate("kv-ownership", ("double", ev.inc, b), ev, ev.request,
                                    f"{engine}: block {b} freed twice (free of {ev.request!r})")
            elif o != ev.inc:
                self._freed_under(ev, engine, b, o)
            owners[b] = 0

    # -- queries (the P/D monitor's kv-destination) ----------------------------------------------

    def blocks_of(self, engine: str, inc: int) -> list[int]:
        """The blocks ``inc`` holds on ``engine`` now (owned or shared), in block order."""
        extra = self._extra.get(engine, {})
        return sorted(b for b, o in self._owners.get(engine, {}).items()
                      if o == inc or inc in extra.get(b, ()))

    def owns(self, engine: str, inc: int, b: int) -> bool:
        return (self._owners.get(engine, {}).get(b, 0) == inc
                or inc in self._extra.get(engine, {}).get(b, ()))

    def owner(self, engine: str, b: int) -> int:
        return self._owners.get(engine, {}).get(b, 0)

    def freed_at(self, engine: str, b: int) -> int:
        """The seq of the event that last freed block ``b`` (-1: never freed)."""
        return self._freed.get(engine, {}).get(b, -1)

    def _freed_under(self, ev: TraceEvent, engine: str, b: int, o: int) -> None:
        truth = self.truth
        oi = truth.incs.get(o)
        if o != ev.inc and oi is not None and (oi.status != "finished" or oi.held):
            state = "held for KV transfer" if oi.held else "still running"
            self.report.violate(
                "kv-ownership", ("freed", o), ev, ev.request,
                f"{engine}: block {b} of {truth.who(o)} ({state}) freed by the "
                f"free of {ev.request!r} for {truth.who(ev.inc)}")

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
        extra = self._extra.get(remote, {})
        want = d.remote_inc
        for b in d.remote_blocks:
            o = owners.get(b, 0)
            if o != want and want not in extra.get(b, ()):
                now = f"owned by {truth.who(o)}" if o else "free"
                self.report.violate(
                    "kv-ownership", ("read", ev.inc), ev, ev.request,
                    f"decode read block {b} of {remote} for {truth.who(want)}, but the "
                    f"block is {now}")
                break
