"""EngineCore: the busy loop, sync and async steps, the model runner and engine death."""

from __future__ import annotations

import pytest

from racesim.engine_model import (
    EngineConfig,
    RequestSpec,
    RunResult,
    Workload,
    load_policy,
    run_workload,
)
from racesim.engine_model.fatal import EngineFatal
from racesim.engine_model.runner import ModelRunner
from racesim.engine_model.scheduler import NewRequestData, SchedulerOutput
from racesim.sim import DelayPlan, World

ABORT_POINT = "frontend.abort:after_pop"


def _run(workload: Workload, policy: str = "buggy",
         delays: list[tuple[str, int | None, float]] | None = None) -> RunResult:
    return run_workload(workload, load_policy(policy), plan=DelayPlan(overrides=delays or []))


def _log(result: RunResult, *kinds: str) -> list[tuple[str, float]]:
    return [(f"{e.kind} {e.request or ''}".strip(), round(e.time, 9))
            for e in result.trace if e.kind in kinds]


# -- the busy loop ---------------------------------------------------------------------------------

def test_an_add_arriving_mid_step_waits_for_the_step_to_end() -> None:
    result = _run(Workload(engine=EngineConfig(vllm="0.8", step_time=0.01), requests=(
        RequestSpec("A", at=0.0, max_tokens=3),
        RequestSpec("B", at=0.005, max_tokens=2))))       # reaches the engine at 0.0055

    arrive = {e.request: round(e.detail.arrive, 9) for e in result.trace
              if e.kind == "ipc.send" and e.detail.type == "EngineCoreRequest"}
    assert arrive == {"A": 0.0005, "B": 0.0055}
    log = _log(result, "sched.add", "sched.step", "sched.update")
    assert log[:6] == [
        ("sched.add A", 0.0005),
        ("sched.step", 0.0005),        # step 1: A's prefill, on the GPU until 0.0105
        ("sched.update", 0.0105),      # B arrived at 0.0055 but waited for the step end
        ("sched.add B", 0.0105),
        ("sched.step", 0.0105),
        ("sched.update", 0.0205),
    ]
    assert [(r.id, r.tokens, r.finish_reason) for r in result.requests] == \
        [("A", 3, "length"), ("B", 2, "length")]


def _steps_and_updates(result: RunResult) -> list[tuple[str, int]]:
    return [(e.kind, e.detail.step) for e in result.trace
            if e.kind in ("sched.step", "sched.update") and getattr(e.detail, "batch", True)]


def test_sync_scheduling_applies_step_n_before_scheduling_step_n_plus_1() -> None:
    result = _run(Workload(engine=EngineConfig(vllm="0.8", step_time=0.01), requests=(
        RequestSpec("A", max_tokens=4),)))
    assert _steps_and_updates(result) == [
        ("sched.step", 1), ("sched.update", 1), ("sched.step", 2), ("sched.update", 2),
        ("sched.step", 3), ("sched.update", 3), ("sched.step", 4), ("sched.update", 4)]


def test_async_scheduling_keeps_two_batches_in_flight() -> None:
    result = _run(Workload(engine=EngineConfig(vllm="0.8", step_time=0.01, async_scheduling=True),
                           requests=(RequestSpec("A", max_tokens=4),)))
    order = _steps_and_updates(result)
    assert order[:6] == [
        ("sched.step", 1), ("sched.step", 2),        # step 2 is scheduled before 1 is applied
        ("sched.update", 1), ("sched.step", 3),
        ("sched.update", 2), ("sched.step", 4)]
    for n in (1, 2, 3):
        assert order.index(("sched.step", n + 1)) < order.index(("sched.update", n))
    steps = {e.detail.step: round(e.time, 9) for e in result.trace if e.kind == "sched.step"}
    assert steps[1] == steps[2] == 0.0005, "both batches leave in the same loop pass"
    assert (result.requests[0].tokens, result.requests[0].finish_reason) == (4, "length")
    assert not result.violations


