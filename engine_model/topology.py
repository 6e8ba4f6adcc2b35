"""The built system's layout as data: engines, frontends, channels, clients, and every
component name events are recorded under, with what it is.

``System`` publishes one :class:`Topology`; the checker and the reports read it rather than
parsing component names. An engine's role is ``""`` alone, ``"prefill"`` or ``"decode"`` under
P/D; ``dp_rank`` leaves room for several engines behind one frontend (data parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ENGINE_PARTS", "Component", "EngineNode", "FrontendNode", "ChannelNode",
           "Topology"]

#: The threads and managers of an engine process, each a component ``<engine>.<part>``.
ENGINE_PARTS = ("input", "core", "scheduler", "kv", "runner", "connector")


@dataclass(frozen=True, slots=True)
class Component:
    """One component name in the trace: ``kind`` is client, proxy, frontend, channel or engine;
    ``group`` the process it belongs to (an engine part's engine, else itself); ``part`` the
    part of an engine; ``role`` its engine's or frontend's P/D role."""

    name: str
    kind: str
    group: str
    index: int = 0
    part: str = ""
    role: str = ""


@dataclass(frozen=True, slots=True)
class EngineNode:
    """One engine core process: its name, index in the system, role, and DP rank."""

    name: str
    index: int
    role: str = ""
    dp_rank: int = 0

    def part(self, part: str) -> str:
        """The component name of one of its parts."""
        return f"{self.name}.{part}"


@dataclass(frozen=True, slots=True)
class FrontendNode:
    """One API server's AsyncLLM: ``index`` among the frontends of its role, ``engine`` the
    index of the engine it talks to, and its two socket channels."""

    name: str
    index: int
    engine: int
    role: str = ""
    input_channel: str = ""
    output_channel: str = ""


@dataclass(frozen=True, slots=True)
class ChannelNode:
    """One socket: ``kind`` ipc (frontend and engine) or nixl (engine to engine), from the
    component group ``src`` to ``dst``."""

    name: str
    kind: str
    src: str
    dst: str


@dataclass(frozen=True, slots=True)
class Topology:
    """The whole layout; :meth:`component` says what any recorded component name is."""

    engines: tuple[EngineNode, ...]
    frontends: tuple[FrontendNode, ...]
    channels: tuple[ChannelNode, ...]
    clients: tuple[str, ...]
    proxies: tuple[str, ...] = ()
    _by_name: dict[str, Component] = field(default_factory=dict, compare=False, repr=False)
    _channels: dict[str, ChannelNode] = field(default_factory=dict, compare=False, repr=False)

    def _index(self) -> dict[str, Component]:
        # built on first use: a run builds its topology, but only reports ask it about names
        by = self._by_name
        if by:
            return by
        self._channels.update((c.name, c) for c in self.channels)
        for i, name in enumerate(self.clients):
            by[name] = Component(name, "client", name, i)
        for i, name in enumerate(self.proxies):
            by[name] = Component(name, "proxy", name, i)
        for fe in self.frontends:
            by[fe.name] = Component(fe.name, "frontend", fe.name, fe.index, role=fe.role)
        for ch in self.channels:
            by[ch.name] = Component(ch.name, "channel", ch.name)
        for e in self.engines:
            for part in ENGINE_PARTS:
                name = e.part(part)
                by[name] = Component(name, "engine", e.name, e.index, part, e.role)
        return by

    def component(self, name: str) -> Component | None:
        return self._index().get(name)

    def engine_of(self, component: str) -> str:
        """The engine an engine component belongs to ("" for any other component)."""
        c = self._index().get(component)
        return c.group if c is not None and c.kind == "engine" else ""

    def engine(self, name: str) -> EngineNode | None:
        """The engine named ``name`` (a group, as a channel's ends name it)."""
        return next((e for e in self.engines if e.name == name), None)

    def channel(self, name: str) -> ChannelNode | None:
        self._index()
        return self._channels.get(name)
