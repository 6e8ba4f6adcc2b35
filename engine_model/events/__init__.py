"""The trace event vocabulary: every kind of event the model records, as a typed record.

Each kind is one :class:`~racesim.sim.trace.EventRecord` subclass: its ``KIND`` (the name in
the trace), its fields (``__slots__``, in ``__init__`` order), its narration
(:meth:`~racesim.sim.trace.EventRecord.describe`), whether it is a ``KEY`` event (one a reader
needs to follow a race) and which fields are ``OPTIONAL`` (left out of the trace JSON while
``None``). A record's JSON is the dict of its fields, so a kind's trace (and every trace hash)
is whatever its fields hold. The kinds live in this package's modules by who emits them
(client, frontend, dp, engine, pd); the kernel's own ``delay`` is :class:`racesim.sim.world.Delay`.

Emitters build records (``world.emit(component, request_id, inc, KvAlloc(blocks, table))``);
monitors, narration, reports and the Perfetto export read their fields by attribute
(``ev.detail.blocks``, with ``isinstance(ev.detail, KvAlloc)`` or ``ev.kind == KvAlloc.KIND``
to pick the kind). A kind nobody reads costs its record and a sequence number: the recorder
skips everything else (:meth:`racesim.sim.trace.TraceRecorder.reads`).

How to add an event kind
------------------------
1. Declare it in the module of its emitter's family here (or a new module imported below), and
   add it to ``__all__`` there and here::

       class DpWave(EventRecord):
           \"\"\"dp.wave: the DP coordinator starts wave ``wave`` on engine ``engine``.\"\"\"

           KIND = "dp.wave"
           KEY = True                       # shown in the focused timeline
           OPTIONAL = frozenset({"reason"})  # omitted from the JSON while None
           __slots__ = ("wave", "engine", "reason")

           def __init__(self, wave: int, engine: int, reason: str | None = None) -> None:
               self.wave = wave
               self.engine = engine
               self.reason = reason

           def describe(self, ev: TraceEvent) -> str:
               return f"starts wave {self.wave} on engine {self.engine}"

   The class is the declaration: :func:`racesim.sim.trace.record_classes` finds it, and
   tests/test_events.py checks it (a unique kind, fields that match ``__init__``, a
   narration that runs).
2. Emit it: ``world.emit(component, request_id, inc, DpWave(wave, engine))``. The older form
   ``world.record(component, "dp.wave", request_id, inc, wave=..., engine=...)`` builds the same
   record by name (and fails at once on a kind nobody declared), but only tests may use it:
   tests/test_events.py rejects it in the sources, since the lookup by name costs every run.
3. Read it by attribute: a monitor registers a handler for ``DpWave.KIND`` and reads
   ``ev.detail`` as a ``DpWave``; reports test ``ev.kind == DpWave.KIND`` or
   ``isinstance(ev.detail, DpWave)``.

A kind whose detail is costly to build and that only reports read may be guarded:
``if trace.reads(Kind.KIND): trace.emit(...) else: trace.skip()``.
"""

from __future__ import annotations

from racesim.engine_model.events.api import ApiCancel, ApiRequest, ApiRouterAbort, ApiStore
from racesim.engine_model.events.client import (
    ClientAbort,
    ClientCancel,
    ClientDisconnect,
    ClientDone,
    ClientOutput,
    ClientSend,
    PdAbort,
    PdDecode,
    PdPrefill,
)
from racesim.engine_model.events.runner import RunnerBooks, RunnerInput
from racesim.engine_model.events.dp import DpAbortUnrouted, DpRoute
from racesim.engine_model.events.engine import (
    MESSAGE_NAMES,
    EngineFatalEvent,
    EngineFault,
    EngineReject,
    EngineResume,
    EngineUtility,
    IpcDropped,
    IpcSend,
    KvAlloc,
    KvFree,
    KvHitAssert,
    RunnerSample,
    SchedAbortMiss,
    SchedAdd,
    SchedDuplicate,
    SchedFinish,
    SchedPreempt,
    SchedSession,
    SchedStep,
    SchedUpdate,
)
from racesim.engine_model.events.frontend import (
    FeAbortIssue,
    FeAbortNoop,
    FeAdd,
    FeAddCancelled,
    FeDrop,
    FeEncodeError,
    FeError,
    FeOutput,
    FePop,
    FeReject,
    FeStats,
    FeUtility,
)
from racesim.engine_model.events.pd import (
    PdHeartbeat,
    PdHold,
    PdHoldLost,
    PdLoadFailed,
    PdNotice,
    PdNoticeUnknown,
    PdPull,
    PdPushFailed,
    PdPushNotPosted,
    PdPushRegister,
    PdPushWrite,
    PdRead,
    PdReadFailed,
    PdRecvStart,
    PdRelease,
)
from racesim.sim.trace import EventRecord, TraceEvent, record_classes
from racesim.sim.world import Delay

__all__ = [
    "EventRecord", "TraceEvent", "Delay", "KINDS", "KEY_KINDS", "MESSAGE_NAMES",
    "ApiCancel", "ApiRequest", "ApiRouterAbort", "ApiStore",
    "ClientSend", "ClientAbort", "ClientCancel", "ClientDisconnect", "ClientOutput",
    "ClientDone", "PdPrefill", "PdDecode", "PdAbort",
    "FeAdd", "FeAddCancelled", "FeEncodeError", "FeReject", "FeAbortNoop", "FeAbortIssue",
    "FeError", "FeDrop",
    "FeStats", "FeOutput", "FePop", "FeUtility", "DpRoute", "DpAbortUnrouted",
    "IpcSend", "SchedAdd", "SchedDuplicate", "SchedAbortMiss", "SchedFinish", "SchedPreempt",
    "SchedSession", "SchedStep", "SchedUpdate", "RunnerSample", "RunnerBooks", "RunnerInput", "KvAlloc", "KvFree",
    "KvHitAssert", "EngineFatalEvent", "EngineFault", "EngineResume", "IpcDropped",
    "EngineReject", "EngineUtility",
    "PdHold", "PdRelease", "PdRead", "PdReadFailed", "PdLoadFailed", "PdNotice",
    "PdNoticeUnknown", "PdHeartbeat", "PdRecvStart", "PdPushRegister", "PdPushWrite",
    "PdPushFailed", "PdPushNotPosted", "PdHoldLost", "PdPull",
]

#: Every declared kind and its record class.
KINDS: dict[str, type[EventRecord]] = record_classes()

#: Event kinds a reader needs to follow a race; the rest is bookkeeping.
KEY_KINDS: frozenset[str] = frozenset(k for k, cls in KINDS.items() if cls.KEY)
