"""P/D on the vllm backend: vLLM 0.33's own NixlConnector scheduler side, inside vLLM's own
Scheduler on both engines, with the NIXL transport simulated (racesim.engine_vllm.connectors.nixl).

These tests need vLLM 0.33 (``scripts/install-vllm-cpu``): skipped locally without it, a failure
under CI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _hash_seeds import hashes_per_seed

from racesim.conform import conform
from racesim.runner.engines import cannot_run
from racesim.runner import run_scenario
from racesim.scenarios import Scenario, bundled_names, load_scenario, scenario_from_dict

pytestmark = pytest.mark.vllm

#: the P/D scenarios the vllm backend runs (all of them on 0.33, Mooncake's included:
#: test_mooncake_vllm.py)
PD_SCENARIOS = tuple(n for n in bundled_names() if load_scenario(n).workload.topology == "pd"
                     and not cannot_run(load_scenario(n).workload, "vllm"))


def _pd(requests: list[dict[str, Any]], horizon: float = 60.0, **engine: Any) -> Scenario:
    return scenario_from_dict({"name": "pd", "topology": "pd", "horizon": horizon,
                               "engine": {"vllm": "0.33", **engine}, "request": requests})


def _x(**more: Any) -> dict[str, Any]:
    return {"id": "X", "prompt_tokens": 32, "max_tokens": 5, **more}


def _kinds(r: Any, kind: str, component: str = "") -> list[Any]:
    return [e for e in r.trace if e.kind == kind and e.component.startswith(component)]


def test_both_engines_run_vllms_own_nixl_connector(vllm_systems: list[Any]) -> None:
    """The prefill engine holds X's blocks by vLLM's own request_finished and frees them when
    the decode side's notice comes back through vLLM's own _get_new_notifs."""
    seen = vllm_systems
    r = run_scenario(load_scenario("pd-reuse"), "internal-id", engine="vllm")
    assert r.engine == "vllm" and r.violated == ()
    assert [(q.tokens, q.finish_reason) for q in r.requests] == [(20, "length")] * 2
    (system,) = seen
    for engine, role in zip(system.engines, ("kv_producer", "kv_consumer"), strict=True):
        connector = engine.sched.connector
        assert type(connector).__name__ == "NixlPullConnector"
        assert type(connector.connector_scheduler).__name__ == "NixlPullConnectorScheduler"
        assert engine.sched.vllm_config.kv_transfer_config.kv_role == role
        assert type(engine.transport.worker).__name__ == "NixlPullConnectorWorker"
        assert not engine.sched.requests  # everything released
    holds = _kinds(r, "pd.hold", "prefill")
    releases = _kinds(r, "pd.release", "prefill")
    assert len(holds) == 2 and [e.detail.cause for e in releases] == ["notify", "notify"]
    assert holds[0].detail.expiry == pytest.approx(holds[0].time + 30.0)  # the 30 s lease
    assert len(_kinds(r, "pd.read", "decode")) == 2


@pytest.mark.parametrize("name", PD_SCENARIOS)
def test_pd_scenarios_conform_on_033(name: str, tmp_path: Path) -> None:
    """Random schedules drawn on the model agree on vLLM's own code: outcomes, invariants
    and their reach, engine death."""
    scen = load_scenario(name).with_vllm("0.33")
    res = conform([scen], [("buggy", {}), ("internal-id", {})], budget=12, workers=1,
                  out_dir=tmp_path)
    violating = sum(c["violating_runs"] for c in res.cells)
    # pd-mooncake is safe under every schedule: its proxy makes each transfer_id unique
    assert res.runs == 24 and (violating == 0 if name == "pd-mooncake" else violating > 0)
    assert [m.document() for m in res.unlisted] == []


def test_a_lease_expires_on_vllms_own_worker_bookkeeping() -> None:
    """A failed read: no notice reaches P, whose lease is reaped by vLLM's own
    _reap_expired_send_leases at the simulated 30 s; D finishes X with ERROR (policy fail)."""
    r = run_scenario(_pd([_x(kv_load_fails=True)]), "internal-id", engine="vllm")
    assert [(q.tokens, q.finish_reason) for q in r.requests] == [(0, "error")]
    (release,) = _kinds(r, "pd.release", "prefill")
    assert release.detail.cause == "timeout" and release.time == pytest.approx(30.0, abs=0.1)
    assert r.violated == ("stranded-hold",)


def test_heartbeats_renew_the_lease_through_a_slow_read() -> None:
    """A 100 s read: D's scheduler packages heartbeats every 5 s (base_scheduler.py:513-518),
    P's worker extends the lease by 20 s each (base_worker.py:3380-3397): the blocks go only
    when the read's notice comes, as on the model."""
    slow = [("pd.kv:read", 0, 100.0)]
    r = run_scenario(_pd([_x()], 200.0), "internal-id", engine="vllm", delays=slow)
    m = run_scenario(_pd([_x()], 200.0), "internal-id", delays=slow)
    assert r.violated == m.violated == ()
    assert [e.detail.cause for e in _kinds(r, "pd.release", "prefill")] == ["notify"]
    # (the model counts a heartbeat due within 1 ns of the interval; vLLM's float comparison
    # may skip the last one by a hair, so the counts may differ by one)
    assert abs(len(_kinds(r, "pd.heartbeat")) - len(_kinds(m, "pd.heartbeat"))) <= 1
    assert len(_kinds(r, "pd.heartbeat")) >= 19


