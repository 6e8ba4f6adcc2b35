"""Trace records, the canonical trace JSON and its SHA-256 (the trace hash).

The canonical JSON of a trace is one array of events, each ``[seq, time, component, kind,
request, inc, {detail}]``, with sorted keys, no spaces and UTF-8. The recorder hashes it in
chunks as events arrive, so a run that keeps no trace still has its exact hash.

An event's detail is a typed record, a subclass of :class:`EventRecord` that names its kind and
fields; the kernel knows none of the kinds but its own ``delay`` (the model declares the rest in
``racesim.engine_model.events``). A record's JSON is the dict of its fields.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar, NamedTuple

from racesim.sim.errors import UndeclaredKind

__all__ = ["EventRecord", "TraceEvent", "TraceListener", "TraceRecorder", "UndeclaredKind",
           "canonical_json", "record_class", "record_classes", "trace_hash_of"]


class EventRecord:
    """The typed detail of one trace event kind: a slotted record, built once and never changed.

    A subclass declares ``KIND`` (the kind's name in the trace), ``__slots__`` (its fields, in
    the order its ``__init__`` takes them), ``KEY`` (a reader needs it to follow a race) and
    ``OPTIONAL`` (fields left out of the JSON while ``None``), and overrides :meth:`describe`.
    Declaring the class is declaring the kind: :func:`record_classes` finds every subclass.
    """

    __slots__: ClassVar[tuple[str, ...]] = ()
    KIND: ClassVar[str] = ""
    KEY: ClassVar[bool] = False
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    def as_dict(self) -> dict[str, Any]:
        """The detail as the trace JSON holds it: every field, but an OPTIONAL one while None."""
        optional = self.OPTIONAL
        out: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if value is None and name in optional:
                continue
            out[name] = value
        return out

    def describe(self, ev: TraceEvent) -> str:
        """One line of plain English for ``ev`` (whose detail this is)."""
        return f"{self.KIND} {ev.request or ''}".strip()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, EventRecord) \
            and other.as_dict() == self.as_dict()

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"{type(self).__name__}({fields})"

    def __reduce__(self) -> tuple[Any, ...]:
        # a compiled record is rebuilt through its constructor, never field by field
        return type(self), tuple(getattr(self, name) for name in self.__slots__)


_classes: dict[str, type[EventRecord]] = {}


def record_classes() -> dict[str, type[EventRecord]]:
    """Every declared kind and its record class (the subclasses of :class:`EventRecord` whose
    modules are imported). Two classes declaring one kind are an error."""
    found: dict[str, type[EventRecord]] = {}
    todo = list(EventRecord.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if not cls.KIND:
            continue
        other = found.get(cls.KIND)
        if other is not None and other is not cls:
            raise TypeError(f"event kind {cls.KIND!r} is declared twice: by "
                            f"{other.__qualname__} and {cls.__qualname__}")
        found[cls.KIND] = cls
    _classes.clear()
    _classes.update(found)
    return dict(sorted(found.items()))


def record_class(kind: str) -> type[EventRecord]:
    """The record class declaring ``kind``; :class:`UndeclaredKind` if none does."""
    cls = _classes.get(kind)
    if cls is None:
        cls = record_classes().get(kind)
        if cls is None:
            raise UndeclaredKind(f"trace event kind {kind!r} is not declared: declare an "
                                 f"EventRecord subclass for it (racesim.engine_model.events)")
    return cls


def _as_json(obj: object) -> Any:
    if isinstance(obj, EventRecord):
        return obj.as_dict()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")

# check_circular=False: a trace is a tree of fresh lists and dicts, so the per-container cycle
# bookkeeping (a third of the encoding time) could only ever change the error on a cyclic detail.
_encode = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"),
    check_circular=False, default=_as_json,
).encode

_CHUNK = 512


class TraceEvent(NamedTuple):
    """One thing that happened: when, where (component), what (kind), to which request.

    ``request`` is the request-ID string the modelled system used; ``inc`` is the hidden
    incarnation number of the engine request involved (0 when none), which the modelled system
    never reads; ``detail`` is the kind's typed record (:class:`EventRecord`). An immutable
    record (a named tuple: the cheapest one Python has, and a run makes thousands).
    """

    seq: int
    time: float | int  # simpy's clock: the int 0 until the first float timeout
    component: str
    kind: str
    request: str | None
    inc: int
    detail: EventRecord

    def as_list(self) -> list[Any]:
        return [self.seq, self.time, self.component, self.kind, self.request, self.inc,
                self.detail.as_dict()]

    @classmethod
    def from_list(cls, row: list[Any]) -> TraceEvent:
        seq, time, component, kind, request, inc, detail = row
        return cls(int(seq), float(time), str(component), str(kind),
                   None if request is None else str(request), int(inc),
                   record_class(str(kind))(**dict(detail)))


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
               detail: Mapping[str, Any]) -> None:
        """:meth:`emit` for a detail given as a dict: the record of ``kind`` is built from it
        (:class:`UndeclaredKind` if no record declares ``kind``)."""
        self.emit(component, request, inc, record_class(kind)(**detail))

    def emit(self, component: str, request: str | None, inc: int, record: EventRecord) -> None:
        """Record one event of ``record``'s kind."""
        seq = self._count
        self._count = seq + 1
        kind = record.KIND
        if not self.reads(kind):
            return  # nobody reads it: numbered, and nothing more
        # tuple.__new__ builds the same TraceEvent without the named tuple's Python-level __new__
        ev = _new_tuple(TraceEvent, (seq, self._now(), component, kind, request, inc, record))
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
