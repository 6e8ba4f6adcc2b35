"""What the frontend asks of a lifecycle policy: the hooks AsyncLLM and OutputProcessor call.

The frontend depends on this Protocol, not on ``racesim.engine_model.policies``: a policy builds
its hooks from the frontend's primitives, so it imports the frontend, and the frontend importing
it back would close a cycle. ``LifecyclePolicy`` is the implementation.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Protocol

import simpy

__all__ = ["LifecycleHooks"]


class LifecycleHooks(Protocol):
    """A lifecycle policy as the frontend sees it. ``llm`` is the calling ``AsyncLLM``: typed
    ``Any`` here because naming it would import the frontend (the implementation, in
    ``policies``, types it exactly)."""

    @property
    def pop_stop_string_finishes(self) -> bool:
        """Whether the output handler drops a stop-string finish at once."""
        ...

    def assign_request_id(self, llm: Any, request_id: str) -> str:
        """The ID the engine sees for a client's ``request_id``."""
        ...

    def abort(self, llm: Any, request_ids: list[str]) -> Generator[simpy.Event, Any, None]:
        """AsyncLLM.abort: what is dropped when, and when the ABORT leaves."""
        ...

    def abort_stop_strings(self, llm: Any,
                           request_ids: list[str]) -> Generator[simpy.Event, Any, None]:
        """The output handler's ABORT for requests that hit a stop string."""
        ...
