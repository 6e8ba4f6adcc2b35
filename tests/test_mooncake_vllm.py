"""MooncakeConnector on vLLM 0.33.0's own code: the scenarios pd-mooncake and
pd-mooncake-collision in the World on the vllm backend (engine_vllm/connectors/mooncake.py), and
the pairing by transfer_id step by step (the answer in docs/pd-connectors.md).

The step-by-step tests below drive the connector outside a World:

P's requests go through vLLM's own ``MooncakeConnectorScheduler`` (``update_state_after_alloc``,
``request_finished``, ``build_connector_meta``), and the metadata it builds through the
worker's own sender-loop code: ``start_load_kv`` hands it to ``record_send_reqs`` on a real
asyncio loop in a thread, and ``fetch_finished_sending_reqs`` reports what P may free. What is
faked: the worker's constructor, which needs the ``mooncake`` package (a TransferEngine, RDMA
registration, a bootstrap server); the test makes the instance without it and gives it only the
attributes those methods read. ``send_kv_to_decode`` (D's pull and the write) needs the
transfer engine and sockets and is not run: where the model's collision needs the entry gone,
this test removes it by vLLM's own expiry, with ``VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT=0``.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from racesim.conform import conform
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario

pytestmark = pytest.mark.vllm

_BLOCK = 32  # vLLM's CPU attention backend needs a multiple of 32 (v1/worker/utils.py:554)
_XFER = "xfer-X"  # a router that derives the transfer_id from the client's X-Request-Id


class _Mooncake:
    """vLLM's Mooncake scheduler side for P, and P's worker with its sender loop running."""

    def __init__(self, vllm: Any, loop: asyncio.AbstractEventLoop) -> None:
        from vllm.config import KVTransferConfig
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as m
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.stats import (
            MooncakeKVConnectorStats,
        )

        from racesim.engine_vllm._vllm import VllmEngineShape, _config

        base_vc, spec = _config(VllmEngineShape(64, _BLOCK, 16, 2048, 256, False, True))
        vc = copy.copy(base_vc)
        vc.kv_transfer_config = KVTransferConfig(kv_connector="MooncakeConnector",
                                                 kv_role="kv_producer", engine_id="P")
        kvc = vllm.KVCacheConfig(num_blocks=65, kv_cache_tensors=[],
                                 kv_cache_groups=[vllm.KVCacheGroupSpec(["layer"], spec)])
        self.scheduler = m.MooncakeConnectorScheduler(vc, "P", kvc)
        worker = object.__new__(m.MooncakeConnectorWorker)
        # what start_load_kv, record_send_reqs and fetch_finished_sending_reqs read
        worker.is_kv_producer, worker.is_kv_consumer = True, False
        worker.sender_loop = loop
        worker.reqs_need_send = {}
        worker.finished_sending_reqs = set()
        worker.xfer_stats = MooncakeKVConnectorStats()
        worker.shutdown = lambda: None  # __del__ would close sockets it never opened
        self.worker = worker
        self.loop = loop

    def request(self, rid: str) -> Any:
        from racesim.engine_vllm._vllm import new_request

        req = new_request(rid, list(range(3, 3 + 2 * _BLOCK)), 1, 0, 0.0, _BLOCK, [])
        req.kv_transfer_params = {"do_remote_decode": True, "do_remote_prefill": False,
                                  "transfer_id": _XFER}
        return req

    def allocate(self, req: Any) -> None:
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks
        from vllm.v1.core.kv_cache_utils import KVCacheBlock

        blocks = KVCacheBlocks(blocks=([KVCacheBlock(block_id=b) for b in (1, 2)],))
        self.scheduler.update_state_after_alloc(req, blocks, 0)

    def finish(self, req: Any, status: Any, blocks: list[int]) -> bool:
        req.status = status
        held, _ = self.scheduler.request_finished(req, (blocks,))
        return bool(held)

    def step(self) -> Any:
        """One schedule's metadata, handed to P's sender loop as the worker does."""
        meta = self.scheduler.build_connector_meta(None)
        self.worker.start_load_kv(meta)  # returns at once: nothing is ever raised here
        self.settle()
        return meta

    def settle(self) -> None:
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0.01), self.loop).result(timeout=10)

    def record(self, meta: Any) -> None:
        """The same coroutine, awaited: what its unread future holds."""
        asyncio.run_coroutine_threadsafe(
            self.worker.record_send_reqs(meta), self.loop).result(timeout=10)

    def finished_sending(self) -> set[str]:
        fut = asyncio.run_coroutine_threadsafe(self.worker.fetch_finished_sending_reqs(),
                                               self.loop)
        return set(fut.result(timeout=10))


@pytest.fixture
def mooncake(vllm_backend: Any) -> Iterator[_Mooncake]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield _Mooncake(vllm_backend, loop)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)


def test_only_the_first_allocation_under_a_transfer_id_makes_its_entry(
        mooncake: _Mooncake) -> None:
    from vllm.v1.request import RequestStatus

    a, b = mooncake.request("X-aaaaaaaa"), mooncake.request("X-bbbbbbbb")
    mooncake.allocate(a)
    mooncake.step()
    mooncake.allocate(b)
    mooncake.step()
    table = mooncake.worker.reqs_need_send
    assert list(table) == [_XFER] and table[_XFER].p_req_id == a.request_id
    # Both finish LENGTH_CAPPED in one step: the one entry ends up B's, with B's blocks.
    assert mooncake.finish(a, RequestStatus.FINISHED_LENGTH_CAPPED, [10, 11])
    assert mooncake.finish(b, RequestStatus.FINISHED_LENGTH_CAPPED, [12, 13])
    mooncake.step()
    entry = table[_XFER]
    assert (entry.p_req_id, entry.local_block_ids, entry.ready.is_set()) == (
        b.request_id, [[12, 13]], True)
    # So every decode leg pulling xfer-X is written B's KV, and A, held by P's scheduler
    # (request_finished said so), is named by no entry: nothing can ever free it.
    assert all(e.p_req_id != a.request_id for e in table.values())


def test_a_finish_after_the_entry_is_gone_raises_keyerror_in_an_unread_future(
        mooncake: _Mooncake, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's pd-mooncake-collision: A's entry leaves the table (there by the first write,
    here by vLLM's expiry), then B, allocated while A's entry existed, finishes."""
    from vllm.v1.request import RequestStatus

    monkeypatch.setenv("VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT", "0")
    a, b = mooncake.request("X-aaaaaaaa"), mooncake.request("X-bbbbbbbb")
    mooncake.allocate(a)
    mooncake.allocate(b)
    mooncake.step()
    assert mooncake.finish(a, RequestStatus.FINISHED_LENGTH_CAPPED, [10, 11])
    mooncake.step()
    time.sleep(0.01)
    assert mooncake.finished_sending() == {a.request_id}
    assert mooncake.worker.reqs_need_send == {}
    assert mooncake.finish(b, RequestStatus.FINISHED_LENGTH_CAPPED, [12, 13])  # held
    meta = mooncake.step()  # start_load_kv returned normally
    assert mooncake.worker.reqs_need_send == {}
    with pytest.raises(KeyError, match=_XFER):
        mooncake.record(meta)
    time.sleep(0.01)
    assert mooncake.finished_sending() == set()  # B is held for ever


