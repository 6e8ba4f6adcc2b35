"""What the monitors share: the ground truth about incarnations and clients, and the reporter.

The ground truth rides on events (incarnation numbers ``inc`` and client ``uid``) and the
modelled system never reads it, so the monitors can tell two requests under one ID apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from racesim.engine_model.invariants import Violation
from racesim.engine_model.topology import ENGINE_PARTS
from racesim.sim.trace import TraceEvent
from racesim.sim.world import World

if TYPE_CHECKING:
    from racesim.engine_model.system_view import SystemView

__all__ = ["Client", "GroundTruth", "Handler", "Inc", "Reporter"]

#: One monitor's reaction to one event kind.
Handler = Callable[[TraceEvent], None]

_MAX_PER_INVARIANT = 20


class Inc:
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


class Client:
    """Ground truth about one client request: its uid, ID, prompt, and terminal output so far."""

    __slots__ = ("uid", "rid", "seq", "terminal", "prompt", "prompt_tokens")

    def __init__(self, uid: int, rid: str, seq: int, prompt: str = "",
                 prompt_tokens: int = 0) -> None:
        self.uid = uid
        self.rid = rid
        self.seq = seq
        self.terminal: str | None = None
        #: the prompt's name ("" for a prompt of its own) and length in tokens
        self.prompt = prompt
        self.prompt_tokens = prompt_tokens


class Reporter:
    """Collects violations: at most one per (invariant, key), at most 20 per invariant."""

    def __init__(self, world: World, skip: frozenset[str]) -> None:
        self.world = world
        self.skip = skip
        self.violations: list[Violation] = []
        self._reported: set[tuple[str, object]] = set()
        self._count: dict[str, int] = {}

    def violate(self, invariant: str, key: object, ev: TraceEvent | None, request: str | None,
                detail: str, *, time: float | int | None = None,
                where: str | None = None) -> None:
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
                                         ev.seq if ev is not None else -1, where))


class GroundTruth:
    """Incarnations by number and by (engine, ID), clients by uid, and the system's layout."""

    def __init__(self) -> None:
        self.incs: dict[int, Inc] = {}
        self.by_id: dict[tuple[str, str], list[Inc]] = {}
        self.clients: dict[int, Client] = {}
        self.fe_engine: dict[str, str] = {}
        self.channel_fe: dict[str, str] = {}
        self.channel_engine: dict[str, str] = {}
        self.engine_names: list[str] = []
        #: the engines that run decode under P/D
        self.decode_engines: frozenset[str] = frozenset()
        #: each engine's KV block size, by engine name
        self.block_sizes: dict[str, int] = {}
        #: whether any engine caches prefixes (only then can blocks be shared)
        self.caching = False
        self._engines_by_component: dict[str, str] = {}

    def attach(self, system: SystemView) -> None:
        topology = system.topology
        self.engine_names = [e.name for e in topology.engines]
        self.decode_engines = frozenset(e.name for e in topology.engines if e.role == "decode")
        self.block_sizes = {e.name: e.config.block_size for e in system.engines}
        self.caching = any(e.kv.caching for e in system.engines)
        for fe in topology.frontends:
            self.fe_engine[fe.name] = topology.engines[fe.engine].name
            if fe.input_channel:
                self.channel_fe[fe.input_channel] = fe.name
        frontends = {fe.name for fe in topology.frontends}
        engines = set(self.engine_names)
        for ch in topology.channels:
            # data parallelism: a frontend has a channel per engine; a request's engine rides
            # on its events, an ABORT's on its channel
            if ch.kind == "ipc" and ch.src in frontends and ch.dst in engines:
                self.channel_fe[ch.name] = ch.src
                self.channel_engine[ch.name] = ch.dst
        for e in topology.engines:
            for part in ENGINE_PARTS:
                self._engines_by_component[e.part(part)] = e.name

    def engine_of(self, component: str) -> str:
        """The engine an engine component (scheduler, KV manager, ...) belongs to."""
        return self._engines_by_component.get(component, "")

    def who(self, inc: int) -> str:
        i = self.incs.get(inc)
        if i is None:
            return f"inc {inc}"
        return f"inc {inc} (client uid {i.uid}, {i.frontend})"

    def prompt_of(self, inc: int) -> tuple[str, int]:
        """The prompt an incarnation was sent with: its name (a prompt of its own is named by
        its client) and its length in tokens."""
        i = self.incs.get(inc)
        c = self.clients.get(i.uid) if i is not None else None
        if c is None:
            return (f"inc {inc}", 0)
        return (c.prompt or f"#{c.uid}", c.prompt_tokens)

    def snapshot(self, engine: str, rid: str) -> list[int]:
        """The incarnations an ABORT of ``rid`` may rightly end now: live at the engine, or
        registered by a frontend with the ADD not yet applied (still to be sent, or in flight)."""
        return [i.inc for i in self.by_id.get((engine, rid), ())
                if i.live or i.status in ("registered", "sent")]

    def client_waiting(self, uid: int) -> bool:
        c = self.clients.get(uid)
        return c is not None and c.terminal is None

    def leaky(self, inc: int, now: float | int) -> bool:
        """Whether a component still holding ``inc`` at ``now`` holds it too long."""
        i = self.incs.get(inc)
        if i is None:
            return True
        if i.held and i.expiry > now:
            return False
        return not self.client_waiting(i.uid) and (i.uid in self.clients or i.uid == 0)
