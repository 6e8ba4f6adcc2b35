"""Fidelity: vLLM's scheduler and engine-core tests as tests of the model:
tests/v1/core/test_async_scheduler.py (test_abort, test_stop_by_max_tokens) and
tests/v1/engine/test_engine_core.py (test_engine_core: counts, and #15043's sequential reuse)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from typing import Any

from racesim.engine_model import EngineConfig, RequestSpec, RunResult, System, Workload

Simulate = Callable[..., tuple[RunResult, System]]  # the conftest fixture

ASYNC = EngineConfig(step_time=0.01, async_scheduling=True)


def _incs_by_id(result: RunResult) -> dict[str, int]:
    return {e.request or "": e.inc for e in result.trace if e.kind == "fe.add"}


def test_async_abort_order_decides_how_many_tokens_each_request_got(
        simulate: Simulate) -> None:
    # Five requests decode together with two batches in flight; one is aborted per step, in
    # this order. Each gets exactly one token more than the one aborted a step before it.
    abort_order = [1, 3, 0, 4, 2]
    reqs = tuple(RequestSpec(f"r{i}", prompt_tokens=16, max_tokens=20,
                             abort_at=0.035 + 0.01 * abort_order.index(i)) for i in range(5))
    result, system = simulate(Workload(engine=ASYNC, requests=reqs), "abort-scope")

    finishes = [(e.request, e.detail.status) for e in result.trace if e.kind == "sched.finish"]
    assert finishes == [(f"r{i}", "FINISHED_ABORTED") for i in abort_order]
    applied = Counter(rid for e in result.trace if e.kind == "sched.update"
                      for rid, *_ in e.detail.applied)
    engine_tokens = [applied[f"r{i}"] for i in abort_order]
    assert [b - a for a, b in pairwise(engine_tokens)] == [1, 1, 1, 1]
    client_tokens = [result.requests[i].tokens for i in abort_order]
    assert [b - a for a, b in pairwise(client_tokens)] == [1, 1, 1, 1]
    assert all(r.finish_reason == "abort" for r in result.requests)
    assert system.engines[0].scheduler.requests == {}


def test_async_stop_by_max_tokens_schedules_no_extra_token(simulate: Simulate) -> None:
    reqs = tuple(RequestSpec(f"m{k}", prompt_tokens=16, max_tokens=k) for k in (1, 2, 5))
    result, _ = simulate(Workload(engine=ASYNC, requests=reqs), "buggy")
    incs = _incs_by_id(result)
    scheduled = Counter(inc for e in result.trace if e.kind == "sched.step"
                        for _rid, inc, n in e.detail.batch if n > 0)
    sampled = Counter(inc for e in result.trace if e.kind == "runner.sample"
                      for _rid, inc, _ctx, _eos in e.detail.sampled)
    for spec, out in zip(reqs, result.requests, strict=True):
        inc = incs[spec.id]
        assert scheduled[inc] == sampled[inc] == spec.max_tokens, spec.id
        assert (out.tokens, out.finish_reason) == (spec.max_tokens, "length")
    assert not result.violations


def test_async_eos_overshoots_by_the_step_in_flight_but_the_client_gets_none_of_it(
        simulate: Simulate) -> None:
    # #29355's premise: after EOS in step N, step N+1 was already scheduled with the request.
    result, _ = simulate(Workload(engine=ASYNC, requests=(
        RequestSpec("X", prompt_tokens=16, max_tokens=20, eos_at=3),)), "buggy")
    inc = _incs_by_id(result)["X"]
    sampled = sum(1 for e in result.trace if e.kind == "runner.sample"
                  for _rid, i, _c, _e in e.detail.sampled if i == inc)
    assert sampled == 4                      # one token past EOS was computed ...
    assert (result.requests[0].tokens, result.requests[0].finish_reason) == (3, "stop")
    assert not result.violations             # ... and dropped: X is finished when it lands


def test_engine_core_counts_and_sequential_reuse_of_one_id_drains(simulate: Simulate) -> None:
    # test_engine_core: waiting/running through add, step and abort, reusing ID "test" (#15043).
    reqs = (RequestSpec("test", at=0.0, prompt_tokens=16, max_tokens=3),
            RequestSpec("other", at=0.0, prompt_tokens=16, max_tokens=3),
            RequestSpec("test", at=0.1, prompt_tokens=16, max_tokens=20, abort_at=0.13),
            RequestSpec("test", at=0.2, prompt_tokens=16, max_tokens=3))
    probes = (0.0002, 0.005, 0.025, 0.045, 0.09, 0.115, 0.145, 0.215, 0.3)
    counts: list[tuple[float, int, int]] = []

    def setup(system: System) -> None:
        env = system.world.env
        sched = system.engines[0].scheduler

        def probe() -> Any:
            for t in probes:
                yield env.timeout(t - env.now)
                counts.append((t, len(sched.waiting), len(sched.running)))

        env.process(probe())

    result, system = simulate(Workload(engine=EngineConfig(step_time=0.01, max_num_seqs=1),
                                       requests=reqs), "buggy", setup=setup)
    assert counts == [
        (0.0002, 0, 0),   # nothing has reached the engine yet
        (0.005, 1, 1),    # "test" runs; "other" waits (max_num_seqs = 1)
        (0.025, 1, 1),
        (0.045, 0, 1),    # "test" finished; "other" runs
        (0.09, 0, 0),
        (0.115, 0, 1),    # "test" again
        (0.145, 0, 0),    # aborted
        (0.215, 0, 1),    # "test" a third time
        (0.3, 0, 0)]
    assert [(r.id, r.finish_reason) for r in result.requests] == [
        ("test", "length"), ("other", "length"), ("test", "abort"), ("test", "length")]
    engine = system.engines[0]
    assert (engine.scheduler.requests, engine.runner.requests) == ({}, {})
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    assert result.violated == ("metrics-exact",)   # the frontend abort is not in the stats
