"""Engine-initiated finishes on vLLM 0.33: pause in "abort" and "keep" mode, a preprocessing
error from the input thread, and a failed P/D KV read (v1/engine/core.py, scheduler.py)."""

from __future__ import annotations

import pytest

from racesim.engine_model.config import EngineConfig, RequestSpec, Workload
from racesim.engine_model.policies import load_policy
from racesim.engine_model.system import RunResult, run_workload
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario, scenario_from_dict
from racesim.sim import InputError


def _run(*requests: RequestSpec, topology: str = "single", **engine: object) -> RunResult:
    workload = Workload(topology=topology, horizon=60.0, requests=requests,
                        engine=EngineConfig(vllm="0.33", **engine))  # type: ignore[arg-type]
    return run_workload(workload, load_policy("internal-id"))


def _kinds(r: RunResult, kind: str) -> list[str]:
    return [e.request or "" for e in r.trace if e.kind == kind]


def test_pause_abort_ends_running_requests_and_rejects_adds_until_resume() -> None:
    r = _run(RequestSpec("long", max_tokens=500), RequestSpec("paused", at=0.2),
             RequestSpec("later", at=0.4, max_tokens=5),
             pause_at=0.1, pause_mode="abort", resume_at=0.3)
    long, paused, later = r.requests
    assert long.finish_reason == "abort" and 0 < long.tokens < 500
    assert (paused.finish_reason, paused.tokens) == ("error", 0)   # engine_paused, retryable
    assert (later.finish_reason, later.tokens) == ("length", 5)
    assert [e.detail.why for e in r.trace if e.kind == "engine.reject"] == ["engine-paused"]
    assert r.violated == ()


def test_pause_keep_freezes_the_queues_and_resume_finishes_everything() -> None:
    r = _run(RequestSpec("a", max_tokens=30), RequestSpec("b", at=0.15, max_tokens=5),
             pause_at=0.1, pause_mode="keep", resume_at=0.5)
    assert [(q.finish_reason, q.tokens) for q in r.requests] == [("length", 30), ("length", 5)]
    steps = [e.time for e in r.trace if e.kind == "sched.step" and e.detail.batch]
    assert not [t for t in steps if 0.12 < t < 0.5]               # nothing scheduled paused
    assert r.violated == ()


def test_a_preprocessing_error_sends_error_and_the_request_never_reaches_the_scheduler() -> None:
    r = _run(RequestSpec("bad", preprocess_error=True), RequestSpec("good", max_tokens=3))
    assert [(q.finish_reason, q.tokens) for q in r.requests] == [("error", 0), ("length", 3)]
    assert not [rid for rid in _kinds(r, "sched.add") if rid.startswith("bad")]
    assert r.violated == ()


@pytest.mark.parametrize(("policy", "outcome"), [("fail", ("error", 0)),
                                                 ("recompute", ("length", 7))])
def test_a_failed_kv_read_fails_or_recomputes_and_p_holds_until_its_lease(
        policy: str, outcome: tuple[str, int]) -> None:
    r = _run(RequestSpec("X", max_tokens=7, kv_load_fails=True), topology="pd",
             kv_load_failure_policy=policy)
    assert (r.requests[0].finish_reason, r.requests[0].tokens) == outcome
    assert len(_kinds(r, "pd.read_failed")) == 1 and not _kinds(r, "pd.read")
    released = [e for e in r.trace if e.kind == "pd.release"
                and e.component == "prefill.scheduler"]
    assert [e.detail.cause for e in released] == ["timeout"]
    assert released[0].time > 20.0                                 # the lease, not a notice
    # nothing will read P's hold once D gave up on X: accounting, not a race
    assert r.violated == ("stranded-hold",)


def test_the_retry_after_a_failed_read_kills_p_with_equal_ids() -> None:
    scen = load_scenario("pd-kv-load-failure")
    buggy = run_scenario(scen, "buggy")
    assert buggy.violated == ("engine-alive",) and buggy.reach().reach == "live"
    assert [q.finish_reason for q in buggy.requests] == ["error", "error"]
    assert run_scenario(scen, "internal-id").violated == ("stranded-hold",)


@pytest.mark.parametrize("name", ["pause-abort-reuse", "preprocess-error-reuse"])
def test_an_engine_finish_racing_a_retry_hangs_it_with_equal_ids(name: str) -> None:
    scen = load_scenario(name)
    buggy = run_scenario(scen, "buggy")
    assert "no-hang" in buggy.violated and buggy.reach().reach == "live"
    assert buggy.requests[0].finish_reason == "stream_finished"
    assert run_scenario(scen, "internal-id").violated == ()


_BASE = {"name": "t", "request": [{"id": "X"}]}


@pytest.mark.parametrize(("extra", "message"), [
    ({"engine": {"pause_at": 1.0, "resume_at": 0.5}}, "engine.resume_at: needs"),
    ({"engine": {"resume_at": 0.5}}, "engine.resume_at: needs"),
    ({"engine": {"pause_mode": "wait"}}, "engine.pause_mode: must be one of"),
    ({"engine": {"data_parallel_size": 0}}, "engine.data_parallel_size: must be >= 1"),
    ({"engine": {"data_parallel_size": 2}, "topology": "pd"}, "topology = \"single\" only"),
    ({"request": [{"id": "X", "kv_load_fails": True}]}, "kv_load_fails: needs topology"),
    ({"request": [{"id": "X", "kv_load_fails": True}], "topology": "pd",
      "pd": {"connector": "mooncake"}}, "kv_load_fails: needs \\[pd\\] connector"),
    ({"request": [{"id": "X", "at": 1.0, "cancel_at": 0.5}]}, "cancel_at: must be >= at"),
])
def test_bad_settings_are_one_clear_error(extra: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        scenario_from_dict({**_BASE, **extra})


@pytest.mark.parametrize("engine", [{"pause_at": 0.1}, {}])
def test_engine_finish_features_are_refused_on_08(engine: dict[str, object]) -> None:
    requests = (RequestSpec("X", preprocess_error=not engine),)
    workload = Workload(requests=requests,
                        engine=EngineConfig(vllm="0.8", **engine))  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"not on profile '0\.8'"):
        run_workload(workload, load_policy("buggy"))