def test_an_abort_in_the_decode_queue_notifies_p_on_vllm() -> None:
    """#19223 as fixed in 0.33: X waits in D's queue behind Y and is aborted there; vLLM's own
    request_finished queues a read with no blocks (pull_scheduler.py:219-230), so P is
    notified and nothing is stranded."""
    scen = _pd([{"id": "Y", "prompt_tokens": 32, "max_tokens": 200},
                _x(at=0.001, abort_at=0.5)], max_num_seqs=1)
    r = run_scenario(scen, "internal-id", engine="vllm")
    m = run_scenario(scen, "internal-id")
    assert "stranded-hold" not in r.violated and r.violated == m.violated
    assert [e.detail.cause for e in _kinds(r, "pd.release", "prefill")] == ["notify"] * 2


def test_an_abort_during_the_read_keeps_decode_blocks_on_vllm() -> None:
    """#32255 as fixed in 0.33: D's finish_requests keeps the blocks of X aborted while its read
    is in flight (scheduler.py:3017-3025) until finished_recving: kv-destination holds."""
    slow = [("pd.kv:read", 0, 0.2)]
    r = run_scenario(_pd([_x(abort_at=0.03)]), "internal-id", engine="vllm", delays=slow)
    assert "kv-destination" not in r.violated
    (release,) = _kinds(r, "pd.release", "decode")
    assert release.detail.cause == "recv-done" and release.time > 0.2
    read = _kinds(r, "pd.read", "decode")[0]
    frees = [e for e in _kinds(r, "kv.free", "decode") if e.inc == read.inc]
    assert frees and frees[0].time >= read.time


def test_a_pd_run_hashes_alike_in_two_processes_under_two_hash_seeds() -> None:
    """The connector keeps request IDs in sets of strings (_reqs_in_batch, heartbeat req_ids,
    finished_sending); the transport orders what it reads and reports."""
    witnessed = [n for n in PD_SCENARIOS if load_scenario(n).has_witness]
    outs = hashes_per_seed(witnessed, ("buggy", "internal-id"), ("0", "31337"))
    assert outs[0] == outs[1] and outs[0].startswith("['")
    here = run_scenario(load_scenario("pd-reuse"), "buggy", witness=True, engine="vllm")
    assert here.trace_hash in outs[0]


def _hold_reuse(**pd: Any) -> Scenario:
    """pd-decode-hold-reuse's deployment: X, then X again 1 s later, the client's ID on both
    legs; ``pd`` overrides its ``[pd]`` keys."""
    if not pd:
        return load_scenario("pd-decode-hold-reuse").with_vllm("0.33")
    return scenario_from_dict({"name": "hold", "topology": "pd", "horizon": 60.0,
                               "engine": {"vllm": "0.33", "max_num_seqs": 16},
                               "pd": {"proxy": "http", "proxy_ids": "client",
                                      "transfer_time": 0.002, "bidirectional_kv_xfer": True,
                                      **pd},
                               "request": [_x(max_tokens=8), _x(at=1.0, max_tokens=8)]})


def test_a_decode_side_hold_is_vllms_own_bidirectional_kv_xfer(
        vllm_systems: list[Any]) -> None:
    """bidirectional_kv_xfer in both engines' kv_connector_extra_config: D's own
    request_finished keeps X for decoder_kv_blocks_ttl (pull_scheduler.py:232-269), and the
    second X dies of D's own duplicate-ID assert; with random suffixes nothing happens."""
    seen = vllm_systems
    r = run_scenario(_hold_reuse(), "buggy", engine="vllm")
    assert r.violated == ("engine-alive",)
    assert [q.finish_reason for q in r.requests] == ["length", "error"]
    assert r.violations[0].where == "v1/core/sched/scheduler.py:2936"
    decode = seen[0].engines[1].sched.connector.connector_scheduler
    assert decode.is_bidirectional_kv_xfer_enabled and decode.decoder_kv_blocks_ttl == 480
    (hold,) = _kinds(r, "pd.hold", "decode")
    assert hold.detail.expiry == pytest.approx(hold.time + 480.0)
    ok = run_scenario(_hold_reuse(), "internal-id", engine="vllm")
    assert ok.violated == () and len(_kinds(ok, "pd.hold", "decode")) == 2
    # both X-<suffix> still held at the end: in D's Scheduler and its worker's _reqs_to_send
    d = seen[-1].engines[1]
    assert sorted(d.transport.worker._reqs_to_send) == sorted(d.sched.requests)
    assert len(d.sched.requests) == 2


@pytest.mark.parametrize(("pd", "releases"), [
    ({"decoder_kv_blocks_ttl": 0.5}, 2),  # vLLM's own _reap_expired_send_leases frees X first
    ({"bidirectional_kv_xfer": False}, 0),  # D frees X at once: no hold
])
def test_decode_holds_end_or_never_start_as_on_the_model(pd: dict[str, Any],
                                                         releases: int) -> None:
    """A short decoder_kv_blocks_ttl ends each decode hold by timeout before the next X, at the
    model's times; with bidirectional transfer off D holds nothing."""
    r = run_scenario(_hold_reuse(**pd), "buggy", engine="vllm")
    m = run_scenario(_hold_reuse(**pd), "buggy")
    assert r.violated == m.violated == ()
    got = [(e.detail.cause, round(e.time, 4)) for e in _kinds(r, "pd.release", "decode")]
    assert got == [(e.detail.cause, round(e.time, 4)) for e in _kinds(m, "pd.release", "decode")]
    assert [c for c, _t in got] == ["timeout"] * releases
