"""Data parallelism: the load balancer's routing by reqs_in_flight, the #57061 leak, and the
races the bundled DP scenarios show (vLLM 0.33 DPLBAsyncMPClient, core_client.py:1710-1900)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from racesim.cli import main
from racesim.engine_model.config import EngineConfig, RequestSpec, Workload
from racesim.engine_model.data_parallel import DPLoadBalancer
from racesim.engine_model.policies import load_policy
from racesim.engine_model.system import run_workload
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario
from racesim.sim import InputError
from racesim.sim.world import World

SAFETY_OK = {"metrics-exact"}


def _lb(engines: int = 2, client: int = 0, clients: int = 1) -> DPLoadBalancer:
    return DPLoadBalancer(World(0), "frontend0", engines, client, clients)


def test_the_balancer_spreads_a_burst_round_robin_and_keeps_affinity() -> None:
    lb = _lb()
    assert [lb.choose(r, i) for i, r in enumerate("ABCD", 1)] == [0, 1, 0, 1]
    assert lb.choose("A", 9) == 0                      # same ID again: reqs_in_flight affinity
    assert lb.reqs_in_flight == {"A": 0, "B": 1, "C": 0, "D": 1}
    lb.finished(["A", "Z"])                            # an unknown ID is ignored
    assert "A" not in lb.reqs_in_flight and lb.engine_inflight == [1, 2]


def test_each_api_server_starts_its_scan_at_its_own_engine() -> None:
    assert _lb(2, 0, 2).choose("X", 1) == 0
    assert _lb(2, 1, 2).choose("X", 1) == 1            # eng_start_index = 2 * 1 // 2
    assert _lb(4, 1, 3).eng_start_index == 1           # 4 * 1 // 3


def test_published_counts_steer_the_choice_and_waiting_counts_under_kv_pressure() -> None:
    lb = _lb()
    lb.publish([(3, 4, 0.2), (0, 1, 0.2)])
    assert lb.choose("A", 1) == 1
    lb.publish([(1, 0, 0.95), (0, 2, 0.1)])            # 1 + 1 * 6 * 0.45 > 2
    assert lb.choose("B", 2) == 1


def test_aborts_are_routed_by_reqs_in_flight_and_unknown_ids_go_nowhere() -> None:
    lb = _lb()
    lb.choose("A", 1)
    lb.choose("B", 2)
    assert lb.route_aborts(["A", "B", "C"]) == ({0: ["A"], 1: ["B"]}, ["C"])


def test_the_stale_entry_sends_the_retrys_abort_nowhere() -> None:
    scen = load_scenario("dp-stale-inflight")
    raced = run_scenario(scen, "buggy")
    assert "frontend-covers-engine" in raced.violated
    assert raced.reach().reach == "live"
    unrouted = [e for e in raced.trace if e.kind == "dp.abort_unrouted"]
    assert [e.detail.ids for e in unrouted] == [["X"]]
    routes = [e.detail.affinity for e in raced.trace if e.kind == "dp.route"]
    assert routes == [False, True]                    # the retry rode the first X's entry
    fixed = run_scenario(scen, "internal-id")
    assert set(fixed.violated) <= SAFETY_OK
    assert not [e for e in fixed.trace if e.kind == "dp.abort_unrouted"]


def test_57061_cancel_during_the_add_send_leaks_and_is_latent_on_033() -> None:
    scen = load_scenario("dp-cancel-during-add")
    assert scen.vllm == "0.33"
    quiet = run_scenario(scen, "internal-id")
    assert "no-leak" not in quiet.violated             # cancelled after add_request returned
    for policy in ("buggy", "internal-id"):
        r = run_scenario(scen, policy, witness=True)
        leaks = [v for v in r.violations if v.invariant == "no-leak"]
        assert {v.detail.split(" still holds")[0] for v in leaks} == {
            "frontend0 OutputProcessor.request_states",
            "frontend0 DPLBAsyncMPClient.reqs_in_flight"}
        assert r.reach(leaks[0]).reach == "latent"
        assert r.reach(leaks[0]).needs == ("frontend.add_request:before_send",)
        assert not [e for e in r.trace if e.kind == "ipc.send"
                    and e.detail.type == "EngineCoreRequest" and e.request.startswith("X")]


def _single(vllm: str, **engine: object) -> Workload:
    return Workload(engine=EngineConfig(vllm=vllm, **engine),  # type: ignore[arg-type]
                    requests=(RequestSpec("X", max_tokens=5, cancel_at=0.0005),))


def test_08_aborted_the_cancelled_add_unconditionally_so_nothing_leaks() -> None:
    from racesim.sim.points import DelayPlan
    plan = DelayPlan(overrides=[("frontend.add_request:before_send", 0, 0.001)])
    old = run_workload(_single("0.8"), load_policy("buggy"), plan=plan)
    assert "no-leak" not in old.violated
    assert any(e.kind == "fe.abort_issue" for e in old.trace)
    new = run_workload(_single("0.33"), load_policy("buggy"), plan=plan)
    assert "no-leak" in new.violated


def test_data_parallelism_on_08_is_bad_input_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InputError, match=r"data_parallel_size > 1 is modelled on vLLM 0\.33"):
        run_workload(_single("0.8", data_parallel_size=2), load_policy("buggy"))
    with pytest.raises(SystemExit) as exit_:
        main(["run", "dp-stale-inflight", "--vllm", "0.8"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "data_parallel_size" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_without_data_parallelism_no_dp_event_is_recorded() -> None:
    r = run_scenario(load_scenario("multi-frontend"), "internal-id")
    assert not [e for e in r.trace if e.kind.startswith("dp.")]
    assert all("dp_engine" not in e.detail.as_dict() for e in r.trace if e.kind == "fe.add")


def test_a_dp_run_is_deterministic() -> None:
    scen = load_scenario("dp-reuse-across-engines")
    a = run_scenario(scen, "buggy", witness=True)
    b = run_scenario(scen, "buggy", witness=True)
    assert a.trace_hash == b.trace_hash and "engine-alive" in a.violated


_ids = st.sampled_from(["A", "B", "C"])
_request = st.builds(
    lambda rid, at, fe, abort, tokens: RequestSpec(
        rid, at=at, frontend=fe, max_tokens=tokens,
        abort_at=None if abort is None else at + abort),
    _ids, st.floats(0, 0.2), st.integers(0, 1), st.none() | st.floats(0, 0.1),
    st.integers(1, 12))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(_request, min_size=1, max_size=6), size=st.integers(2, 3))
def test_internal_ids_keep_any_dp_workload_safe_and_leak_free(
        requests: list[RequestSpec], size: int) -> None:
    """With unique internal IDs, no reuse pattern across two API servers and 2-3 engines
    breaks a safety invariant, and every reqs_in_flight entry is gone at the end; but
    abort-isolation, which any two clients aborting by one external ID on one API server break
    with or without data parallelism (output_processor.py:627-629; api-cross-client-abort)."""
    workload = Workload(frontends=2, requests=tuple(requests),
                        engine=EngineConfig(vllm="0.33", data_parallel_size=size))
    r = run_workload(workload, load_policy("internal-id"), skip=("abort-isolation",))
    assert set(r.violated) <= SAFETY_OK, r.violations
    assert len([e for e in r.trace if e.kind == "dp.route"]) == len(requests)


def test_the_dp_workload_strategy_can_fail_under_buggy() -> None:
    """The property above has teeth: the same generator's reuse patterns break buggy."""
    workload = Workload(frontends=2, engine=EngineConfig(vllm="0.33", data_parallel_size=2),
                        requests=(RequestSpec("A", max_tokens=10, abort_at=0.02),
                                  RequestSpec("A", at=0.02, max_tokens=10, abort_at=0.1)))
    r = run_workload(workload, load_policy("buggy"))
    assert not set(r.violated) <= SAFETY_OK
    assert replace(workload.engine, data_parallel_size=None).dp_size == 1
    assert replace(workload.engine, data_parallel_size=3).dp_size == 3


