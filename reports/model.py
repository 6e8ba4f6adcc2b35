"""What a trace means for a picture: lanes, incarnations and messages, as plain data.

Shared by the swimlane layout (HTML) and the Chrome trace export, so both draw the same lanes
and colour an incarnation the same way. Nothing here renders anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from racesim.engine_model.events import (
    MESSAGE_NAMES,
    ClientSend,
    Delay,
    EngineFatalEvent,
    FeAbortIssue,
    FeAdd,
    IpcSend,
    SchedStep,
    SchedUpdate,
)
from racesim.engine_model.system import RunResult
from racesim.engine_model.topology import Topology
from racesim.sim.trace import TraceEvent

__all__ = ["Lane", "Incarnation", "Message", "TraceModel", "PALETTE", "MSG_SHORT", "topology_of",
           "reader_numbers", "relabel_incs"]

#: Incarnation colours (no red: red means a violation).
PALETTE = ("#2f6fb0", "#e08a1e", "#2a9d8f", "#6a4c93", "#8c6d1f", "#3f8f3a", "#c2468a",
           "#5b7083", "#0f7c9c", "#9a6b4f")

#: Short names of the message types of ``ipc.send`` events (the model's own table).
MSG_SHORT = MESSAGE_NAMES

_ENGINE_PARTS = {"input": "input thread", "core": "busy loop", "scheduler": "scheduler",
                 "kv": "KV cache", "runner": "runner", "connector": "KV connector"}
_PART_ORDER = tuple(_ENGINE_PARTS)
_ROLE_ORDER = {"": 0, "prefill": 1, "decode": 2}
_INC_REF = re.compile(r"\binc (\d+)\b")
_MAX_CLIENT_LANES = 4
_MAX_PROXY_LANES = 2


@dataclass(frozen=True, slots=True)
class Lane:
    """One swimlane (a thread or a component group) of the diagram and of the Perfetto trace."""

    key: str
    title: str
    group: str
    group_title: str


@dataclass(frozen=True, slots=True)
class Incarnation:
    """One engine request incarnation: the hidden ground truth behind a request ID."""

    inc: int
    request: str
    client: str  # the client component, "" when unknown
    uid: int
    frontend: str
    colour: str
    #: 1, 2, 3... in order of first appearance: what a reader sees (``inc`` is the model's)
    number: int = 0

    @property
    def label(self) -> str:
        return f"{self.request} #{self.number or self.inc}"


@dataclass(frozen=True, slots=True)
class Message:
    """One ``ipc.send``: who sent it to whom, when it was sent and when it arrives."""

    seq: int
    channel: str
    type: str
    ids: tuple[str, ...]
    incs: tuple[int, ...]
    send: float
    arrive: float
    src: str  # lane keys
    dst: str

    @property
    def short(self) -> str:
        return MSG_SHORT.get(self.type, self.type)


#: Compact mode: the input thread and the runner share the busy loop's lane, KV the scheduler's.
_COMPACT = {"input": "core", "runner": "core", "kv": "scheduler"}
_COMPACT_TITLES = {"core": "busy loop", "scheduler": "sched + KV", "connector": "connector"}


def topology_of(result: RunResult) -> Topology:
    """The layout of the system ``result`` ran on."""
    if result.topology is None:
        raise ValueError("this run result carries no topology (it was not made by run_workload)")
    return result.topology


def _numbered(e: TraceEvent) -> bool:
    return bool(e.inc) and e.request is not None


def reader_numbers(events: Sequence[TraceEvent]) -> dict[int, int]:
    """Incarnation -> the number a reader sees: 1, 2, 3... in order of first appearance.

    The model's own numbers skip values (they are drawn per ADD, across every request), so the
    terminal and the HTML report both show these instead; ``--json`` keeps the model's."""
    numbers: dict[int, int] = {}
    for e in events:
        if _numbered(e) and e.inc not in numbers:
            numbers[e.inc] = len(numbers) + 1
    return numbers


def relabel_incs(text: str, numbers: Mapping[int, int]) -> str:
    """``text`` with each "inc N" in the reader's numbers (an unknown N stays)."""
    return _INC_REF.sub(lambda m: f"inc {numbers.get(int(m.group(1)), int(m.group(1)))}", text)


