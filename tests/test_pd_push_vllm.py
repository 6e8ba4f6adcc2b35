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


def _not_posted() -> Scenario:
    return load_scenario("48633-push-write-not-posted")


def test_a_write_that_cannot_be_posted_runs_vllms_own_failure_path(
        monkeypatch: pytest.MonkeyPatch, vllm_systems: list[Any]) -> None:
    """#48633 C2: the fake agent's ``transfer`` raises for X's WRITE; vLLM's own ``_xfer_blocks``
    logs transfer_setup_failed, adds P's ID to ``_send_failures`` and releases the handle
    (push_worker.py:746-765), and nothing ever reports the WRITE done."""
    import importlib

    cls = importlib.import_module(
        "vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker").NixlPushConnectorWorker
    logged: list[tuple[str, str | None]] = []
    handled: list[tuple[str, bool]] = []
    real_log, real_handle = cls._log_failure, cls._handle_failed_transfer

    def _log_failure(self: Any, failure_type: str, req_id: str | None, *a: Any,
                     **kw: Any) -> None:
        logged.append((failure_type, req_id))
        real_log(self, failure_type, req_id, *a, **kw)

    def _handle_failed_transfer(self: Any, req_id: str, handle: Any, *a: Any, **kw: Any) -> Any:
        handled.append((req_id, req_id in self._send_failures))
        return real_handle(self, req_id, handle, *a, **kw)

    monkeypatch.setattr(cls, "_log_failure", _log_failure)
    monkeypatch.setattr(cls, "_handle_failed_transfer", _handle_failed_transfer)
    result = run_scenario(_not_posted(), "internal-id", engine="vllm")
    (failed,) = [e for e in result.trace if e.kind == "pd.push_not_posted"]
    assert logged == [("transfer_setup_failed", failed.request)]
    assert handled == [(failed.request, True)]
    prefill = vllm_systems[0].engines[0].transport.worker
    assert not prefill.nixl_wrapper.handles  # the handle was released, none is in flight
    assert failed.request not in prefill._sending_transfers


@pytest.mark.parametrize("engine", ["model", "vllm"])
def test_a_write_not_posted_leaves_d_waiting(engine: str) -> None:
    """No notification reaches D: X waits with its blocks held to the horizon (no-hang), while P
    frees X's blocks when its lease runs out (30 s; D's heartbeats name the proxy's ID, #53095);
    Y beside it is written and decodes."""
    result = run_scenario(_not_posted(), "internal-id", engine=engine)
    assert _invariants(result) == {"no-hang": "live"}
    assert [(q.tokens, q.finish_reason) for q in result.requests] == [(0, None), (8, "length")]
    assert [e.request[:1] for e in result.trace if e.kind == "pd.push_write"] == ["Y"]
    released = [(e.request[:1], round(e.time)) for e in result.trace if e.kind == "pd.release"]
    assert released == [("Y", 0), ("X", 30)]
    d_x = [e for e in result.trace if e.component == "decode.kv" and e.request.startswith("X")]
    assert [e.kind for e in d_x] == ["kv.alloc"]  # allocated, never freed
