"""Engine death is not always certain on vLLM 0.33: fault tolerance resumes after the
duplicate-ID assert (v1/fault_tolerance/engine_core_sentinel.py:82-231), and an ADD sent to an
engine that is not connected is dropped by the ROUTER socket (no ROUTER_MANDATORY)."""

from __future__ import annotations

import dataclasses

import pytest

from racesim.engine_model.events import EngineFault, EngineResume, IpcDropped
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario
from racesim.scenarios.loader import Scenario, scenario_from_dict
from racesim.sim.errors import InputError


def _engine(scen: Scenario, **changes: object) -> Scenario:
    w = scen.workload
    return dataclasses.replace(scen, workload=dataclasses.replace(
        w, engine=dataclasses.replace(w.engine, **changes)))


def _finishes(result: object) -> list[str | None]:
    return [r.finish_reason for r in result.requests]  # type: ignore[attr-defined]


def test_with_fault_tolerance_the_engine_resumes_empty_and_the_duplicate_hangs() -> None:
    r = run_scenario(load_scenario("fault-tolerant-duplicate"), "buggy")
    assert "engine-alive" not in r.violated
    assert "no-hang" in r.violated
    # X's stream ended by the duplicate; Y aborted by on_fault; the second X never added;
    # Z, sent after the retry, served
    assert _finishes(r) == ["stream_finished", "abort", None, "length"]
    kinds = [type(ev.detail) for ev in r.trace if isinstance(ev.detail, (EngineFault,
                                                                          EngineResume))]
    assert kinds == [EngineFault, EngineResume]


def test_without_fault_tolerance_the_same_assert_kills_the_engine() -> None:
    scen = _engine(load_scenario("fault-tolerant-duplicate"), fault_tolerance=None,
                   ft_retry_after=None)
    r = run_scenario(scen, "buggy")
    assert "engine-alive" in r.violated
    assert _finishes(r)[3] == "error"  # Z: EngineDeadError


def test_no_retry_within_the_recovery_timeout_and_the_engine_dies() -> None:
    scen = _engine(load_scenario("fault-tolerant-duplicate"), ft_retry_after=None)
    scen = dataclasses.replace(scen, workload=dataclasses.replace(scen.workload,
                                                                  horizon=200.0))
    r = run_scenario(scen, "buggy")
    death = next(v for v in r.violations if v.invariant == "engine-alive")
    assert 120.0 < death.time < 121.0  # engine_recovery_timeout_sec
    assert _finishes(r)[3] == "error"


def test_a_same_id_request_after_the_resume_is_not_taken_for_a_live_duplicate() -> None:
    # the discarded batches in flight no longer count X as live (async scheduling, 0.33)
    scen = load_scenario("fault-tolerant-duplicate")
    w = scen.workload
    z = dataclasses.replace(w.requests[3], id="X")
    scen = dataclasses.replace(scen, workload=dataclasses.replace(
        w, requests=(*w.requests[:3], z)))
    r = run_scenario(scen, "buggy")
    assert "unique-live-id" not in r.violated
    assert _finishes(r)[3] == "length"


def test_unique_internal_ids_never_fault() -> None:
    r = run_scenario(load_scenario("fault-tolerant-duplicate"), "internal-id")
    assert r.violations == ()


def test_an_add_before_the_engine_connects_is_dropped_and_its_client_hangs() -> None:
    scen = load_scenario("dropped-add")
    r = run_scenario(scen, "internal-id")
    assert r.violated == ("no-hang",)
    assert _finishes(r) == [None, "length"]
    dropped = [ev.detail for ev in r.trace if isinstance(ev.detail, IpcDropped)]
    assert [d.type for d in dropped] == ["EngineCoreRequest"]
    connected = run_scenario(_engine(scen, connect_at=None), "internal-id")
    assert connected.violations == ()


def _base(**engine: object) -> dict[str, object]:
    return {"name": "t", "engine": {"vllm": "0.33", **engine},
            "request": [{"id": "X", "max_tokens": 4}]}


def test_fault_tolerance_keys_are_checked() -> None:
    with pytest.raises(InputError, match=r"needs engine\.fault_tolerance"):
        scenario_from_dict(_base(ft_retry_after=1.0))
    with pytest.raises(InputError, match="frontends = 1"):
        scenario_from_dict({**_base(fault_tolerance=True), "frontends": 2})
    scen = scenario_from_dict(_base(fault_tolerance=True))
    with pytest.raises(InputError, match=r"fault_tolerance is modelled on vLLM 0\.33"):
        run_scenario(scen.with_vllm("0.8"), "buggy")
