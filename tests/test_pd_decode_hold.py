"""Decode-side holds for bidirectional KV transfer (NIXL pull mode, vLLM 0.33
nixl/pull_scheduler.py:232-269): when they apply and what ends them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from racesim.engine_model import RunResult, load_policy, run_workload
from racesim.engine_model.config import PDConfig, RequestSpec, Workload
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario
from racesim.sim.errors import InputError


def _invariants(result: RunResult) -> dict[str, str]:
    reach = result.reach().reach
    return {v.invariant: reach for v in result.violations}


def _one(bidirectional: bool, **request: object) -> RunResult:
    """One client request through the P/D proxy; D's TTL is 100 s."""
    spec = RequestSpec("X", at=0.0, prompt_tokens=32, max_tokens=8, **request)  # type: ignore[arg-type]
    workload = Workload(topology="pd", horizon=600.0, requests=(spec,),
                        pd=PDConfig(bidirectional_kv_xfer=bidirectional,
                                    decoder_kv_blocks_ttl=100.0))
    return run_workload(workload, load_policy("internal-id"), seed=0)


def _decode(result: RunResult, kind: str) -> list[object]:
    return [e for e in result.trace if e.kind == kind and e.component.startswith("decode")]


@pytest.mark.parametrize(("request_kw", "status"), [
    ({}, "FINISHED_LENGTH_CAPPED"), ({"eos_at": 3}, "FINISHED_STOPPED")])
def test_decode_keeps_a_finished_request_for_its_ttl_then_frees_it(
        request_kw: dict[str, object], status: str) -> None:
    result = _one(True, **request_kw)
    assert _invariants(result) == {}
    (hold,) = _decode(result, "pd.hold")
    (finish,) = [e for e in _decode(result, "sched.finish")]
    assert finish.detail.status == status  # type: ignore[attr-defined]
    assert hold.detail.expiry == pytest.approx(finish.time + 100.0)  # type: ignore[attr-defined]
    (release,) = _decode(result, "pd.release")
    assert release.detail.cause == "timeout"  # type: ignore[attr-defined]
    assert release.time == pytest.approx(hold.detail.expiry, abs=0.02)  # type: ignore[attr-defined]
    # no lease: D's hold is never extended, and nothing heartbeats it
    assert not [e for e in result.trace if e.kind == "pd.heartbeat"
                and finish.request in e.detail.ids]  # type: ignore[attr-defined]


def test_without_bidirectional_transfer_decode_frees_at_once() -> None:
    result = _one(False)
    assert not _decode(result, "pd.hold") and not _decode(result, "pd.release")


def test_an_aborted_decode_request_is_not_kept() -> None:
    result = _one(True, abort_at=0.05)
    assert [o.finish_reason for o in result.requests] == ["abort"]
    assert not _decode(result, "pd.hold")


def test_a_same_id_retry_during_the_decode_hold_kills_the_decode_engine() -> None:
    """pd-decode-hold-reuse: with equal internal IDs D still holds X one second later."""
    scenario = load_scenario("pd-decode-hold-reuse")
    assert _invariants(run_scenario(scenario, "buggy")) == {"engine-alive": "live"}
    assert _invariants(run_scenario(scenario, "internal-id")) == {}
    off = replace(scenario.workload, pd=replace(scenario.workload.pd,
                                                bidirectional_kv_xfer=False))
    assert _invariants(run_scenario(replace(scenario, workload=off), "buggy")) == {}


@pytest.mark.parametrize(("connector", "vllm", "message"), [
    ("nixl-push", "0.33", "needs pd.connector = 'nixl-pull'"),
    ("mooncake", "0.33", "needs pd.connector = 'nixl-pull'"),
    ("nixl-pull", "0.8", r"0\.33 only")])
def test_bidirectional_transfer_is_refused_where_vllm_has_none(
        connector: str, vllm: str, message: str) -> None:
    scenario = load_scenario("pd-decode-hold-reuse")
    pd = replace(scenario.workload.pd, connector=connector)
    scenario = replace(scenario, workload=replace(scenario.workload, pd=pd)).with_vllm(vllm)
    with pytest.raises(InputError, match=message):
        run_scenario(scenario, "buggy")
