"""What the checker reads of the built system: its engines, its frontends and its layout.

``System`` builds the checker and attaches itself to it; the checker depends on these Protocols
instead of importing ``racesim.engine_model.system`` back, which would close an import cycle.
An engine is read through ``EngineView`` only, so a backend whose engine-side state is another
implementation (vLLM's own classes) is audited the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from racesim.engine_model.config import EngineConfig
    from racesim.engine_model.topology import Topology

__all__ = ["SystemView", "EngineView", "HeldIds", "HeldBlocks", "HeldStates"]


class HeldIds(Protocol):
    """A scheduler's ``(table, request ID, incarnation)`` for every request it still holds."""

    def live_ids(self) -> list[tuple[str, str, int]]: ...


class HeldStates(Protocol):
    """A model runner's ``(request ID, incarnation)`` for every cached state."""

    def live_ids(self) -> list[tuple[str, int]]: ...


class HeldBlocks(Protocol):
    """A KV cache manager's block tables and the owners of the blocks not free."""

    @property
    def caching(self) -> bool:
        """Whether it caches prefixes (only then are blocks shared)."""
        ...

    def live_ids(self) -> list[tuple[str, list[int]]]: ...

    def owned_blocks(self) -> list[tuple[int, int]]: ...


class EngineView(Protocol):
    """What the end-of-run audit reads of one engine."""

    @property
    def name(self) -> str: ...

    @property
    def dead(self) -> str | None: ...

    @property
    def config(self) -> EngineConfig: ...

    @property
    def scheduler(self) -> HeldIds: ...

    @property
    def runner(self) -> HeldStates: ...

    @property
    def kv(self) -> HeldBlocks: ...


class SystemView(Protocol):
    """The system's components, by index: ``frontends[i].engine`` indexes ``engines``."""

    @property
    def engines(self) -> Sequence[EngineView]:
        """Every engine core (one, or the prefill and decode engines under P/D)."""
        ...

    @property
    def frontends(self) -> Sequence[Any]:
        """Every API-server process's AsyncLLM: the model's, or vLLM's own behind the real
        frontend's adapter (engine_vllm/frontend/asyncllm.py). ``Any``, not the model's class:
        the compiled checker must accept either (``name``, ``engines``, ``output_processor``,
        ``dp`` are what it reads)."""
        ...

    @property
    def topology(self) -> Topology:
        """What every component name is (engines, frontends, channels, clients)."""
        ...
