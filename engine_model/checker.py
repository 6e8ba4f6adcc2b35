"""The invariant checker: an online oracle over the trace, plus end-of-run checks.

It reads the hidden ground truth that rides on events (incarnation numbers ``inc`` and client
``uid``) which the modelled system never reads, so it can tell two requests under one ID apart.
Each violation names the first event that broke the invariant.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from racesim.engine_model.invariants import (
    INVARIANTS,
    SAFETY_INVARIANTS,
    Violation,
    check_invariant_names,
)
from racesim.sim.trace import TraceEvent, TraceListener
from racesim.sim.world import World

if TYPE_CHECKING:
    from racesim.engine_model.system_view import SystemView

__all__ = ["INVARIANTS", "SAFETY_INVARIANTS", "Violation", "Checker", "check_invariant_names"]

_MAX_PER_INVARIANT = 20


class _Inc:
    """Ground truth about one engine request incarnation."""

    __slots__ = ("inc", "uid", "index", "frontend", "engine", "rid", "status", "inflight",
                 "held", "expiry", "tracked", "abort_pending", "add_seq", "ended")

    def __init__(self, inc: int, uid: int, index: int, frontend: str, engine: str, rid: str,
                 seq: int) -> None:
        self.inc = inc
        self.uid = uid
        self.index = index
        self.frontend = frontend
        self.engine = engine
        self.rid = rid
        self.status = "registered"  # -> sent -> live -> finished
        self.inflight = 0
        self.held = False
        self.expiry = 0.0
        self.tracked = True
        self.abort_pending = 0
        self.add_seq = seq
        self.ended = ""  # why the frontend state was dropped

    @property
    def live(self) -> bool:
        return self.status == "live" or self.inflight > 0 or self.held


class _Client:
    __slots__ = ("uid", "rid", "seq", "terminal")

    def __init__(self, uid: int, rid: str, seq: int) -> None:
        self.uid = uid
        self.rid = rid
        self.seq = seq
        self.terminal: str | None = None


class Checker(TraceListener):
    def __init__(self, world: World, skip: frozenset[str] = frozenset()) -> None:
        self.world = world
        self.skip = skip
        self.violations: list[Violation] = []
        self._reported: set[tuple[str, object]] = set()
        self._count: dict[str, int] = {}
        self._incs: dict[int, _Inc] = {}
        self._by_id: dict[tuple[str, str], list[_Inc]] = {}
        self._clients: dict[int, _Client] = {}
        self._issued: dict[tuple[str, str], deque[list[int]]] = {}
        self._snaps: dict[tuple[int, str], list[int]] = {}
        self._applied: set[tuple[int, str]] = set()
        self._steps: dict[tuple[str, int], list[int]] = {}
        self._owners: dict[str, dict[int, int]] = {}
        self._notice: dict[tuple[str, str], int] = {}
        self._stats: dict[int, int] = {}
        self._dead: dict[str, str] = {}
        self._fe_engine: dict[str, str] = {}
        self._channel_fe: dict[str, str] = {}
        self._engine_names: list[str] = []
        self._engines_by_component: dict[str, str] = {}
        self._system: SystemView | None = None
        self._handlers = {
            "fe.add": self._fe_add, "fe.pop": self._fe_pop, "fe.stats": self._fe_stats,
            "fe.abort_issue": self._fe_abort_issue, "ipc.send": self._ipc_send,
            "sched.add": self._sched_add, "sched.finish": self._sched_finish,
            "sched.abort_miss": self._sched_abort_miss, "sched.step": self._sched_step,
            "sched.update": self._sched_update, "kv.alloc": self._kv_alloc,
            "kv.free": self._kv_free, "pd.hold": self._pd_hold, "pd.notice": self._pd_notice,
            "pd.release": self._pd_release, "pd.read": self._pd_read,
            "client.send": self._client_send, "client.output": self._client_output,
            "client.done": self._client_done, "engine.fatal": self._engine_fatal,
        }
        world.trace.attach(self)

    def attach(self, system: SystemView) -> None:
        self._system = system
        self._engine_names = [e.name for e in system.engines]
        for fe in system.frontends:
            self._fe_engine[fe.name] = system.engines[fe.engine].name
            if fe.input_channel is not None:
                self._channel_fe[fe.input_channel.name] = fe.name

    # -- reporting ------------------------------------------------------------------------------

    def _violate(self, invariant: str, key: object, ev: TraceEvent | None, request: str | None,
                 detail: str, *, time: float | int | None = None) -> None:
        if invariant in self.skip or (invariant, key) in self._reported:
            return
        n = self._count.get(invariant, 0)
        if n >= _MAX_PER_INVARIANT:
            return
        self._count[invariant] = n + 1
        self._reported.add((invariant, key))
        # the clock as recorded, int 0 included (see World.now): never coerced to a float
        t: float | int = ev.time if ev is not None else (
            time if time is not None else self.world.now)
        self.violations.append(Violation(invariant, t, request, detail,
                                         ev.seq if ev is not None else -1))

    # -- dispatch -------------------------------------------------------------------------------

    def kinds(self) -> frozenset[str]:
        return frozenset(self._handlers)

    def on_event(self, ev: TraceEvent) -> None:
        # The four kinds every engine step records go by direct (native) calls; the rest by table.
        kind = ev.kind
        if kind == "sched.step":
            self._sched_step(ev)
        elif kind == "sched.update":
            self._sched_update(ev)
        elif kind == "ipc.send":
            self._ipc_send(ev)
        elif kind == "client.output":
            self._client_output(ev)
        else:
            self._handlers[kind](ev)

    def _engine_of(self, component: str) -> str:
        engine = self._engines_by_component.get(component)
        if engine is None:
            engine = self._engines_by_component[component] = component.split(".", 1)[0]
        return engine

    def _who(self, inc: int) -> str:
        i = self._incs.get(inc)
        if i is None:
            return f"inc {inc}"
        return f"inc {inc} (client uid {i.uid}, {i.frontend})"

    # -- frontend -------------------------------------------------------------------------------

    def _fe_add(self, ev: TraceEvent) -> None:
        d = ev.detail
        engine = self._fe_engine.get(ev.component, "")
        i = _Inc(ev.inc, d["uid"], d["index"], ev.component, engine, ev.request or "", ev.seq)
        if not d.get("tracked", True):  # vLLM 0.33: its ADD is sent, its frontend never knew it
            i.tracked = False
            i.ended = "never registered (a same-ID add finished the old stream)"
        self._incs[ev.inc] = i
        self._by_id.setdefault((engine, i.rid), []).append(i)

    def _fe_pop(self, ev: TraceEvent) -> None:
        i = self._incs.get(ev.inc)
        if i is not None:
            i.tracked = False
            i.ended = ev.detail["why"]  # missing stats are judged at the end

    def _fe_stats(self, ev: TraceEvent) -> None:
        n = self._stats.get(ev.inc, 0) + 1
        self._stats[ev.inc] = n
        if n > 1:
            self._violate("metrics-exact", ("double", ev.inc), ev, ev.request,
                          f"{ev.component}: request {ev.request!r} ({self._who(ev.inc)}) counted "
                          f"{n} times in finished-request stats")

    def _snapshot(self, engine: str, rid: str) -> list[int]:
        """The incarnations an ABORT of ``rid`` may rightly end now: live at the engine, or
        registered by a frontend with the ADD not yet applied (still to be sent, or in flight)."""
        return [i.inc for i in self._by_id.get((engine, rid), ())
                if i.live or i.status in ("registered", "sent")]

    def _fe_abort_issue(self, ev: TraceEvent) -> None:
        engine = self._fe_engine.get(ev.component, "")
        for rid in ev.detail["ids"]:
            snap = self._snapshot(engine, rid)
            self._issued.setdefault((ev.component, rid), deque()).append(snap)
            for inc in snap:
                self._incs[inc].abort_pending += 1

    def _ipc_send(self, ev: TraceEvent) -> None:
        d = ev.detail
        kind = d["type"]
        if kind == "EngineCoreRequest":
            for inc in d["incs"]:
                i = self._incs.get(inc)
                if i is not None:
                    i.status = "sent"
        elif kind == "AbortMessage":
            fe = self._channel_fe.get(ev.component, "")
            engine = self._fe_engine.get(fe, "")
            for rid in d["ids"]:
                queue = self._issued.get((fe, rid))
                if queue:
                    snap = queue.popleft()
                else:
                    snap = self._snapshot(engine, rid)
                    for inc in snap:
                        self._incs[inc].abort_pending += 1
                self._snaps[(d["tag"], rid)] = snap

    # -- engine ---------------------------------------------------------------------------------

    def _sched_add(self, ev: TraceEvent) -> None:
        engine = self._engine_of(ev.component)
        rid = ev.request or ""
        i = self._incs.get(ev.inc)
        if i is None:  # an ADD no frontend registered (cannot happen with built-in clients)
            i = _Inc(ev.inc, 0, 0, "", engine, rid, ev.seq)
            self._incs[ev.inc] = i
        others = self._by_id.setdefault((engine, rid), [])
        others[:] = [o for o in others if o is i or o.live or o.status in ("registered", "sent")]
        live = [o for o in others if o is not i and o.live]
        if live:
            o = live[0]
            where = ("held for KV transfer" if o.held else
                     "finished but still in a step in flight" if o.status == "finished"
                     else "waiting or running")
            self._violate("unique-live-id", ev.inc, ev, rid,
                          f"{engine}: ADD {rid!r} for {self._who(ev.inc)} while {self._who(o.inc)}"
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
                i = self._incs.get(inc)
                if i is not None and i.abort_pending > 0:
                    i.abort_pending -= 1
        return snap

    def _sched_finish(self, ev: TraceEvent) -> None:
        i = self._incs.get(ev.inc)
        if i is not None:
            i.status = "finished"
        tag = ev.detail.get("abort", 0)
        if tag:
            snap = self._apply_abort(tag, ev.request or "")
            if snap is not None and ev.inc not in snap:
                issued = ", ".join(self._who(x) for x in snap) or "nothing live"
                self._violate("abort-precision", ev.inc, ev, ev.request,
                              f"ABORT {ev.request!r} ended {self._who(ev.inc)}, but when it was "
                              f"issued the ID meant: {issued}")

    def _sched_abort_miss(self, ev: TraceEvent) -> None:
        tag = ev.detail.get("abort", 0)
        if tag:
            self._apply_abort(tag, ev.request or "")

    def _sched_step(self, ev: TraceEvent) -> None:
        engine = self._engine_of(ev.component)
        incs = []
        for rid, inc, _n in ev.detail["batch"]:
            incs.append(inc)
            i = self._incs.get(inc)
            if i is None:
                continue
            i.inflight += 1
            if not (i.tracked or i.abort_pending or i.held):
                self._violate("frontend-covers-engine", inc, ev, rid,
                              f"{engine} runs {rid!r} ({self._who(inc)}) but {i.frontend} no "
                              f"longer tracks it and no ABORT for it is pending "
                              f"(frontend state ended: {i.ended or 'never registered'})")
        self._steps[(engine, ev.detail["step"])] = incs

    def _sched_update(self, ev: TraceEvent) -> None:
        engine = self._engine_of(ev.component)
        for inc in self._steps.pop((engine, ev.detail["step"]), ()):
            i = self._incs.get(inc)
            if i is not None:
                i.inflight -= 1

    # -- KV blocks ------------------------------------------------------------------------------

    def _kv_alloc(self, ev: TraceEvent) -> None:
        engine = self._engine_of(ev.component)
        owners = self._owners.setdefault(engine, {})
        new = ev.detail["blocks"]
        for b in new:
            o = owners.get(b, 0)
            if o:
                self._violate("kv-ownership", ("alloc", ev.inc), ev, ev.request,
                              f"{engine}: block {b} allocated to {self._who(ev.inc)} while still "
                              f"owned by {self._who(o)} (the free queue held it twice)")
            owners[b] = ev.inc
        for b in ev.detail["table"]:
            o = owners.get(b, 0)
            if o != ev.inc:
                self._violate("kv-ownership", ("shared", ev.inc), ev, ev.request,
                              f"{engine}: req_to_blocks[{ev.request!r}] of {self._who(ev.inc)} "
                              f"includes block {b} owned by {self._who(o)}: two incarnations "
                              f"share one block table")
                break

    def _kv_free(self, ev: TraceEvent) -> None:
        engine = self._engine_of(ev.component)
        owners = self._owners.setdefault(engine, {})
        for b in ev.detail["blocks"]:
            o = owners.get(b, 0)
            if o == 0:
                self._violate("kv-ownership", ("double", ev.inc, b), ev, ev.request,
                              f"{engine}: block {b} freed twice (free of {ev.request!r})")
            elif o != ev.inc:
                oi = self._incs.get(o)
                if oi is not None and (oi.status != "finished" or oi.held):
                    state = "held for KV transfer" if oi.held else "still running"
                    self._violate("kv-ownership", ("freed", o), ev, ev.request,
                                  f"{engine}: block {b} of {self._who(o)} ({state}) freed by the "
                                  f"free of {ev.request!r} for {self._who(ev.inc)}")
            owners[b] = 0

    # -- P/D ------------------------------------------------------------------------------------

    def _pd_hold(self, ev: TraceEvent) -> None:
        i = self._incs.get(ev.inc)
        if i is not None:
            i.held = True
            i.expiry = ev.detail["expiry"]

    def _pd_notice(self, ev: TraceEvent) -> None:
        self._notice[(self._engine_of(ev.component), ev.request or "")] = ev.inc

    def _pd_release(self, ev: TraceEvent) -> None:
        engine = self._engine_of(ev.component)
        i = self._incs.get(ev.inc)
        if i is not None:
            i.held = False
        meant = self._notice.pop((engine, ev.request or ""), 0)
        if ev.detail["cause"] == "notify" and meant and meant != ev.inc:
            self._violate("kv-ownership", ("release", ev.inc), ev, ev.request,
                          f"{engine}: the transfer-done notice for {self._who(meant)} released "
                          f"the held blocks of {self._who(ev.inc)} before its own transfer")

    def _pd_read(self, ev: TraceEvent) -> None:
        d = ev.detail
        remote = self._engine_names[d["remote_engine"]] if self._engine_names else ""
        owners = self._owners.get(remote, {})
        want = d["remote_inc"]
        for b in d["remote_blocks"]:
            o = owners.get(b, 0)
            if o != want:
                now = f"owned by {self._who(o)}" if o else "free"
                self._violate("kv-ownership", ("read", ev.inc), ev, ev.request,
                              f"decode read block {b} of {remote} for {self._who(want)}, but the "
                              f"block is {now}")
                break
        mine = self._incs.get(ev.inc)
        theirs = self._incs.get(want)
        if mine is not None and theirs is not None and mine.uid != theirs.uid:
            self._violate("no-crosstalk", ("read", ev.inc), ev, ev.request,
                          f"decode {self._who(ev.inc)} reads the KV of {self._who(want)}")

    # -- clients --------------------------------------------------------------------------------

    def _client_send(self, ev: TraceEvent) -> None:
        uid = ev.detail["uid"]
        self._clients[uid] = _Client(uid, ev.request or "", ev.seq)

    def _client_output(self, ev: TraceEvent) -> None:
        d = ev.detail
        uid = d["uid"]
        if d["after_done"]:
            self._violate("one-terminal-output", ("after", uid), ev, ev.request,
                          f"{ev.component} ({ev.request!r}) received an output after its "
                          f"terminal output")
        incs = self._incs
        for index, inc, ctx in d["tokens"]:
            i = incs.get(inc)
            if i is None or i.uid != uid or i.index != index:
                self._violate("no-crosstalk", ("token", uid), ev, ev.request,
                              f"{ev.component} ({ev.request!r}, uid {uid}) received a token "
                              f"generated for {self._who(inc)}")
                break
            if ctx:
                c = incs.get(ctx)
                if c is None or c.uid != uid:
                    self._violate("no-crosstalk", ("ctx", uid), ev, ev.request,
                                  f"{ev.component} ({ev.request!r}) received a token computed "
                                  f"from the sampled token of {self._who(ctx)} (async carry-over "
                                  f"matched by ID)")
                    break

    def _client_done(self, ev: TraceEvent) -> None:
        c = self._clients.get(ev.detail["uid"])
        if c is None:
            return
        if c.terminal is not None:
            self._violate("one-terminal-output", ("twice", c.uid), ev, ev.request,
                          f"{ev.component} ({ev.request!r}) got a second terminal output "
                          f"({ev.detail['reason']} after {c.terminal})")
        else:
            c.terminal = ev.detail["reason"]

    def _engine_fatal(self, ev: TraceEvent) -> None:
        engine = self._engine_of(ev.component)
        self._dead[engine] = ev.detail["error"]
        self._violate("engine-alive", engine, ev, None,
                      f"{engine} died: {ev.detail['error']} (EngineDeadError for every request "
                      f"on it)")

    # -- end of run -----------------------------------------------------------------------------

    def _client_waiting(self, uid: int) -> bool:
        c = self._clients.get(uid)
        return c is not None and c.terminal is None

    def _leaky(self, inc: int, now: float | int) -> bool:
        i = self._incs.get(inc)
        if i is None:
            return True
        if i.held and i.expiry > now:
            return False
        return not self._client_waiting(i.uid) and (i.uid in self._clients or i.uid == 0)

    def finish(self) -> tuple[Violation, ...]:
        now = self.world.now
        for c in self._clients.values():
            if c.terminal is None:
                self._violate("no-hang", ("hang", c.uid), None, c.rid,
                              f"client request {c.rid!r} (uid {c.uid}) has no terminal output at "
                              f"t={now:g}", time=now)
        for i in self._incs.values():
            if i.ended and i.ended != "error" and self._stats.get(i.inc, 0) == 0 \
                    and i.status != "registered":
                self._violate("metrics-exact", ("missing", i.inc), None, i.rid,
                              f"{i.frontend}: request {i.rid!r} ({self._who(i.inc)}) ended "
                              f"({i.ended}) but was never counted in finished-request stats",
                              time=now)
        if self._system is not None and "no-leak" not in self.skip:
            self._check_leaks(self._system, now)
        return tuple(self.violations)

    def _leak(self, key: object, where: str, rid: str | None, inc: int,
              now: float | int) -> None:
        i = self._incs.get(inc)
        self._violate("no-leak", key, None, rid,
                      f"{where} still holds {rid!r} ({self._who(inc)}) at the end"
                      + (f"; added at event {i.add_seq}" if i is not None else ""), time=now)

    def _check_leaks(self, system: SystemView, now: float | int) -> None:
        for engine in system.engines:
            if engine.dead is not None:
                continue
            name = engine.name
            sched = engine.scheduler
            for rid, req in sched.requests.items():
                if self._leaky(req.inc, now):
                    self._leak((name, "requests", rid), f"{name} Scheduler.requests", rid,
                               req.inc, now)
            for req in list(sched.waiting) + sched.running:
                if self._leaky(req.inc, now):
                    self._leak((name, "queues", req.inc), f"{name} waiting/running", req.request_id,
                               req.inc, now)
            for rid, state in engine.runner.requests.items():
                if self._leaky(state.inc, now):
                    self._leak((name, "runner", rid), f"{name} GPUModelRunner.requests", rid,
                               state.inc, now)
            kv = engine.kv
            for rid, blocks in kv.req_to_blocks.items():
                owners = [kv.owner_of(b) for b in blocks]
                if all(self._leaky(o, now) for o in owners) and not any(
                        not self._leaky(i.inc, now) for i in self._by_id.get((name, rid), ())):
                    self._leak((name, "req_to_blocks", rid), f"{name} req_to_blocks", rid,
                               owners[0] if owners else 0, now)
            for b in range(kv.num_blocks):
                o = kv.owner_of(b)
                if o and self._leaky(o, now):
                    self._leak((name, "block", o), f"{name} block {b} (not free)",
                               self._incs[o].rid if o in self._incs else None, o, now)
        for fe in system.frontends:
            if system.engines[fe.engine].dead is not None:
                continue
            op = fe.output_processor
            for rid, fe_state in op.request_states.items():
                if self._leaky(fe_state.inc, now):
                    self._leak((fe.name, "request_states", rid),
                               f"{fe.name} OutputProcessor.request_states", rid, fe_state.inc,
                               now)
            for ext, ids in op.external_req_ids.items():
                if not any(r in op.request_states or r in op.parent_requests for r in ids):
                    self._leak((fe.name, "external", ext),
                               f"{fe.name} OutputProcessor.external_req_ids", ext, 0, now)