def test_the_matrix_on_08_leaves_out_the_033_only_scenarios(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import json

    from racesim.engine_model.versions import profile_gap
    from racesim.scenarios import bundled_names
    names = bundled_names()
    only_033 = [n for n in names if profile_gap(load_scenario(n).with_vllm("0.8").workload)]
    assert {"dp-stale-inflight", "pause-abort-reuse", "pd-kv-load-failure"} <= set(only_033)
    with pytest.raises(SystemExit) as exit_:
        main(["matrix", "--vllm", "0.8", "-p", "buggy", "--budget", "1", "--json",
              "--out", str(tmp_path)])
    assert exit_.value.code == 0
    out = capsys.readouterr()
    cells = json.loads(out.out)["cells"]
    assert sorted(c["scenario"] for c in cells) == sorted(set(names) - set(only_033))
    assert "leaves out" in out.err


def test_an_open_sessions_abort_goes_to_every_engine() -> None:
    lb = _lb(3)
    lb.choose("S", 1, resumable=True)
    assert lb.route_aborts(["S"]) == ({0: ["S"], 1: ["S"], 2: ["S"]}, [])
    assert lb.route_aborts(["S"]) == ({0: ["S"]}, [])      # broadcast once, then by entry
    lb.choose("T", 2, resumable=True)
    lb.choose("T", 2)                                       # the session's final add
    assert lb.route_aborts(["T"]) == ({1: ["T"]}, [])


def test_a_session_under_data_parallelism_stays_on_its_engine() -> None:
    workload = Workload(engine=EngineConfig(vllm="0.33", data_parallel_size=2),
                        requests=(RequestSpec("S", max_tokens=4, input_chunks=2,
                                              chunk_interval=0.05),
                                  RequestSpec("U", max_tokens=4, input_chunks=1, abort_at=0.03,
                                              chunk_interval=0.05)))
    r = run_workload(workload, load_policy("internal-id"))
    routes = [(e.request[0], e.detail.engine, e.detail.affinity) for e in r.trace
              if e.kind == "dp.route"]
    assert [x for x in routes if x[0] == "S"] == [("S", 0, False), ("S", 0, True),
                                                   ("S", 0, True), ("S", 0, True)]
    assert r.requests[0].tokens == 12 and set(r.violated) <= SAFETY_OK
    aborts = [e for e in r.trace if e.kind == "ipc.send" and e.detail.type == "AbortMessage"]
    assert sorted(e.detail.to for e in aborts) == [0, 1]  # U's abort: every engine


def test_a_dead_rank_takes_its_deployment_down_so_the_survivors_hold_no_leak() -> None:
    # When one engine process exits, the client's monitor shuts every rank down (0.33
    # core_client.py:822-850, v1/engine/utils.py:356-372): bench-1, still running on dp0 when
    # dp1 dies of the duplicate assert, is not leaked, however long it would have run.
    scen = load_scenario("dp-reuse-across-engines")
    w = scen.workload
    reqs = list(w.requests)
    reqs[1] = replace(reqs[1], max_tokens=900)
    scen = replace(scen, workload=replace(w, requests=tuple(reqs), horizon=5.0))
    r = run_scenario(scen, "buggy", witness=True)
    assert r.violated == ("engine-alive",)
    # the frontends never audited a dead deployment's survivors, and now neither do the engines
    assert [q.finish_reason for q in r.requests] == ["error", "error", "error"]
