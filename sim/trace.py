"""Trace records, the canonical trace JSON and its SHA-256 (the trace hash)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["TraceEvent", "TraceRecorder", "canonical_line", "trace_hash_of"]

_dumps = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
).encode


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One thing that happened: when, where (component), what (kind), to which request.

    ``request`` is the request-ID string the modelled system used; ``inc`` is the hidden
    incarnation number of the engine request involved (0 when none), which the modelled system
    never reads; ``detail`` holds kind-specific fields (JSON-able scalars, lists, dicts).
    """

    seq: int
    time: float
    component: str
    kind: str
    request: str | None
    inc: int
    detail: Mapping[str, Any]

    def as_list(self) -> list[Any]:
        return [self.seq, self.time, self.component, self.kind, self.request, self.inc,
                dict(self.detail)]

    @classmethod
    def from_list(cls, row: list[Any]) -> TraceEvent:
        seq, time, component, kind, request, inc, detail = row
        return cls(int(seq), float(time), str(component), str(kind),
                   None if request is None else str(request), int(inc), dict(detail))


def canonical_line(event: TraceEvent) -> bytes:
    """The event as one line of canonical JSON (sorted keys, no spaces, UTF-8, newline)."""
    return (_dumps(event.as_list()) + "\n").encode("utf-8")


def trace_hash_of(events: Iterable[TraceEvent]) -> str:
    """SHA-256 of the canonical JSON-lines trace."""
    h = hashlib.sha256()
    for ev in events:
        h.update(canonical_line(ev))
    return h.hexdigest()


class TraceRecorder:
    """Numbers events, hashes them as they come and, if asked, keeps them.

    The hash is streamed, so a run with ``retain=False`` still has its exact trace hash while its
    memory stays flat; listeners (the invariant checker) see every event as it is recorded.
    """

    __slots__ = ("_events", "_hash", "_count", "_listeners", "_retain", "_now")

    def __init__(self, now: Callable[[], float], *, retain: bool = True) -> None:
        self._now = now
        self._retain = retain
        self._events: list[TraceEvent] = []
        self._hash = hashlib.sha256()
        self._count = 0
        self._listeners: list[Callable[[TraceEvent], None]] = []

    def subscribe(self, listener: Callable[[TraceEvent], None]) -> None:
        self._listeners.append(listener)

    def record(self, component: str, kind: str, request: str | None = None, inc: int = 0,
               **detail: Any) -> TraceEvent:
        ev = TraceEvent(self._count, self._now(), component, kind, request, inc, detail)
        self._count += 1
        self._hash.update(canonical_line(ev))
        if self._retain:
            self._events.append(ev)
        for listener in self._listeners:
            listener(ev)
        return ev

    @property
    def count(self) -> int:
        return self._count

    @property
    def retained(self) -> bool:
        return self._retain

    @property
    def events(self) -> tuple[TraceEvent, ...]:
        return tuple(self._events)

    def __iter__(self) -> Iterator[TraceEvent]:
        return iter(self._events)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()