class TraceModel:
    """Lanes, incarnations and messages of one trace (computed once, read by the renderers).

    What each component is comes from the run's :class:`Topology`, never from its name."""

    def __init__(self, events: Sequence[TraceEvent], topology: Topology) -> None:
        self.events = events
        self.topology = topology
        seen = {c.name: c for e in events
                if (c := topology.component(e.component)) is not None}.values()
        clients = sum(1 for c in seen if c.kind == "client")
        proxies = sum(1 for c in seen if c.kind == "proxy")
        engines = {c.group for c in seen if c.kind == "engine"}
        #: Several engines (P/D): fewer lanes per engine so the diagram still fits a screen.
        self.compact = len(engines) > 1
        self._group_clients = clients > _MAX_CLIENT_LANES
        self._group_proxies = proxies > (1 if self.compact else _MAX_PROXY_LANES)
        self._lane_keys: dict[str, str] = {}  # component -> lane key
        self._lanes: dict[str, tuple[tuple[int, int, str, int], Lane]] = {}  # key -> rank, lane
        self.incarnations: dict[int, Incarnation] = {}
        self._uid_inc: dict[int, int] = {}
        self.messages: dict[int, Message] = {}
        self._build_incarnations()
        self._build_messages()
        self.delay_owner: dict[int, tuple[str, tuple[int, ...]]] = {}
        self._build_delay_owners()
        self.lanes = self._build_lanes()
        self.lane_index = {lane.key: i for i, lane in enumerate(self.lanes)}

    # -- lanes ----------------------------------------------------------------------------------

    def _lane(self, key: str, rank: tuple[int, int, str, int], lane: Lane) -> str:
        self._lanes.setdefault(key, (rank, lane))
        return key

    def _engine_lane(self, engine: str, part: str) -> str:
        part = _COMPACT.get(part, part) if self.compact else part
        key = f"{engine}.{part}"
        node = self.topology.engine(engine)
        index, role = (node.index, node.role) if node is not None else (99, "")
        title = f"{engine} engine" if role else "EngineCore"
        return self._lane(key, (4, index, engine, _PART_ORDER.index(part)),
                          Lane(key, (_COMPACT_TITLES if self.compact else _ENGINE_PARTS)[part],
                               engine, title))

    def step_lane(self, scheduler_component: str) -> str:
        """The lane engine steps of ``scheduler_component``'s engine are drawn in."""
        return self._engine_lane(self.topology.engine_of(scheduler_component), "runner")

    def lane_group(self, key: str) -> str:
        """The group (an engine lane's engine) that lane ``key`` belongs to."""
        return self._lanes[key][1].group

    def is_engine_lane(self, key: str) -> bool:
        return self._lanes[key][0][0] == 4

    def lane_of(self, component: str) -> str:
        """The lane key an event of ``component`` is drawn in."""
        key = self._lane_keys.get(component)
        if key is None:
            key = self._lane_keys[component] = self._new_lane_of(component)
        return key

    def _new_lane_of(self, component: str) -> str:
        c = self.topology.component(component)
        if c is None:
            return self._lane(component, (5, 0, component, 0),
                              Lane(component, component, component, component))
        if c.kind == "client":
            if self._group_clients:
                return self._lane("clients", (0, -1, "", 0),
                                  Lane("clients", "clients", "clients", "clients"))
            return self._lane(component, (0, c.index, "", 0),
                              Lane(component, component, "clients", "clients"))
        if c.kind == "proxy":
            if self._group_proxies:
                return self._lane("proxies", (1, -1, "", 0),
                                  Lane("proxies", "proxies", "proxy", "proxy"))
            return self._lane(component, (1, c.index, "", 0),
                              Lane(component, component, "proxy", "proxy"))
        if c.kind == "frontend":
            return self._lane(component, (2, _ROLE_ORDER.get(c.role, 3), "", c.index),
                              Lane(component, component, "frontends", "API server"))
        if c.kind == "channel":
            return self._lane("ipc", (3, 0, "", 0), Lane("ipc", "sockets", "ipc", "IPC"))
        return self._engine_lane(c.group, c.part)

    def _build_lanes(self) -> list[Lane]:
        keys = {self.lane_of(e.component) for e in self.events}
        for msg in self.messages.values():
            keys.update((msg.src, msg.dst))
        return [self._lanes[k][1] for k in sorted(keys, key=lambda k: self._lanes[k][0])]

    # -- engine steps ---------------------------------------------------------------------------

    def step_spans(self, sim_time: float) -> list[tuple[TraceEvent, float, bool]]:
        """Each engine step with a batch: (its ``sched.step``, when its output was applied,
        whether it was). A step never applied lasts until its engine's next step, its engine's
        death or the end of the run, whichever comes first."""
        steps: list[TraceEvent] = []
        updated: dict[tuple[str, int], float] = {}
        deaths: dict[str, float] = {}
        for ev in self.events:
            d = ev.detail
            if isinstance(d, SchedStep) and d.batch:
                steps.append(ev)
            elif isinstance(d, SchedUpdate):
                updated[(ev.component, d.step)] = ev.time
            elif isinstance(d, EngineFatalEvent):
                deaths.setdefault(self.topology.engine_of(ev.component), ev.time)
        out = []
        for k, st in enumerate(steps):
            end = updated.get((st.component, cast(SchedStep, st.detail).step))
            if end is not None:
                out.append((st, end, True))
                continue
            nxt = next((o.time for o in steps[k + 1:] if o.component == st.component), sim_time)
            death = deaths.get(self.topology.engine_of(st.component), sim_time)
            out.append((st, max(min(nxt, death, sim_time), st.time), False))
        return out

    # -- incarnations ---------------------------------------------------------------------------

    def _build_incarnations(self) -> None:
        client_of_uid: dict[int, str] = {}
        for e in self.events:
            if isinstance(e.detail, ClientSend):
                client_of_uid.setdefault(e.detail.uid, e.component)
        for e in self.events:
            if _numbered(e) and e.inc not in self.incarnations:
                added = isinstance(e.detail, FeAdd)
                uid = cast(FeAdd, e.detail).uid if added else 0
                frontend = e.component if added else ""
                colour = PALETTE[len(self.incarnations) % len(PALETTE)]
                self.incarnations[e.inc] = Incarnation(e.inc, e.request,
                                                       client_of_uid.get(uid, ""), uid,
                                                       frontend, colour,
                                                       len(self.incarnations) + 1)
                if uid:
                    self._uid_inc.setdefault(uid, e.inc)

    def _build_delay_owners(self) -> None:
        """Which request each injected delay held up: the nearest event of the same component
        at the same instant before it (an await after a pop), else the next one after it (a
        message whose transit was delayed)."""
        events = self.events
        for k, e in enumerate(events):
            if e.kind != "delay":
                continue
            near = [events[j] for j in range(k - 1, max(k - 9, -1), -1)]
            near += [events[j] for j in range(k + 1, min(k + 9, len(events)))]
            for o in near:
                if o.component == e.component and o.kind != "delay" and (
                        (o.request is not None and o.time == e.time) or o.seq > e.seq):
                    if o.request is not None:
                        self.delay_owner[e.seq] = (o.request, self.incs_of(o))
                    break

    def number(self, inc: int) -> int:
        """The reader's number of incarnation ``inc`` (itself when unknown)."""
        known = self.incarnations.get(inc)
        return known.number if known is not None else inc

    def relabel(self, text: str) -> str:
        """``text`` (a narration or a violation detail) with "inc N" in the reader's numbers."""
        return relabel_incs(text, {i: c.number for i, c in self.incarnations.items()})

    def incs_of(self, event: TraceEvent) -> tuple[int, ...]:
        """The incarnations an event is about (client events map through their client uid)."""
        if event.inc:
            return (event.inc,)
        if event.kind == Delay.KIND:
            owner = getattr(self, "delay_owner", {}).get(event.seq)
            return owner[1] if owner else ()
        if event.kind == IpcSend.KIND:
            msg = self.messages.get(event.seq)
            return msg.incs if msg else ()
        uid = getattr(event.detail, "uid", None)  # the client events carry their client's uid
        if isinstance(uid, int) and uid in self._uid_inc:
            return (self._uid_inc[uid],)
        return ()

    def colour_of(self, incs: Sequence[int]) -> str:
        """An incarnation's colour; grey for none or for several."""
        if len(set(incs)) == 1 and incs[0] in self.incarnations:
            return self.incarnations[incs[0]].colour
        return "#7a7a7a"

    # -- messages -------------------------------------------------------------------------------

    def _endpoint(self, name: str, kind: str, sending: bool) -> str:
        if self.topology.engine(name) is None:  # a frontend
            return self.lane_of(name)
        if kind == "nixl":
            return self._engine_lane(name, "connector" if sending else "core")
        return self._engine_lane(name, "core" if sending else "input")

    def _build_messages(self) -> None:
        abort_inc: dict[tuple[str, str], int] = {}  # (frontend, id) -> inc of the latest abort
        for e in self.events:
            d = e.detail
            if isinstance(d, FeAbortIssue) and e.inc:
                for rid in d.ids:
                    abort_inc[(e.component, rid)] = e.inc
            if not isinstance(d, IpcSend):
                continue
            channel = self.topology.channel(e.component)
            ids = tuple(d.ids)
            incs: list[int] = list(d.incs or ())
            incs += [int(o[1]) for o in d.outputs or () if len(o) > 1]
            if d.remote_inc is not None:
                incs.append(d.remote_inc)
            if channel is None:
                continue
            kind, src, dst = channel.kind, channel.src, channel.dst
            if d.type == "AbortMessage":
                incs += [abort_inc[(src, i)] for i in ids if (src, i) in abort_inc]
            self.messages[e.seq] = Message(
                e.seq, e.component, d.type, ids, tuple(dict.fromkeys(incs)),
                e.time, float(d.arrive), self._endpoint(src, kind, True),
                self._endpoint(dst, kind, False))
