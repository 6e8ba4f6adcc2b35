"""Preemption and recompute (vLLM 0.33 scheduler.py:930-980, 1799-1843): when a running request
needs a block the pool no longer has, FCFS preempts the last running request, frees its blocks
and puts it back at the front of waiting; under async scheduling its output still in flight is
stale: delivered, but not applied to the reset counters, and the request waits for it.
"""

from __future__ import annotations

import pytest

from racesim.engine_model import EngineConfig
from racesim.engine_model.kv_cache import KVCacheManager
from racesim.engine_model.messages import EngineCoreRequest, Token
from racesim.engine_model.request import Request, RequestStatus
from racesim.engine_model.scheduler import Scheduler
from racesim.explore import explore
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario
from racesim.sim import World


def _request(rid: str, inc: int, prompt_tokens: int = 16) -> Request:
    return Request(EngineCoreRequest(rid, rid, prompt_tokens, 40, 0, None, None, inc,
                                     f"#{inc}"))


def _engine(num_blocks: int, is_async: bool, caching: bool = False) -> tuple[World, Scheduler]:
    world = World(0)
    kv = KVCacheManager(world, "engine.kv", num_blocks, 16, caching, "lifo-uncached")
    config = EngineConfig(vllm="0.33", async_scheduling=is_async, prefix_caching=caching)
    return world, Scheduler(world, "engine.scheduler", config, kv)


def _tok(inc: int) -> Token:
    return Token(inc, 0, False)


def _fill(sched: Scheduler) -> None:
    """A and X (16-token prompts) each hold one full block; the pool has two."""
    sched.add_request(_request("A", 1))
    sched.add_request(_request("X", 2))
    sched.update_from_output(sched.schedule(), {"A": _tok(1), "X": _tok(2)})


def test_fcfs_preempts_the_last_running_request_and_recomputes_it_later() -> None:
    world, sched = _engine(num_blocks=2, is_async=False)
    _fill(sched)
    x = sched.requests["X"]
    step = sched.schedule()                 # A's 17th token needs a second block: X goes
    assert step.num_scheduled_tokens == {"A": 1}
    assert x.status == RequestStatus.PREEMPTED and x.num_computed_tokens == 0
    assert list(sched.waiting) == [x]
    assert sched.kv.req_to_blocks.get("X") is None
    assert [e.kind for e in world.trace if e.request == "X"][-2:] == ["kv.free", "sched.preempt"]
    sched.update_from_output(step, {"A": _tok(1)})
    sched.finish_requests(["A"], RequestStatus.FINISHED_ABORTED, "abort")
    resumed = sched.schedule()
    assert resumed.num_scheduled_tokens == {"X": 17}   # prompt and its one output token
    assert resumed.scheduled_cached_reqs == ["X"]
    assert x.status == RequestStatus.RUNNING


def _run_async_preemption() -> tuple[Scheduler, Request, list[int]]:
    """Async scheduling: step 1 (both prefills) is in flight when step 2 needs a block for A,
    so X is preempted with its prefill's output still to come. Returns the scheduler, X, and
    whether X could be scheduled before / its output length after step 1 lands."""
    _world, sched = _engine(num_blocks=2, is_async=True)
    sched.add_request(_request("A", 1))
    sched.add_request(_request("X", 2))
    s1 = sched.schedule()
    assert s1.num_scheduled_tokens == {"A": 16, "X": 16}
    s2 = sched.schedule()                              # A decodes: X is preempted
    x = sched.requests["X"]
    assert "X" not in s2.num_scheduled_tokens
    assert x.status == RequestStatus.PREEMPTED
    assert x.num_stale_output_tokens == 16 and x.num_output_placeholders == 0
    s3 = sched.schedule()                              # not resumed while that output is out
    seen = [int("X" in s3.num_scheduled_tokens)]
    sched.update_from_output(s1, {"A": _tok(1), "X": _tok(2)})
    seen.append(len(x.output))
    return sched, x, seen


def test_the_stale_token_reaches_the_client_and_the_counters_stay_reset() -> None:
    sched, x, seen = _run_async_preemption()
    assert seen == [0, 1]          # waited (scheduler.py:1084-1088), then delivered (:2338-2340)
    assert x.num_computed_tokens == 0 and x.num_output_placeholders == 0
    assert x.num_stale_output_tokens == 0 and x.num_in_flight_tokens == 0
    sched.finish_requests(["A"], RequestStatus.FINISHED_ABORTED, "abort")
    step = sched.schedule()                             # drained: X resumes from scratch
    assert step.num_scheduled_tokens == {"X": 17}


def test_an_abort_of_a_preempted_request_takes_it_out_of_waiting() -> None:
    sched, x, _seen = _run_async_preemption()
    sched.finish_requests(["X"], RequestStatus.FINISHED_ABORTED, "abort")
    assert x not in sched.waiting and "X" not in sched.requests
    assert list(sched.finished_req_ids) == ["X"]


def test_a_preempted_request_resumes_on_its_own_cached_prompt_blocks() -> None:
    world, sched = _engine(num_blocks=5, is_async=False, caching=True)
    sched.add_request(_request("A", 1, 48))
    sched.add_request(_request("X", 2, 16))
    first = sched.schedule()                            # A: 3 blocks, X: 1 (full, hashed)
    sched.update_from_output(first, {"A": _tok(1), "X": _tok(2)})
    sched.schedule()               # A takes the last block; X's 17th token preempts X itself
    assert sched.requests["X"].status == RequestStatus.PREEMPTED
    sched.finish_requests(["A"], RequestStatus.FINISHED_ABORTED, "abort")
    resumed = sched.schedule()
    # X's prompt block stayed cached in the free queue: only its output token is recomputed
    assert resumed.num_scheduled_tokens == {"X": 1}
    hits = [e.detail.hit for e in world.trace
            if e.kind == "kv.alloc" and "hit" in e.detail.as_dict()]
    assert len(hits) == 1


@pytest.mark.parametrize("policy", ["buggy", "internal-id"])
def test_an_abort_racing_a_preemption_breaks_nothing(policy: str) -> None:
    scen = load_scenario("preempt-abort")
    base = run_scenario(scen, policy, skip=["metrics-exact"])
    assert any(e.kind == "sched.preempt" for e in base.trace)
    found = explore(scen, policy, budget=150, skip=("metrics-exact",))
    assert found.violating_runs == 0


def test_an_id_reuse_racing_a_preemption_is_a_live_race_only_with_equal_ids() -> None:
    scen = load_scenario("preempt-reuse")
    found = explore(scen, "buggy", budget=60, skip=("metrics-exact",), reach="live")
    assert found.counterexample is not None
    fixed = explore(scen, "internal-id", budget=150, skip=("metrics-exact",))
    assert fixed.violating_runs == 0


def test_the_preempt_reuse_witness_underflows_the_stale_share_and_kills_the_engine() -> None:
    res = run_scenario(load_scenario("preempt-reuse"), "buggy", witness=True)
    dead = [v for v in res.violations if v.invariant == "engine-alive"]
    assert len(dead) == 1 and "num_stale_output_tokens >= 0" in dead[0].detail
    assert res.reach(dead[0]).reach == "live"       # only a late update_from_output
    assert "no-crosstalk" in res.violated            # the old X's token reached the new X
    fixed = run_scenario(load_scenario("preempt-reuse"), "internal-id", witness=True,
                         skip=["metrics-exact"])
    assert fixed.violations == ()