def test_a_stopped_finish_pops_the_other_requests_ready_entry(mooncake: _Mooncake) -> None:
    """Only LENGTH_CAPPED is held (:1206); B's STOPPED finish queues xfer-X as not processed,
    whose pop takes A's ready entry before ``assert not send_meta.ready.is_set()`` fails."""
    from vllm.v1.request import RequestStatus

    a, b = mooncake.request("X-aaaaaaaa"), mooncake.request("X-bbbbbbbb")
    mooncake.allocate(a)
    mooncake.allocate(b)
    mooncake.step()
    assert mooncake.finish(a, RequestStatus.FINISHED_LENGTH_CAPPED, [10, 11])
    mooncake.step()
    assert not mooncake.finish(b, RequestStatus.FINISHED_STOPPED, [12, 13])
    meta = mooncake.scheduler.build_connector_meta(None)
    assert meta.reqs_not_processed == {_XFER}
    with pytest.raises(AssertionError):
        mooncake.record(meta)
    assert mooncake.worker.reqs_need_send == {}
    assert mooncake.finished_sending() == set()  # A is held for ever


# the half-built worker's own __del__ calls shutdown(), which reads async_zmq_ctx (:1436-1441)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_scheduler_side_builds_in_vllms_scheduler_and_the_worker_needs_mooncake(
        vllm_backend: Any) -> None:
    """Why the backend's worker is a state-only instance (docs/pd-vllm.md): a Scheduler with
    kv_connector MooncakeConnector builds vLLM's own connector on both roles, while the
    worker's __init__ raises without the mooncake package's TransferEngine (:90-97,
    1234-1236)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as m

    from racesim.engine_vllm._vllm import VllmEngineShape, _config, new_scheduler

    for role, engine in (("kv_producer", "prefill"), ("kv_consumer", "decode")):
        shape = VllmEngineShape(64, _BLOCK, 16, 2048, 256, False, True,
                                (role, engine, 30, "fail", "MooncakeConnector"))
        sched = new_scheduler(shape)
        assert type(sched.connector.connector_scheduler) is m.MooncakeConnectorScheduler
        assert sched.connector.connector_scheduler.is_kv_producer == (role == "kv_producer")
    assert m.TransferEngine is None
    vc, spec = _config(shape)
    kvc = vllm_backend.KVCacheConfig(num_blocks=65, kv_cache_tensors=[],
                                     kv_cache_groups=[vllm_backend.KVCacheGroupSpec(["layer"],
                                                                                    spec)])
    with pytest.raises(RuntimeError, match="Mooncake is not available"):
        m.MooncakeConnectorWorker(vc, engine, kvc)


# -- in the World: the vllm backend (engine_vllm/connectors/mooncake.py) ---------------------

#: the worker methods whose calls the World run counts (vLLM's own, from the class)
_COUNTED = ("register_kv_caches", "_mooncake_sender_listener", "send_kv_to_decode",
            "_send_blocks", "record_send_reqs", "fetch_finished_sending_reqs",
            "receive_kv_from_single_worker", "_connect_to_prefiller_bootstrap")


@pytest.fixture
def calls(vllm_backend: Any, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often the run called each of vLLM's own worker methods in :data:`_COUNTED`."""
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as m

    seen: Counter[str] = Counter()
    for name in _COUNTED:
        real = getattr(m.MooncakeConnectorWorker, name)
        if inspect.iscoroutinefunction(real):
            async def counted(self: Any, *a: Any, _n: str = name, _f: Any = real) -> Any:
                seen[_n] += 1
                return await _f(self, *a)
        else:
            def counted(self: Any, *a: Any, _n: str = name, _f: Any = real) -> Any:
                seen[_n] += 1
                return _f(self, *a)
        monkeypatch.setattr(m.MooncakeConnectorWorker, name, counted)
    return seen


