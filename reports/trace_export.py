"""Chrome trace-event JSON of a run, for Perfetto (ui.perfetto.dev) or chrome://tracing.

Processes are the lane groups of the HTML report (clients, API servers, IPC, each engine),
threads its lanes (plus one per socket and extra step tracks when steps overlap). It holds:
request spans per incarnation (async ``b``/``e``), client request spans and engine steps
(``X``), messages as transit slices on their socket with a flow arrow from sender to receiver
(``s``/``f``), and instants for key events, violations, injected delays and engine deaths.

Output is byte-deterministic: simulated time in integer microseconds, sorted keys, fixed
separators, ASCII only, no wall clock.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from racesim.engine_model.events import (
    ClientDone,
    ClientSend,
    Delay,
    EngineFatalEvent,
    IpcSend,
    SchedStep,
)
from racesim.engine_model.narrate import KEY_KINDS, describe
from racesim.engine_model.system import RunResult
from racesim.reports._io import write_text
from racesim.reports.model import TraceModel, topology_of

__all__ = ["chrome_trace", "write_chrome_trace", "dumps"]

_INSTANT_SKIP = {IpcSend.KIND, Delay.KIND}


def _us(t: float) -> int:
    return round(t * 1_000_000)


class _Builder:
    def __init__(self, result: RunResult) -> None:
        self.result = result
        self.model = TraceModel(result.trace, topology_of(result))
        self.meta: list[dict[str, Any]] = []
        self.out: list[dict[str, Any]] = []
        self.pid: dict[str, int] = {}  # lane group -> pid
        self.tid: dict[str, tuple[int, int]] = {}  # lane key / extra track -> (pid, tid)
        for i, lane in enumerate(self.model.lanes):
            if lane.group not in self.pid:
                pid = len(self.pid) + 1
                self.pid[lane.group] = pid
                self._meta("process_name", pid, 0, name=lane.group_title)
                self._meta("process_sort_index", pid, 0, sort_index=pid)
            self._thread(lane.key, self.pid[lane.group], i + 1, lane.title)

    def _meta(self, what: str, pid: int, tid: int, **args: Any) -> None:
        self.meta.append({"ph": "M", "name": what, "pid": pid, "tid": tid, "args": args})

    def _thread(self, key: str, pid: int, tid: int, title: str) -> tuple[int, int]:
        self.tid[key] = (pid, tid)
        self._meta("thread_name", pid, tid, name=title)
        self._meta("thread_sort_index", pid, tid, sort_index=tid)
        return pid, tid

    def _extra(self, key: str, near: str, title: str) -> tuple[int, int]:
        """A thread of its own (a socket, a second step track) in ``near``'s process."""
        if key not in self.tid:
            pid = self.tid[near][0] if near in self.tid else 1
            self._thread(key, pid, 1000 + len(self.tid), title)
        return self.tid[key]

    def _where(self, lane: str) -> tuple[int, int]:
        return self.tid.get(lane, (1, 1))

    def _at(self, component: str) -> tuple[int, int]:
        """The thread of ``component``: its lane's, but a thread per client and per proxy even
        where the HTML report groups them (their request spans overlap)."""
        lane = self.model.lane_of(component)
        if lane in ("clients", "proxies"):
            return self._extra(component, lane, component)
        return self._where(lane)

    def emit(self, ph: str, name: str, ts: float, where: tuple[int, int], **extra: Any) -> None:
        pid, tid = where
        ev = {"ph": ph, "name": name, "ts": _us(ts), "pid": pid, "tid": tid}
        ev.update(extra)
        self.out.append(ev)

    # -- the parts ------------------------------------------------------------------------------

    def requests(self) -> None:
        span: dict[int, list[float]] = {}
        for ev in self.model.events:
            for inc in self.model.incs_of(ev):
                s = span.setdefault(inc, [ev.time, ev.time])
                s[1] = ev.time
        for inc, (t0, t1) in sorted(span.items()):
            info = self.model.incarnations.get(inc)
            if info is None:
                continue
            where = self._where(self.model.lane_of(info.frontend) if info.frontend else "")
            args = {"request_id": info.request, "inc": inc, "client": info.client,
                    "frontend": info.frontend, "client_uid": info.uid}
            common = {"cat": "request", "id": f"inc{inc}"}
            self.emit("b", f"{info.request} #{inc}", t0, where, args=args, **common)
            self.emit("e", f"{info.request} #{inc}", max(t1, t0), where, **common)

    def clients(self) -> None:
        open_: dict[str, Any] = {}
        for ev in self.model.events:
            d = ev.detail
            if isinstance(d, ClientSend):
                open_[ev.component] = ev
            elif isinstance(d, ClientDone) and ev.component in open_:
                st = open_.pop(ev.component)
                self._slice(f"{ev.request}", st.time, ev.time, self._at(ev.component),
                            {"client": ev.component, "reason": d.reason,
                             "tokens": d.tokens}, "client")
        for comp, st in sorted(open_.items()):
            self._slice(f"{st.request} (never finished)", st.time, self.result.sim_time,
                        self._at(comp), {"client": comp}, "client")

    def _slice(self, name: str, t0: float, t1: float, lane: str | tuple[int, int],
               args: dict[str, Any], cat: str) -> None:
        where = lane if isinstance(lane, tuple) else self._where(lane)
        self.emit("X", name, t0, where, dur=max(_us(t1) - _us(t0), 1), cat=cat, args=args)

    def steps(self) -> None:
        tracks: dict[str, list[float]] = {}  # step lane -> end time of each track
        for st, end, applied in self.model.step_spans(self.result.sim_time):
            step = cast(SchedStep, st.detail)
            n = step.step
            lane = self.model.step_lane(st.component)
            ends = tracks.setdefault(lane, [])
            slot = next((j for j, e in enumerate(ends) if e <= st.time), len(ends))
            if slot == len(ends):
                ends.append(end)
            ends[slot] = end
            where = self._where(lane) if slot == 0 else self._extra(
                f"{lane}#{slot}", lane,
                f"{self.model.lane_group(lane)} steps in flight ({slot + 1})")
            batch = [[str(b[0]), int(b[1]), int(b[2])] for b in step.batch]
            self._slice(f"step {n}", st.time, end, where,
                        {"step": n, "batch": batch, "what": describe(st),
                         "applied": applied}, "step")

    def messages(self) -> None:
        for msg in self.model.messages.values():
            name = f"{msg.short} {','.join(msg.ids)}"
            args = {"channel": msg.channel, "type": msg.type, "ids": list(msg.ids),
                    "incs": list(msg.incs), "seq": msg.seq}
            chan = self._extra(msg.channel, "ipc", msg.channel)
            self._slice(name, msg.send, msg.arrive, chan, args, "ipc")
            src, dst = self._where(msg.src), self._where(msg.dst)
            self._slice(f"send {name}", msg.send, msg.send, src, args, "ipc")
            self._slice(f"recv {name}", msg.arrive, msg.arrive, dst, args, "ipc")
            flow = {"cat": "ipc", "id": msg.seq}
            self.emit("s", name, msg.send, src, **flow)
            self.emit("f", name, msg.arrive, dst, bp="e", **flow)

    def instants(self) -> None:
        viol: dict[int, list[str]] = {}
        for v in self.result.violations:
            viol.setdefault(v.event, []).append(v.invariant)
        for ev in self.model.events:
            where = self._at(ev.component)
            args = {"seq": ev.seq, "request": ev.request, "inc": ev.inc, "what": describe(ev)}
            d = ev.detail
            if isinstance(d, EngineFatalEvent):
                self.emit("i", "ENGINE DEAD", ev.time, where, s="g", cat="fatal", args=args)
            elif isinstance(d, Delay):
                self.emit("i", f"delay {d.point}#{d.occurrence}", ev.time, where,
                          s="t", cat="delay", args=args)
            elif ev.kind in KEY_KINDS and ev.kind not in _INSTANT_SKIP:
                cause = getattr(d, "cause", None)  # the kinds with a cause say what ended them
                cat = "abort" if "abort" in ev.kind or cause == "abort" else "key"
                self.emit("i", ev.kind, ev.time, where, s="t", cat=cat, args=args)
        by_seq = {e.seq: e for e in self.model.events}
        for v in self.result.violations:
            hit = by_seq.get(v.event)
            where = self._at(hit.component) if hit else (1, 1)
            self.emit("i", f"VIOLATION {v.invariant}", v.time, where, s="t" if hit else "g",
                      cat="violation", args=v.as_dict())

    def document(self) -> dict[str, Any]:
        r = self.result
        self.requests()
        self.clients()
        self.steps()
        self.messages()
        self.instants()
        return {"traceEvents": self.meta + self.out, "displayTimeUnit": "ms",
                "otherData": {"policy": r.policy, "seed": r.seed, "trace_hash": r.trace_hash,
                              "events": r.events, "sim_time_us": _us(r.sim_time),
                              "violated": list(r.violated)}}


def chrome_trace(result: RunResult) -> dict[str, Any]:
    """The run as a Chrome trace-event document (needs a retained trace for the detail)."""
    return _Builder(result).document()


def dumps(doc: dict[str, Any]) -> str:
    """Canonical JSON text of a trace document: the same run gives the same bytes."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False) + "\n"


def write_chrome_trace(path: Path, result: RunResult) -> Path:
    """Write ``racesim run --trace FILE`` (atomically)."""
    return write_text(Path(path), dumps(chrome_trace(result)))
