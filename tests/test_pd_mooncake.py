"""MooncakeConnector in the model: P and D paired by the router's transfer_id (vLLM 0.33
mooncake/mooncake_connector.py; docs/pd-connectors.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from racesim.engine_model import RunResult
from racesim.engine_model.kv_mooncake import MooncakeSender
from racesim.engine_model.messages import KVPullRequest
from racesim.runner import run_scenario
from racesim.scenarios import Scenario, load_scenario
from racesim.sim.errors import InputError
from racesim.sim.world import World


def _invariants(result: RunResult) -> dict[str, str]:
    reach = result.reach().reach
    return {v.invariant: reach for v in result.violations}


def _kinds(result: RunResult, kind: str) -> list[object]:
    return [e for e in result.trace if e.kind == kind]


def _with_requests(scenario: Scenario, **changes: object) -> Scenario:
    reqs = tuple(replace(r, **changes) for r in scenario.workload.requests)  # type: ignore[arg-type]
    return replace(scenario, workload=replace(scenario.workload, requests=reqs))


# -- the bundled scenarios -------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["buggy", "internal-id"])
def test_the_shipped_proxy_pairs_each_decode_leg_with_its_own_prefill(policy: str) -> None:
    """xfer-<uuid4>: two clients under one ID never share a transfer_id."""
    result = run_scenario(load_scenario("pd-mooncake"), policy)
    assert _invariants(result) == {}
    writes = _kinds(result, "pd.push_write")
    assert [w.detail.matched for w in writes] == ["transfer_id"] * 2  # type: ignore[attr-defined]
    # each write goes to the decode leg of the client whose prefill it is
    owner = {e.inc: e.detail.uid for e in result.trace if e.kind == "fe.add"}  # type: ignore[attr-defined]
    assert all(owner[w.inc] == owner[w.detail.dest_inc] for w in writes)  # type: ignore[attr-defined]
    assert [e.detail.cause for e in _kinds(result, "pd.release")] == ["pushed"] * 2  # type: ignore[attr-defined]
    assert not _kinds(result, "pd.heartbeat")  # Mooncake has no lease


def test_a_shared_transfer_id_gives_both_decode_legs_one_prefill_and_strands_the_other() -> None:
    """Both decode legs wait on one entry; the first LENGTH_CAPPED finish readies it and both
    are written its blocks (:1662-1710); the first write pops the entry, so the second prefill's
    record raises KeyError (:2694) and its blocks are never freed."""
    result = run_scenario(load_scenario("pd-mooncake-collision"), "internal-id")
    assert _invariants(result) == {"no-crosstalk": "live", "no-leak": "live"}
    writes = _kinds(result, "pd.push_write")
    assert len(writes) == 2 and writes[0].inc == writes[1].inc  # type: ignore[attr-defined]
    assert len({w.detail.dest_inc for w in writes}) == 2  # type: ignore[attr-defined]
    lost = _kinds(result, "pd.hold_lost")
    assert [(e.detail.transfer_id, e.detail.error) for e in lost] == [  # type: ignore[attr-defined]
        ("xfer-X", "KeyError: 'xfer-X'")]
    assert lost[0].inc != writes[0].inc  # type: ignore[attr-defined]


def test_a_shared_transfer_id_with_equal_request_ids_kills_the_prefill_engine_first() -> None:
    result = run_scenario(load_scenario("pd-mooncake-collision"), "buggy")
    assert "engine-alive" in _invariants(result)


def test_a_prefill_that_stops_on_eos_is_not_held_and_its_decode_leg_fails_after_480_s() -> None:
    """Only LENGTH_CAPPED is held (:1206-1210): a STOPPED prefill pops its entry, D's pull
    waits on an entry that will never be ready, and P answers with err_reqs after
    VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (:1669-1690): a failed load, an ERROR on D."""
    scenario = load_scenario("pd-mooncake")
    scenario = _with_requests(scenario, eos_at=1)
    scenario = replace(scenario, workload=replace(scenario.workload, horizon=600.0))
    result = run_scenario(scenario, "internal-id")
    assert [o.finish_reason for o in result.requests] == ["error", "error"]
    failed = _kinds(result, "pd.load_failed")
    assert len(failed) == 2 and all(479.0 < e.time < 481.0 for e in failed)  # type: ignore[attr-defined]
    assert not _kinds(result, "pd.push_write") and not _kinds(result, "pd.hold")


def test_mooncake_is_refused_on_0_8() -> None:
    with pytest.raises(InputError, match=r"0\.33 only"):
        run_scenario(load_scenario("pd-mooncake").with_vllm("0.8"), "buggy")


# -- the sender table ------------------------------------------------------------------------

def _sender(world: World, replies: list[tuple[str, bool]]) -> MooncakeSender:
    return MooncakeSender(world, "prefill.connector", 480.0, 0.002, lambda: False,
                          lambda msg, ok: replies.append((msg.request_id, ok)), lambda: None)


def test_a_finish_with_no_entry_loses_its_hold_and_the_rest_of_the_batch() -> None:
    """record_send_reqs raises KeyError at the first finished request whose transfer_id has no
    entry; the rest of that batch is never recorded (:2690-2716)."""
    world = World(0)
    s = _sender(world, [])
    s.finished_held("A", "t1", (1, 2), 1)
    s.finished_held("B", "t2", (3, 4), 2)
    s.flush()
    assert s.table == {}
    assert [(e.request, e.detail.transfer_id) for e in world.trace.events  # type: ignore[attr-defined]
            if e.kind == "pd.hold_lost"] == [("A", "t1"), ("B", "t2")]


def test_an_allocation_creates_the_entry_once_and_a_finish_fills_it() -> None:
    world = World(0)
    s = _sender(world, [])
    s.after_alloc("A", "t", 1)
    s.flush()
    s.after_alloc("B", "t", 2)  # an entry exists: B's allocation changes nothing
    s.flush()
    assert s.table["t"].owner == "A" and not s.table["t"].ready.triggered
    s.finished_held("B", "t", (5, 6), 2)
    s.flush()
    entry = s.table["t"]
    assert (entry.owner, entry.blocks, entry.expiry) == ("B", (5, 6), 480.0)
    assert entry.ready.triggered


def test_not_processed_pops_a_ready_entry_and_its_owner_is_lost() -> None:
    """``assert not send_meta.ready.is_set()`` fails after the pop: the other request's
    finished blocks are out of the table and nothing will free them."""
    world = World(0)
    s = _sender(world, [])
    s.after_alloc("A", "t", 1)
    s.flush()  # the schedule that allocated A hands its metadata over at once
    s.finished_held("A", "t", (5, 6), 1)
    s.flush()
    s.not_processed("t")  # B, same transfer_id, stopped on EOS
    s.flush()
    assert s.table == {} and s.next_expiry() is None
    lost = [e for e in world.trace.events if e.kind == "pd.hold_lost"]
    assert [(e.request, e.detail.error) for e in lost] == [  # type: ignore[attr-defined]
        ("A", "AssertionError: ready")]


def test_an_unsent_entry_expires_480_s_after_its_finish_and_a_late_pull_fails() -> None:
    world = World(0)
    replies: list[tuple[str, bool]] = []
    s = _sender(world, replies)
    s.after_alloc("A", "t", 1)
    s.flush()  # the schedule that allocated A hands its metadata over at once
    s.finished_held("A", "t", (5, 6), 1)
    s.flush()
    world.env.run(until=479.0)
    s.expire()
    assert s.take_finished() == []
    world.env.run(until=480.0)
    s.expire()
    assert s.take_finished() == [("A", "timeout")] and s.table == {}
    s.pull(KVPullRequest("D1", "t", 1, (9, 10), 3))  # an empty entry now, never ready
    world.env.run(until=960.5)
    assert replies == [("D1", False)]
