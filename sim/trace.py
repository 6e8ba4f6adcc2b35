"""Trace records, the canonical trace JSON and its SHA-256 (the trace hash).

The canonical JSON of a trace is one array of events, each ``[seq, time, component, kind,
request, inc, {detail}]``, with sorted keys, no spaces and UTF-8. The recorder hashes it in
chunks as events arrive, so a run that keeps no trace still has its exact hash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

__all__ = ["TraceEvent", "TraceListener", "TraceRecorder", "canonical_json", "trace_hash_of"]

# check_circular=False: a trace is a tree of fresh lists and dicts, so the per-container cycle
# bookkeeping (a third of the encoding time) could only ever change the error on a cyclic detail.
_encode = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"),
    check_circular=False,
).encode

_CHUNK = 512


class TraceEvent(NamedTuple):
    """One thing that happened: when, where (component), what (kind), to which request.

    ``request`` is the request-ID string the modelled system used; ``inc`` is the hidden
    incarnation number of the engine request involved (0 when none), which the modelled system
    never reads; ``detail`` holds kind-specific fields (JSON-able scalars, lists, dicts). An
    immutable record (a named tuple: the cheapest one Python has, and a run makes thousands).
    """

    seq: int
    time: float | int  # simpy's clock: the int 0 until the first float timeout
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


_new_tuple = tuple.__new__


def canonical_json(events: Iterable[TraceEvent]) -> str:
    """The whole trace as canonical JSON."""
    return _encode(list(events))


def trace_hash_of(events: Iterable[TraceEvent]) -> str:
    """SHA-256 of the canonical JSON trace."""
    return hashlib.sha256(canonical_json(events).encode("utf-8")).hexdigest()


class TraceListener:
    """A listener the recorder calls directly (a native call in the compiled build): the
    invariant checker, which sees every event of the kinds it names, as it is recorded."""

    def kinds(self) -> frozenset[str]:
        """The event kinds :meth:`on_event` wants; the others never reach it."""
        return frozenset()

    def on_event(self, ev: TraceEvent) -> None:
        """One event of a kind named by :meth:`kinds`."""


class TraceRecorder:
    """Numbers events, hashes them in chunks and, if asked, keeps them.

    One :class:`TraceListener` (the checker) and any number of plain callables see events as
    they are recorded. With ``hashing=False`` and ``retain=False`` an event costs only its
    record and its listeners, and an event nobody listens to is only numbered: exploration runs
    use that, since their delays are themselves trace events, so two runs have the same trace
    exactly when they have the same schedule (and the one run reported is re-run with its hash).
    """

    __slots__ = ("_events", "_pending", "_hash", "_count", "_listeners", "_listener", "_wanted",
                 "_retain", "_now", "_started", "_buffer")

    def __init__(self, now: Callable[[], float | int], *, retain: bool = True,
                 hashing: bool = True) -> None:
        self._now = now
        self._retain = retain
        self._buffer = hashing or retain
        self._events: list[TraceEvent] = []
        self._pending: list[TraceEvent] = []
        self._hash = hashlib.sha256(b"[") if hashing else None
        self._started = False
        self._count = 0
        self._listeners: list[Callable[[TraceEvent], None]] = []
        self._listener: TraceListener | None = None
        self._wanted: frozenset[str] = frozenset()

    def subscribe(self, listener: Callable[[TraceEvent], None]) -> None:
        """Call ``listener`` with every event (after the :class:`TraceListener`)."""
        self._listeners.append(listener)

    def attach(self, listener: TraceListener) -> None:
        """Make ``listener`` the recorder's one :class:`TraceListener`."""
        if self._listener is not None:
            raise ValueError("a TraceListener is already attached")
        self._listener = listener
        self._wanted = listener.kinds()

    def reads(self, kind: str) -> bool:
        """Whether an event of ``kind`` would be read: kept, hashed or listened to. A caller
        whose detail is costly to build may :meth:`skip` an event no one reads instead."""
        return self._buffer or bool(self._listeners) or kind in self._wanted

    def skip(self) -> None:
        """Number an event no one reads without building it (see :meth:`reads`): sequence
        numbers stay the same whatever a run keeps."""
        self._count += 1

    def record(self, component: str, kind: str, request: str | None, inc: int,
               detail: dict[str, Any]) -> None:
        seq = self._count
        self._count = seq + 1
        if not self.reads(kind):
            return  # nobody reads it: numbered, never built
        # tuple.__new__ builds the same TraceEvent without the named tuple's Python-level __new__
        ev = _new_tuple(TraceEvent, (seq, self._now(), component, kind, request, inc, detail))
        if self._buffer:
            pending = self._pending
            pending.append(ev)
            if len(pending) >= _CHUNK:
                self._flush()
        listener = self._listener
        if listener is not None and kind in self._wanted:
            listener.on_event(ev)
        for other in self._listeners:
            other(ev)

    def _flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        if self._hash is not None:
            text = _encode(pending)
            if self._started:
                self._hash.update(b",")
            self._hash.update(text[1:-1].encode("utf-8"))
            self._started = True
        if self._retain:
            self._events.extend(pending)
        self._pending = []

    @property
    def count(self) -> int:
        return self._count

    @property
    def retained(self) -> bool:
        return self._retain

    @property
    def events(self) -> tuple[TraceEvent, ...]:
        self._flush()
        return tuple(self._events)

    def __iter__(self) -> Iterator[TraceEvent]:
        return iter(self.events)

    def hexdigest(self) -> str:
        """The trace hash; "" when the recorder was told not to hash."""
        if self._hash is None:
            return ""
        self._flush()
        h = self._hash.copy()
        h.update(b"]")
        return h.hexdigest()
