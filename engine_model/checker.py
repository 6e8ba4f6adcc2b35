"""The invariant checker: an online oracle over the trace, plus end-of-run checks.

It is a dispatcher over small monitors (``racesim.engine_model.monitors``), one per family of
invariants, which share the hidden ground truth that rides on events (incarnation numbers
``inc`` and client ``uid``). Each violation names the first event that broke the invariant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from racesim.engine_model.events import (
    ApiCancel,
    ClientAbort,
    ClientCancel,
    ClientDisconnect,
    ClientOutput,
    ClientSend,
    FeAbortIssue,
    FeAbortNoop,
    FeAdd,
    KvAlloc,
    PdHold,
    PdRead,
    SchedAbortMiss,
    SchedAdd,
    SchedStep,
)
from racesim.engine_model.invariants import (
    INVARIANTS,
    SAFETY_INVARIANTS,
    Violation,
    check_invariant_names,
)
from racesim.engine_model.monitors.client import ClientOutputs
from racesim.engine_model.monitors.engine import EngineAlive
from racesim.engine_model.monitors.isolation import AbortIsolation
from racesim.engine_model.monitors.kv import KvOwnership
from racesim.engine_model.monitors.leaks import LeakAudit
from racesim.engine_model.monitors.liveness import IdLiveness
from racesim.engine_model.monitors.metrics import Metrics
from racesim.engine_model.monitors.pd import PdTransfers
from racesim.engine_model.monitors.truth import GroundTruth, Handler, Reporter
from racesim.sim.trace import TraceEvent, TraceListener
from racesim.sim.world import World

if TYPE_CHECKING:
    from racesim.engine_model.system_view import SystemView

__all__ = ["INVARIANTS", "SAFETY_INVARIANTS", "Violation", "Checker", "check_invariant_names",
           "EVALUATED_BY"]

#: For coverage: the event kinds whose occurrence in a run means the invariant was evaluated
#: on a live incarnation there (an ADD the scheduler took, a token a client received, an
#: abort a client issued, a P/D read...). An invariant none of whose kinds occurred was never
#: put to the test, whatever its verdict.
EVALUATED_BY: dict[str, tuple[str, ...]] = {
    "unique-live-id": (SchedAdd.KIND,),
    "frontend-covers-engine": (SchedStep.KIND,),
    "kv-ownership": (KvAlloc.KIND,),
    "no-leak": (SchedAdd.KIND,),
    "one-terminal-output": (ClientOutput.KIND,),
    "no-crosstalk": (ClientOutput.KIND,),
    "abort-precision": (FeAbortIssue.KIND, SchedAbortMiss.KIND),
    "abort-isolation": (ClientAbort.KIND, ClientDisconnect.KIND, ClientCancel.KIND,
                        ApiCancel.KIND),
    "orphan-run": (ClientAbort.KIND, ClientDisconnect.KIND, ClientCancel.KIND, ApiCancel.KIND,
                   FeAbortNoop.KIND),
    "no-hang": (ClientSend.KIND,),
    "engine-alive": (SchedStep.KIND,),
    "metrics-exact": (FeAdd.KIND,),
    "kv-destination": (PdRead.KIND,),
    "stranded-hold": (PdHold.KIND,),
}


class Checker(TraceListener):
    """Sends each recorded event to the monitors that read its kind; judges the end of a run."""

    def __init__(self, world: World, skip: frozenset[str] = frozenset()) -> None:
        self.world = world
        self.skip = skip
        self._report = Reporter(world, skip)
        self.violations: list[Violation] = self._report.violations
        self._truth = GroundTruth()
        self._liveness = IdLiveness(self._truth, self._report)
        self._kv = KvOwnership(self._truth, self._report)
        self._clients = ClientOutputs(self._truth, self._report)
        self._metrics = Metrics(self._truth, self._report)
        self._alive = EngineAlive(self._truth, self._report)
        self._isolation = AbortIsolation(self._truth, self._report)
        self._leaks = LeakAudit(self._truth, self._report)
        self._pd = PdTransfers(self._truth, self._report, self._kv)
        self._system: SystemView | None = None
        # The monitors' order is the order they see an event both read (pd.release: liveness,
        # then KV; pd.read: KV, then crosstalk), and so the order of its violations. The P/D
        # monitor comes after the ones that keep the ground truth it reads (a client's terminal
        # output, an incarnation's end).
        table: dict[str, list[Handler]] = {}
        for handlers in (self._liveness.handlers(), self._kv.handlers(),
                         self._clients.handlers(), self._metrics.handlers(),
                         self._alive.handlers(), self._pd.handlers(),
                         self._isolation.handlers()):
            for kind, handler in handlers:
                table.setdefault(kind, []).append(handler)
        self._table: dict[str, tuple[Handler, ...]] = {k: tuple(v) for k, v in table.items()}
        #: the event kinds this run recorded (coverage: ``evaluated``)
        self._seen: set[str] = set()
        world.trace.attach(self)

    def attach(self, system: SystemView) -> None:
        self._system = system
        self._truth.attach(system)

    def kinds(self) -> frozenset[str]:
        return frozenset(self._table)

    def on_event(self, ev: TraceEvent) -> None:
        self._seen.add(ev.kind)
        for handler in self._table[ev.kind]:
            handler(ev)

    def evaluated(self) -> tuple[str, ...]:
        """The invariants this run evaluated on a live incarnation (:data:`EVALUATED_BY`), in
        catalogue order; skipped ones excluded."""
        seen = self._seen
        return tuple(n for n in INVARIANTS if n not in self.skip
                     and any(k in seen for k in EVALUATED_BY.get(n, ())))

    def finish(self) -> tuple[Violation, ...]:
        now = self.world.now
        self._clients.finish(now)
        self._metrics.finish(now)
        if self._system is not None and "no-leak" not in self.skip:
            self._leaks.finish(self._system, now)
        if self._system is not None:
            dead = frozenset(e.name for e in self._system.engines if e.dead is not None)
            self._pd.finish(now, dead)
        return tuple(self.violations)
