"""P/D connectors and proxies in the model: NIXL push mode's pairing, the heartbeat's lease
extension, and the two ways a proxy aborts (docs/pd-connectors.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from racesim.engine_model import RunResult, load_policy, run_workload
from racesim.engine_model.config import PDConfig, RequestSpec, Workload
from racesim.engine_model.kv_cache import KVCacheManager
from racesim.engine_model.kv_connector import ConnectorScheduler
from racesim.engine_model.kv_push import PushMatcher, base_request_id
from racesim.engine_model.messages import KVPushRegistration
from racesim.engine_model.versions import get_profile
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario
from racesim.sim.errors import InputError
from racesim.sim.world import World


def _invariants(result: RunResult) -> dict[str, str]:
    """Each violated invariant, with the run's reach."""
    reach = result.reach().reach
    return {v.invariant: reach for v in result.violations}


# -- the pairing -----------------------------------------------------------------------------

def test_base_id_strips_one_random_suffix_only() -> None:
    assert base_request_id("X-0123abcd") == "X"
    assert base_request_id("cmpl-X-0-0123ABCD") == "cmpl-X-0"
    assert base_request_id("X-deadbeef-0123abcd") == "X-deadbeef"
    assert base_request_id("X-12345") == "X-12345"


def test_a_registration_takes_the_first_finished_request_with_its_base_id() -> None:
    got: list[tuple[str, str, str]] = []
    m = PushMatcher(lambda x: got.append((x.request_id, x.registration.request_id, x.how)))
    m.add_finished("X-aaaaaaaa", (10, 11), 1)
    m.add_finished("X-bbbbbbbb", (12, 13), 2)
    m.add_registration(KVPushRegistration("X-dddddddd", 1, (42, 43), 4))
    m.add_registration(KVPushRegistration("X-cccccccc", 1, (40, 41), 3))
    assert got == [("X-aaaaaaaa", "X-dddddddd", "base"), ("X-bbbbbbbb", "X-cccccccc", "base")]
    assert not m.finished and not m.pending


def test_an_exact_id_wins_over_an_earlier_base_match() -> None:
    got: list[str] = []
    m = PushMatcher(lambda x: got.append(x.request_id))
    m.add_registration(KVPushRegistration("X-aaaaaaaa", 1, (1,), 7))
    m.add_registration(KVPushRegistration("X", 1, (2,), 8))
    m.add_finished("X", (3,), 9)
    assert got == ["X"] and list(m.pending) == ["X-aaaaaaaa"]
    m.evict("X-aaaaaaaa")  # P's lease ran out under that ID: nothing is left behind
    assert not m.pending


def test_push_pairing_is_live_crosstalk_under_internal_ids() -> None:
    scenario = load_scenario("pd-push-pairing")
    assert _invariants(run_scenario(scenario, "internal-id")) == {}
    result = run_scenario(scenario, "internal-id", witness=True)
    assert _invariants(result) == {"no-crosstalk": "live"}
    writes = [e for e in result.trace if e.kind == "pd.push_write"]
    assert [(e.detail.matched, e.inc != e.detail.dest_inc) for e in writes] == [
        ("base", True), ("base", True)]


def test_push_pairing_with_equal_ids_kills_the_prefill_engine_first() -> None:
    assert "engine-alive" in _invariants(run_scenario(load_scenario("pd-push-pairing"), "buggy"))


def test_a_decode_registration_larger_than_the_prefill_blocks_is_never_written() -> None:
    """base_worker.py:3791's assert, swallowed by the writer: nothing is written, the decode
    request waits for a WRITE that never comes."""
    scenario = load_scenario("pd-push-pairing")
    reqs = scenario.workload.requests
    longer = replace(reqs[1], prompt_tokens=48)
    scenario = replace(scenario, workload=replace(scenario.workload, requests=(reqs[0], longer)))
    result = run_scenario(scenario, "internal-id", witness=True)
    failed = [e for e in result.trace if e.kind == "pd.push_failed"]
    assert len(failed) == 1 and failed[0].detail.dest_blocks > failed[0].detail.blocks
    assert "no-hang" in _invariants(result)


def test_push_mode_with_one_request_per_id_pairs_correctly() -> None:
    scenario = load_scenario("pd-push-pairing")
    reqs = scenario.workload.requests
    other = replace(reqs[1], id="Y")
    scenario = replace(scenario, workload=replace(scenario.workload, requests=(reqs[0], other)))
    result = run_scenario(scenario, "internal-id", witness=True)
    assert _invariants(result) == {}
    assert [e.detail.matched for e in result.trace if e.kind == "pd.push_write"] == ["base"] * 2


@pytest.mark.parametrize("key", [{"connector": "nixl-push"}, {"proxy": "http"}])
def test_push_mode_and_the_http_proxy_are_refused_on_0_8(key: dict[str, str]) -> None:
    scenario = load_scenario("pd-reuse")
    workload = replace(scenario.workload, pd=replace(scenario.workload.pd, **key))
    with pytest.raises(InputError, match=r"0\.33 only"):
        run_scenario(replace(scenario, workload=workload).with_vllm("0.8"), "buggy")


# -- leases ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("lease", "extension"), [(30.0, 20.0), (45.0, 30.0), (10.0, 6.0)])
def test_a_heartbeat_extends_the_hold_to_now_plus_lease_times_2_over_3(
        lease: float, extension: float) -> None:
    """nixl/base_worker.py:631 (``kv_lease_duration * 2 // 3``), 3388-3392 (max with the old
    expiry): 20 s at the default 30 s lease."""
    world = World(0)
    kv = KVCacheManager(world, "kv", 8, 16, False, "append")
    c = ConnectorScheduler(world, "connector", 0, kv, lease, lambda r: None, get_profile("0.33"))
    c.reqs_need_send["X"] = 1.0
    c.reqs_need_send["Y"] = 1000.0
    world.env.run(until=5.0)
    c.extend_lease(("X", "Y", "Z"))
    assert c.reqs_need_send == {"X": 5.0 + extension, "Y": 1000.0}


# -- proxies ---------------------------------------------------------------------------------

def _two_clients_abort_one(proxy: str) -> RunResult:
    """Two clients send X through the proxy; the first aborts during its prefill."""
    workload = Workload(
        topology="pd", horizon=30.0, pd=PDConfig(proxy=proxy),
        requests=(RequestSpec("X", at=0.0, prompt_tokens=512, max_tokens=8, abort_at=0.004),
                  RequestSpec("X", at=0.001, prompt_tokens=512, max_tokens=8)))
    return run_workload(workload, load_policy("internal-id"), seed=0)


def test_an_engine_client_proxy_aborts_the_prefill_stage_by_external_id() -> None:
    """Its abort of X on P covers every P request under X: the second client's too."""
    result = _two_clients_abort_one("engine-client")
    finishes = [o.finish_reason for o in result.requests]
    assert finishes == ["abort", "abort"]


def test_an_http_proxy_can_only_end_its_own_prefill_request() -> None:
    result = _two_clients_abort_one("http")
    finishes = [o.finish_reason for o in result.requests]
    assert finishes == ["abort", "length"]
