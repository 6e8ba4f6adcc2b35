"""What a client sees: RequestOutput pieces and the per-request RequestOutputCollector."""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import Any

import simpy

from racesim.engine_model.messages import KVTransferParams, Token

__all__ = ["CompletionOutput", "RequestOutput", "RequestOutputCollector",
           "StreamingInputOutputCollector"]


class CompletionOutput:
    """One sample's tokens and finish reason within a RequestOutput."""

    __slots__ = ("index", "tokens", "finish_reason")

    def __init__(self, index: int, tokens: list[Token] | None = None,
                 finish_reason: str | None = None) -> None:
        self.index = index
        self.tokens: list[Token] = tokens if tokens is not None else []
        self.finish_reason = finish_reason


class RequestOutput:
    """One delta for one client request (``request_id`` is what the client knows it by)."""

    __slots__ = ("request_id", "outputs", "finished", "kv_transfer_params", "error")

    def __init__(self, request_id: str, outputs: list[CompletionOutput], finished: bool = False,
                 kv_transfer_params: KVTransferParams | None = None,
                 error: str | None = None) -> None:
        self.request_id = request_id
        self.outputs = outputs
        self.finished = finished
        self.kv_transfer_params = kv_transfer_params
        self.error = error

    def merge(self, other: RequestOutput) -> None:
        """DELTA merge, as RequestOutputCollector.put does: append tokens per sample index; the
        later finish reason wins, even none (``RequestOutput.add``, vllm/outputs.py:211-255)."""
        by_index = {c.index: c for c in self.outputs}
        for c in other.outputs:
            mine = by_index.get(c.index)
            if mine is None:
                mine = CompletionOutput(c.index)
                self.outputs.append(mine)
                by_index[c.index] = mine
            mine.tokens.extend(c.tokens)
            mine.finish_reason = c.finish_reason
        self.finished = self.finished or other.finished
        if other.kv_transfer_params is not None:
            self.kv_transfer_params = other.kv_transfer_params


class RequestOutputCollector:
    """A single slot plus an event: ``put`` merges deltas, an error replaces the slot."""

    __slots__ = ("env", "request_id", "_slot", "_ready")

    def __init__(self, env: simpy.Environment, request_id: str) -> None:
        self.env = env
        self.request_id = request_id
        self._slot: RequestOutput | None = None
        self._ready: simpy.Event | None = None

    def put(self, output: RequestOutput) -> None:
        if self._slot is None or output.error is not None:
            self._slot = output
        elif self._slot.error is None:
            self._slot.merge(output)
        ev = self._ready
        if ev is not None and not ev.triggered:
            ev.succeed()

    def get(self) -> Generator[simpy.Event, Any, RequestOutput]:
        while self._slot is None:
            yield self.wait()
        out, self._slot = self._slot, None
        return out

    def take(self) -> RequestOutput | None:
        """The merged output waiting in the slot (emptying it), or None: ``get`` without the
        generator, for the client loop that takes one output per step."""
        out, self._slot = self._slot, None
        return out

    def wait(self) -> simpy.Event:
        """The event the next ``put`` triggers."""
        ev = self._ready = self.env.event()
        return ev


def _is_chunk_boundary(output: RequestOutput | None) -> bool:
    """A streaming-input chunk's last output: a finish reason on an output not finished
    (``_is_chunk_boundary``, v1/engine/output_processor.py:117-125)."""
    return (output is not None and output.error is None and not output.finished
            and any(c.finish_reason is not None for c in output.outputs))


class StreamingInputOutputCollector(RequestOutputCollector):
    """A session's collector: deltas merge as before, but never across an input chunk's
    boundary; what arrives behind one waits in a backlog, each chunk's outputs merged
    (``StreamingInputOutputCollector``, v1/engine/output_processor.py:128-160)."""

    __slots__ = ("_backlog",)

    def __init__(self, env: simpy.Environment, request_id: str) -> None:
        super().__init__(env, request_id)
        self._backlog: deque[RequestOutput] = deque()

    def put(self, output: RequestOutput) -> None:
        backlog = self._backlog
        if output.error is not None:
            backlog.clear()
        elif backlog or _is_chunk_boundary(self._slot):
            if backlog and not _is_chunk_boundary(backlog[-1]):
                backlog[-1].merge(output)
            else:
                backlog.append(output)
            return
        super().put(output)

    def get(self) -> Generator[simpy.Event, Any, RequestOutput]:
        while self._slot is None:
            yield self.wait()
        out = self.take()
        assert out is not None
        return out

    def take(self) -> RequestOutput | None:
        out, self._slot = self._slot, None
        if out is not None and self._backlog:
            self._slot = self._backlog.popleft()
        return out
