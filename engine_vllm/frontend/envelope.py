"""What an engine sends a frontend on the vllm backend, and the parent's ordered child set.

:class:`EngineCoreOutputs` keeps vLLM's own ``EngineCoreOutputs`` (``real``) with each output in
an :class:`Envelope` that carries its incarnation (ground truth, never read by vLLM).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["Envelope", "EngineCoreOutputs", "_OrderedIds"]


class Envelope:
    """One of vLLM's ``EngineCoreOutput`` on the wire, with its incarnation beside it (ground
    truth, read only for ``fe.drop``)."""

    __slots__ = ("output", "inc")

    def __init__(self, output: Any, inc: int) -> None:
        self.output = output
        self.inc = inc


class EngineCoreOutputs:
    """What the engine sends a frontend: vLLM's ``EngineCoreOutputs`` (kept as ``real``) with
    each output in an :class:`Envelope`. Named as vLLM's, which the trace and reports show."""

    __slots__ = ("engine", "outputs", "real")

    def __init__(self, engine: int, outputs: tuple[Envelope, ...], real: Any) -> None:
        self.engine = engine
        self.outputs = outputs
        self.real = real

    @property
    def finished_requests(self) -> tuple[str, ...] | None:
        """vLLM's ``finished_requests`` (a set, so sorted), which a DP client's load balancer
        reads before the outputs are processed (core_client.py:1819-1825)."""
        done = self.real.finished_requests
        return tuple(sorted(done)) if done else None


class _OrderedIds:
    """``ParentRequest.child_requests`` in insertion order: vLLM keeps a set of strings, whose
    order (PYTHONHASHSEED) decides the order of an abort's children (output_processor.py:651)."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: dict[str, None] = {}

    def add(self, rid: str) -> None:
        self._ids[rid] = None

    def remove(self, rid: str) -> None:
        del self._ids[rid]

    def discard(self, rid: str) -> None:
        self._ids.pop(rid, None)

    def __contains__(self, rid: object) -> bool:
        return rid in self._ids

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._ids))

    def __len__(self) -> int:
        return len(self._ids)