def _kinds(r: Any, kind: str) -> list[Any]:
    return [e for e in r.trace if e.kind == kind]


def test_pd_mooncake_runs_vllms_own_sender_and_receiver(calls: Counter[str],
                                                        vllm_systems: list[Any]) -> None:
    """Each decode leg's pull is served by vLLM's own send_kv_to_decode, which writes through
    the simulated TransferEngine in [pd] transfer_time and frees P's hold; clean."""
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as m

    r = run_scenario(load_scenario("pd-mooncake"), "internal-id", engine="vllm")
    assert r.violated == () and [(q.tokens, q.finish_reason) for q in r.requests] == [
        (8, "length")] * 2
    assert {k: calls[k] for k in ("register_kv_caches", "_mooncake_sender_listener",
                                  "send_kv_to_decode", "_send_blocks",
                                  "receive_kv_from_single_worker",
                                  "_connect_to_prefiller_bootstrap")} == {
        "register_kv_caches": 2, "_mooncake_sender_listener": 1, "send_kv_to_decode": 2,
        "_send_blocks": 2, "receive_kv_from_single_worker": 2,
        "_connect_to_prefiller_bootstrap": 1}
    # X1 allocated; X1 finished with X2 allocated in one schedule; X2 finished
    assert calls["record_send_reqs"] == 3 and calls["fetch_finished_sending_reqs"] > 0
    (system,) = vllm_systems
    for engine in system.engines:
        assert type(engine.sched.connector) is m.MooncakeConnector
        assert type(engine.transport.worker) is m.MooncakeConnectorWorker
        assert not engine.sched.requests  # every hold ended
    holds, writes = _kinds(r, "pd.hold"), _kinds(r, "pd.push_write")
    assert [w.detail.matched for w in writes] == ["transfer_id"] * 2
    # each write ends transfer_time (0.002 s) after its hold began, into its own leg
    assert [w.time for w in writes] == pytest.approx([h.time + 0.002 for h in holds])
    assert [w.inc for w in writes] == [h.inc for h in holds]
    assert [e.detail.cause for e in _kinds(r, "pd.release")] == ["pushed", "pushed"]


