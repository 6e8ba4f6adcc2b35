"""What AsyncLLM, the policies and the leak audit ask of an API server's request state.

``OutputProcessor`` (the model's) implements it; a backend that runs vLLM's own OutputProcessor
implements it with an adapter, so AsyncLLM's tasks and await points stay the same on both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from racesim.engine_model.frontend.request_state import ParentRequest
    from racesim.engine_model.frontend.outputs import RequestOutputCollector
    from racesim.engine_model.messages import EngineCoreRequest

__all__ = ["FrontendState"]


class FrontendState(Protocol):
    """One API server's OutputProcessor as its callers use it (IDs are internal unless named)."""

    #: under data parallelism, the trace names each state's engine (set by the System).
    dp: bool

    @property
    def finishes_duplicates(self) -> bool:
        """An add of an ID still held finishes the old stream (0.33) instead of failing."""
        ...

    def has_request(self, request_id: str) -> bool:
        """Whether ``request_id`` has a request state here."""
        ...

    def inc_of(self, request_id: str) -> int:
        """Ground truth: the incarnation of the state an abort just resolved ``request_id`` to."""
        ...

    def engine_of(self, request_id: str) -> int:
        """The engine the state of ``request_id`` was sent to."""
        ...

    def add_request(self, request: EngineCoreRequest, parent: ParentRequest | None, index: int,
                    collector: RequestOutputCollector, client_uid: int, engine: int,
                    stop_string_at: int | None) -> object:
        """Register ``request`` (its ADD is sent after)."""
        ...

    def finish_stream(self, request: EngineCoreRequest) -> None:
        """A plain (non-resumable) add of an ID still held: its stream ends, or a session
        takes it as its final add."""
        ...

    def open_session(self, request_id: str) -> None:
        """The first chunk of a streaming-input session was registered."""
        ...

    def streaming_update(self, request: EngineCoreRequest) -> None:
        """A later add of a streaming-input session's ID (more input, or its end)."""
        ...

    def note_unregistered(self, request: EngineCoreRequest, client_uid: int, index: int) -> None:
        """Ground truth: ``request``'s ADD goes out, but it was never registered here."""
        ...

    def flatten_req_to_abort(self, request_ids: list[str], internal: bool) -> list[str]:
        """The internal IDs an abort of ``request_ids`` means."""
        ...

    def drop_parents(self, request_ids: Sequence[str]) -> None:
        """An abort by internal ID named these IDs: pop each that is an n > 1 parent whose
        children have no state left (vLLM pops it inside ``abort_requests``)."""
        ...

    def parent_ids(self) -> list[str]:
        """Every ``parent_requests`` key (the RL router's abort-all names them)."""
        ...

    def abort_requests(self, request_ids: Sequence[str]) -> list[str]:
        """Drop the states of these internal IDs (final "abort" outputs to their clients)."""
        ...

    def mark_finished(self, request_ids: Sequence[str]) -> None:
        """Final "abort" outputs now, states kept."""
        ...

    def pop_finished(self, request_ids: Sequence[str]) -> None:
        """Drop states kept by ``mark_finished`` or a stop string."""
        ...

    def process_outputs(self, outputs: Any) -> list[str]:
        """Route one chunk of an engine's outputs; returns the stop-string aborts."""
        ...

    def fail_engine(self, engine: int | None, reason: str) -> None:
        """The engine died (None: any engine): every request on it ends with an error."""
        ...

    def live_ids(self) -> list[tuple[str, int]]:
        """``(request ID, incarnation)`` of every state still held."""
        ...

    def orphan_parents(self) -> list[tuple[str, int]]:
        """``(parent ID, a child's incarnation)`` of n > 1 parents still held whose children
        all left."""
        ...

    def orphan_external_ids(self) -> list[str]:
        """External IDs still mapped whose internal IDs are all gone."""
        ...
