"""NIXL push mode on the vllm backend: vLLM 0.33.0's own push scheduler and push worker (its
writer loop run as a World task), NIXL's registration and RDMA WRITE simulated
(engine_vllm/connectors/push.py; docs/pd-connectors.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from racesim.explore import explore
from racesim.runner import run_scenario
from racesim.scenarios import Scenario, load_scenario

pytestmark = pytest.mark.vllm


def _invariants(result: Any) -> dict[str, str]:
    reach = result.reach().reach
    return {v.invariant: reach for v in result.violations}


def _pairing(**pd: Any) -> Scenario:
    s = load_scenario("pd-push-pairing")
    return replace(s, workload=replace(s.workload, pd=replace(s.workload.pd, **pd)))


def test_push_pairing_runs_vllms_own_push_connector(vllm_systems: list[Any]) -> None:
    """Both engines build vLLM's NixlPushConnector; P's WRITE pairs X's legs crosswise by the
    base ID (the witness: the first client's proxy is slow between its stages)."""
    seen = vllm_systems
    result = run_scenario(load_scenario("pd-push-pairing"), "internal-id", engine="vllm",
                          witness=True)
    assert _invariants(result) == {"no-crosstalk": "live"}
    writes = [e for e in result.trace if e.kind == "pd.push_write"]
    assert [(e.detail.matched, e.inc != e.detail.dest_inc) for e in writes] == [
        ("base", True), ("base", True)]
    assert [(q.tokens, q.finish_reason) for q in result.requests] == [(8, "length")] * 2
    (system,) = seen
    for engine in system.engines:
        assert type(engine.sched.connector).__name__ == "NixlPushConnector"
        assert type(engine.transport.worker).__name__ == "NixlPushConnectorWorker"


def test_push_pairing_is_found_with_no_hint_on_vllms_code(tmp_path: Path) -> None:
    report = explore(load_scenario("pd-push-pairing"), "internal-id", budget=40, seed=0,
                     reach="live", skip=("metrics-exact",), engine="vllm", out_dir=tmp_path)
    assert report.counterexample is not None and report.found_run is not None
    assert "no-crosstalk" in {v["invariant"] for v in report.counterexample.violations}


def test_a_per_request_proxy_id_is_clean() -> None:
    assert _invariants(run_scenario(_pairing(proxy_ids="uuid"), "internal-id", engine="vllm",
                                    witness=True)) == {}


def test_unequal_block_counts_assert_in_the_writer_and_d_waits() -> None:
    """D registered more blocks than P holds: base_worker.py:3791 asserts inside vLLM's own
    writer pass, its handler logs it, the pair is never written and that D request hangs."""
    s = load_scenario("pd-push-pairing")
    reqs = s.workload.requests
    s = replace(s, workload=replace(s.workload, requests=(
        reqs[0], replace(reqs[1], prompt_tokens=48))))
    result = run_scenario(s, "internal-id", engine="vllm", witness=True)
    failed = [e for e in result.trace if e.kind == "pd.push_failed"]
    assert len(failed) == 1 and failed[0].detail.dest_blocks > failed[0].detail.blocks
    assert {"no-hang", "no-crosstalk"} <= set(_invariants(result))
    assert (0, None) in [(q.tokens, q.finish_reason) for q in result.requests]


@pytest.mark.parametrize("engine", ["model", "vllm"])
def test_completions_against_chat_never_pairs(engine: str) -> None:
    """cmpl-X-0-<a> against chatcmpl-X-<b>: no base ID matches, nothing is written."""
    result = run_scenario(load_scenario("pd-push-endpoints"), "internal-id", engine=engine)
    assert "no-hang" in _invariants(result)
    assert not [e for e in result.trace if e.kind == "pd.push_write"]
    assert [q.finish_reason for q in result.requests] == [None]


def test_a_prefill_output_delivered_by_id_names_its_producer() -> None:
    """conform's pd-proxy-abort run 18 (buggy): client 1's aborted prefill X finishes anyway and
    P's OutputProcessor hands its output, kv_transfer_params included, to client 2's state
    registered under the same ID; client 2's decode then reads client 1's blocks. The vllm
    backend used to label those params with the receiving state's incarnation (kv-ownership);
    they are the producer's, so both backends report the crosstalk."""
    from racesim.documents import read_counterexample
    from racesim.runner import RunSpec

    cx = read_counterexample(str(Path(__file__).parent / "fixtures" /
                                 "pd-proxy-abort-buggy-run18.json"))
    found = {}
    for engine in ("model", "vllm"):
        spec = RunSpec(cx.scenario, cx.policy, tuple(cx.options.items()), cx.seed, cx.skip,
                       engine)
        found[engine] = {v.invariant for v in spec.run(schedule=cx.schedule).violations}
    assert found["model"] == found["vllm"] and "no-crosstalk" in found["vllm"]
    assert "kv-ownership" not in found["vllm"]
