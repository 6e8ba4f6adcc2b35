"""MooncakeConnector's pairing by transfer_id, run on vLLM 0.33.0's own code (the answer in
docs/pd-connectors.md).

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
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

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
    """What docs/pd-vllm.md says keeps Mooncake model-only on the vllm backend: a Scheduler
    with kv_connector MooncakeConnector builds vLLM's own connector on both roles, while the
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
