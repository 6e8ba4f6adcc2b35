"""What the checker reads of the built system: its engines, its frontends and its layout.

``System`` builds the checker and attaches itself to it; the checker depends on this Protocol
instead of importing ``racesim.engine_model.system`` back, which would close an import cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from racesim.engine_model.engine_core import EngineCore
    from racesim.engine_model.frontend.async_llm import AsyncLLM
    from racesim.engine_model.topology import Topology

__all__ = ["SystemView"]


class SystemView(Protocol):
    """The system's components, by index: ``frontends[i].engine`` indexes ``engines``."""

    @property
    def engines(self) -> Sequence[EngineCore]:
        """Every engine core (one, or the prefill and decode engines under P/D)."""
        ...

    @property
    def frontends(self) -> Sequence[AsyncLLM]:
        """Every API-server process's AsyncLLM."""
        ...

    @property
    def topology(self) -> Topology:
        """What every component name is (engines, frontends, channels, clients)."""
        ...