def test_async_runner_carries_a_sampled_token_by_id_match() -> None:
    # #29355: the token sampled for the old X in the step in flight feeds the new X's input.
    world = World(0)
    runner = ModelRunner(world, "engine.runner", async_scheduling=True)
    first = SchedulerOutput(1, scheduled_new_reqs=[NewRequestData("X", 1, 16, None, 0)],
                            num_scheduled_tokens={"X": 16}, num_computed_tokens={"X": 0})
    assert runner.execute_model(first)["X"].inc == 1
    second = SchedulerOutput(2, scheduled_new_reqs=[NewRequestData("X", 2, 16, None, 0)],
                             num_scheduled_tokens={"X": 16}, num_computed_tokens={"X": 0},
                             finished_req_ids=["X"])
    token = runner.execute_model(second)["X"]
    assert (token.inc, token.ctx) == (2, 1)


# -- the model runner and engine death -------------------------------------------------------------

def test_runner_lookup_of_a_missing_cached_id_is_a_fatal_key_error() -> None:
    runner = ModelRunner(World(0), "engine.runner", async_scheduling=False)
    out = SchedulerOutput(7, scheduled_cached_reqs=["X"], num_scheduled_tokens={"X": 1},
                          num_computed_tokens={"X": 32})
    with pytest.raises(EngineFatal, match=r"KeyError: 'X' in GPUModelRunner\.requests"):
        runner.execute_model(out)


def test_runner_key_error_kills_the_engine_and_every_pending_client_gets_an_error() -> None:
    # max_num_seqs = 1 keeps the third X waiting, so the old X is the only one scheduled after
    # the late ABORT: the scheduler finds *an* X in its dict, the runner has dropped X.
    workload = Workload(frontends=2,
                        engine=EngineConfig(vllm="0.8", step_time=0.01, max_num_seqs=1),
                        requests=(
        RequestSpec("X", at=0.0, prompt_tokens=32, max_tokens=40, abort_at=0.1),
        RequestSpec("X", at=0.13, prompt_tokens=32, max_tokens=40),
        RequestSpec("X", at=0.152, prompt_tokens=32, max_tokens=40, frontend=1),
        RequestSpec("Y", at=0.0, prompt_tokens=16, max_tokens=40, frontend=1),
        RequestSpec("Z", at=0.3, prompt_tokens=16, max_tokens=4)))
    result = _run(workload, delays=[(ABORT_POINT, 0, 0.05)])

    uid_inc = {e.detail.uid: e.inc for e in result.trace if e.kind == "fe.add"}
    old, new, third = uid_inc[1], uid_inc[2], uid_inc[3]
    story = [(e.kind, e.inc, round(e.time, 9)) for e in result.trace
             if e.kind in ("sched.add", "sched.finish", "engine.fatal")]
    assert story == [
        ("sched.add", old, 0.0005), ("sched.add", uid_inc[4], 0.0005),
        ("sched.add", new, 0.1405),              # overwrites the dict entry of the old X
        ("sched.finish", new, 0.1605),           # the late ABORT ends the new X
        ("sched.add", third, 0.1605),            # the third X fills the dict again
        ("engine.fatal", 0, 0.1605)]
    (fatal,) = [e for e in result.trace if e.kind == "engine.fatal"]
    assert fatal.detail.error.startswith("KeyError: 'X' in GPUModelRunner.requests")

    errors = sorted(e.detail.uid for e in result.trace if e.kind == "fe.error")
    assert errors == [2, 3, 4], "EngineDeadError for every request the frontends still track"
    assert [(r.id, r.frontend, r.finish_reason) for r in result.requests] == [
        ("X", 0, "abort"), ("X", 0, "error"), ("X", 1, "error"), ("Y", 1, "error"),
        ("Z", 0, "error")]                       # a request sent after the death is refused
    assert [e.request for e in result.trace if e.kind == "fe.reject"] == ["Z"]
    assert "engine-alive" in result.violated and "no-hang" not in result.violated
