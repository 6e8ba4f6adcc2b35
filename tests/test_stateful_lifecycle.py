"""A rule-based state machine that drives one API server and one engine step by step.

Hypothesis plays the clients and the clock: it submits requests under IDs from a two-ID pool,
aborts IDs (holding the ABORT at ``frontend.abort:after_pop`` for a chosen time),
disconnects clients, steps the simpy environment event by event or by a small time, and lets
the sockets drain. The invariant checker is wired to the World before the System is built, so
every trace event is checked as it happens; after every rule no safety invariant may be
broken, and at the end the run is drained and the end-of-run invariants (no-hang, no-leak) are
checked too. Under internal-id nothing may break; under buggy the same machine must find
#15326's race. (engine-final is not the policy under test: this machine finds its
pending-abort window, where an ABORT held at the BUG point outlives its request's natural end
and then ends a resubmission of the same ID; see tests/test_prop_policies.py.)
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, ClassVar

import _profiles  # noqa: F401  (loads the ci/dev/nightly profile before @settings below)
import pytest
import simpy
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from racesim.engine_model import (
    SAFETY_INVARIANTS,
    Checker,
    EngineConfig,
    System,
    Workload,
    load_policy,
)
from racesim.engine_model.client import finish_reason_of
from racesim.engine_model.frontend.async_llm import AsyncLLM
from racesim.engine_model.frontend.outputs import RequestOutputCollector
from racesim.engine_model.points import POINTS
from racesim.sim import DelayPlan, TraceEvent, World

POOL = ("X", "Y")
ABORT_POINT = "frontend.abort:after_pop"
YIELDING = frozenset(p.name for p in POINTS if p.always_yields)
HOLDS = st.sampled_from([0.0, 0.005, 0.02, 0.05])  # how long an ABORT waits at the BUG point


class SafetyViolation(AssertionError):
    """The checker found a broken safety invariant (not a bug in this machine)."""


class _Caller:
    """A scripted HTTP handler: sends one request and reads its stream until the end, or until
    it is cancelled (a disconnect: from then on nobody reads the collector)."""

    def __init__(self, world: World, frontend: AsyncLLM, index: int, uid: int, rid: str,
                 max_tokens: int) -> None:
        self.world = world
        self.frontend = frontend
        self.name = f"client{index}"
        self.uid = uid
        self.rid = rid
        self.max_tokens = max_tokens
        self.collector: RequestOutputCollector | None = None
        self.finish_reason: str | None = None
        self.tokens = 0
        self.cancelled = False
        world.env.process(self._run())

    @property
    def streaming(self) -> bool:
        return self.collector is not None and self.finish_reason is None

    def terminate(self, reason: str) -> None:
        self.finish_reason = reason
        self.world.record(self.name, "client.done", self.rid, 0, uid=self.uid, reason=reason,
                          tokens=self.tokens)

    def _run(self) -> Generator[simpy.Event, Any, None]:
        world = self.world
        world.record(self.name, "client.send", self.rid, 0, uid=self.uid, frontend=0, n=1,
                     prompt_tokens=16, max_tokens=self.max_tokens)
        got = yield from self.frontend.add_request(self.rid, client_uid=self.uid,
                                                   prompt_tokens=16, max_tokens=self.max_tokens)
        if isinstance(got, str):  # rejected ("already running") or the engine is dead
            self.terminate(got)
            return
        self.collector = got
        while True:
            out = yield from got.get()
            if self.cancelled:
                return
            reason = finish_reason_of(out)
            tokens = [[c.index, t.inc, t.ctx] for c in out.outputs for t in c.tokens]
            self.tokens += len(tokens)
            world.record(self.name, "client.output", self.rid, 0, uid=self.uid, tokens=tokens,
                         finish=reason, after_done=self.finish_reason is not None)
            if self.finish_reason is None and reason is not None:
                self.terminate(reason)


class LifecycleMachine(RuleBasedStateMachine):
    """One API server and one engine under ``policy``; ``permitted`` are the safety invariants
    the policy is known to break (for internal-id: abort-isolation, as an abort by external ID
    ends every client's request under it, output_processor.py:627-629)."""

    policy: ClassVar[str] = "internal-id"
    permitted: ClassVar[frozenset[str]] = frozenset({"abort-isolation"})

    def __init__(self) -> None:
        super().__init__()
        self._holds: dict[object, float] = {}
        self.world = World(0, DelayPlan(decider=self._decide), always_yield=YIELDING)
        self.env = self.world.env
        self.checker = Checker(self.world)  # subscribed before anything is recorded
        self.system = System(self.world, Workload(engine=EngineConfig(vllm="0.8"), requests=()),
                             load_policy(self.policy))
        self.checker.attach(self.system)
        self.frontend = self.system.frontends[0]
        self.callers: list[_Caller] = []
        self._arrivals = 0.0
        self.world.trace.subscribe(self._on_event)

    def _on_event(self, ev: TraceEvent) -> None:
        if ev.kind == "ipc.send":
            self._arrivals = max(self._arrivals, ev.detail.arrive)

    def _decide(self, point: str, k: int, default: float) -> float:
        """Every point runs at its natural speed, except the ABORT of an abort rule, which is
        held for that rule's ``hold`` (keyed by the simpy process that passes the point)."""
        if point == ABORT_POINT:
            return self._holds.pop(self.env.active_process, default)
        return default

    def _abort(self, request_id: str, internal: bool, hold: float
               ) -> Generator[simpy.Event, Any, None]:
        me = self.env.active_process
        self._holds[me] = hold
        yield from self.frontend.abort(request_id, internal=internal)
        self._holds.pop(me, None)  # an abort that found nothing never reached the point

    # -- rules --------------------------------------------------------------------------------

    @rule(rid=st.sampled_from(POOL), max_tokens=st.integers(1, 8))
    def submit(self, rid: str, max_tokens: int) -> None:
        self.callers.append(_Caller(self.world, self.frontend, len(self.callers),
                                    self.system.next_inc(), rid, max_tokens))

    @rule(rid=st.sampled_from(POOL), hold=HOLDS)
    def abort(self, rid: str, hold: float) -> None:
        self.env.process(self._abort(rid, False, hold))

    @precondition(lambda self: any(c.streaming for c in self.callers))
    @rule(pick=st.integers(0, 50), hold=HOLDS)
    def disconnect(self, pick: int, hold: float) -> None:
        """The handler is cancelled; generate() aborts its request by internal ID."""
        streaming = [c for c in self.callers if c.streaming]
        caller = streaming[pick % len(streaming)]
        assert caller.collector is not None
        self.world.record(caller.name, "client.disconnect", caller.rid, 0, uid=caller.uid)
        caller.cancelled = True
        caller.terminate("abort")
        self.env.process(self._abort(caller.collector.request_id, True, hold))

    @rule()
    def step(self) -> None:
        """Process exactly one simpy event (a send, a wake-up, a step boundary)."""
        if self.env.peek() != float("inf"):
            self.env.step()

    @rule(seconds=st.sampled_from([0.0005, 0.005, 0.01, 0.03]))
    def wait(self, seconds: float) -> None:
        self.env.run(until=self.env.now + seconds)

    @rule()
    def deliver(self) -> None:
        """Run until every message sent so far has arrived and been handled."""
        while self.env.peek() <= self._arrivals:
            self.env.step()

    # -- checks -------------------------------------------------------------------------------

    def _broken(self) -> list[str]:
        return [f"{v.invariant} at t={v.time:.4f}: {v.detail}" for v in self.checker.violations
                if v.invariant in SAFETY_INVARIANTS and v.invariant not in self.permitted]

    @invariant()
    def safety_holds(self) -> None:
        broken = self._broken()
        if broken:
            raise SafetyViolation(f"{self.policy}: " + "; ".join(broken))

    def teardown(self) -> None:
        """Drain to quiescence, then check the end-of-run invariants as well."""
        horizon = self.env.now + 30.0
        while self.env.peek() <= horizon:
            self.env.step()
        self.checker.finish()
        broken = self._broken()
        if broken:
            raise SafetyViolation(f"{self.policy} (at the end): " + "; ".join(broken))


TestInternalIdLifecycle = LifecycleMachine.TestCase
TestInternalIdLifecycle.settings = settings(stateful_step_count=25, deadline=None)


class BuggyLifecycle(LifecycleMachine):
    policy = "buggy"


def test_the_machine_finds_the_race_under_buggy() -> None:
    """The same machine has teeth: under buggy it finds an abort whose held ABORT is overtaken
    by a resubmission of the same ID. Only the search phase runs (no shrinking), so this stays
    fast; the failure raised is the checker's, not an error in the machine."""
    with pytest.raises(SafetyViolation, match=r"unique-live-id|abort-precision"):
        run_state_machine_as_test(BuggyLifecycle, settings=settings(
            max_examples=300, stateful_step_count=25, deadline=None, derandomize=True,
            database=None, phases=[Phase.generate], report_multiple_bugs=False,
            suppress_health_check=list(HealthCheck), print_blob=False))


def test_the_points_the_machine_holds_exist() -> None:
    assert ABORT_POINT in POINTS