def test_a_shared_transfer_id_crosses_the_legs_on_vllms_own_code(calls: Counter[str]) -> None:
    """pd-mooncake-collision under internal-id: both decode legs ask for xfer-X; vLLM's own
    send_kv_to_decode writes the first prefill's blocks into both, and the second prefill's
    finish finds no entry (KeyError in record_send_reqs): its blocks stay held."""
    r = run_scenario(load_scenario("pd-mooncake-collision"), "internal-id", engine="vllm")
    assert r.violated == ("no-crosstalk", "no-leak")
    writes = _kinds(r, "pd.push_write")
    assert len({w.inc for w in writes}) == 1 and len({w.detail.dest_inc for w in writes}) == 2
    (lost,) = _kinds(r, "pd.hold_lost")
    assert lost.detail.error == "KeyError: 'xfer-X'"
    assert calls["send_kv_to_decode"] == 2


def test_equal_ids_kill_both_engines_at_vllms_own_assert(vllm_backend: Any) -> None:
    """Under buggy the second X dies of each Scheduler's own duplicate-ID assert."""
    r = run_scenario(load_scenario("pd-mooncake-collision"), "buggy", engine="vllm")
    deaths = [v for v in r.violations if v.invariant == "engine-alive"]
    assert [v.detail.split(" died")[0] for v in deaths] == ["decode", "prefill"]
    assert all(v.where == "v1/core/sched/scheduler.py:2936" for v in deaths)


def test_mooncake_conforms_and_is_deterministic(vllm_backend: Any, tmp_path: Path) -> None:
    """Schedules drawn on the model agree on vLLM's own code; a run hashes alike in two
    processes under two PYTHONHASHSEEDs."""
    scens = [load_scenario(n) for n in ("pd-mooncake", "pd-mooncake-collision")]
    res = conform(scens, [("buggy", {}), ("internal-id", {})], budget=10, workers=1,
                  out_dir=tmp_path)
    assert res.runs == 40 and [m.document() for m in res.unlisted] == []
    here = run_scenario(scens[1], "internal-id", engine="vllm").trace_hash
    code = ("from racesim.runner import run_scenario; from racesim.scenarios import "
            "load_scenario as l; print(run_scenario(l('pd-mooncake-collision'), 'internal-id', "
            "engine='vllm').trace_hash)")
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}, timeout=600,
                           check=True).stdout.strip() for seed in ("0", "31337")]
    assert outs == [here, here]


def test_repro_refuses_a_mooncake_counterexample(vllm_backend: Any, tmp_path: Path) -> None:
    """Its violations go through simulated parts (TransferEngine, sockets, threads): repro
    says so rather than writing a script."""
    from racesim.cli import main
    from racesim.repro import make_repro
    from racesim.sim.errors import InputError

    try:
        main(["explore", "pd-mooncake-collision", "-p", "buggy", "--engine", "vllm",
              "--budget", "1", "--out", str(tmp_path)])
    except SystemExit:
        pass
    (found,) = tmp_path.glob("*.json")
    with pytest.raises(InputError, match="MooncakeConnector's TransferEngine"):
        make_repro(str(found))
