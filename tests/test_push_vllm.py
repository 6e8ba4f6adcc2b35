"""NIXL push mode's pairing, run on vLLM 0.33.0's own code (the answer in docs/pd-connectors.md).

Two prefill (P) requests and two decode (D) registrations go through vLLM's own
``NixlPushConnectorScheduler`` (P and D engines: ``request_finished``,
``update_state_after_alloc``, ``build_connector_meta``), D's own ``NixlPushConnectorWorker``
encodes and sends the PUSH_REG notifications, and P's own worker runs its real writer thread
(``_push_writer_loop``: it receives P's finished blocks from ``start_load_kv``, the
notifications from the NIXL agent, and pairs them). Internal IDs come from vLLM's own
``InputProcessor.assign_request_id``. What is faked: the NIXL agent (no ``nixl`` package on
CPU; it passes notifications and records nothing else), and the WRITE itself:
``_do_start_push_kv``, the call the writer makes once it has paired a P request with a
registration, records the pairing instead of starting the handshake and the transfer.
"""

from __future__ import annotations

import copy
import queue
import tempfile
import threading
import time
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

_BLOCK = 32  # vLLM's CPU attention backend needs a multiple of 32 (v1/worker/utils.py:554)


class _FakeNixlAgent:
    """Stands in for ``nixl_agent``: notifications sent are recorded, notifications to deliver
    are queued by the test and handed out by ``get_new_notifs``."""

    def __init__(self, name: str, config: Any) -> None:
        self.name = name
        self.sent: list[tuple[str, bytes]] = []
        self.inbox: queue.Queue[bytes] = queue.Queue()

    def send_notif(self, agent_name: str, notif_msg: bytes) -> None:
        self.sent.append((agent_name, notif_msg))

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        out = []
        while not self.inbox.empty():
            out.append(self.inbox.get_nowait())
        return {"peer": out} if out else {}

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: 0  # registration calls the worker makes at init


@pytest.fixture(scope="module")
def push(vllm_backend: Any) -> Any:
    """vLLM's push connector classes, with a fake NIXL agent and a one-process gloo group."""
    from vllm.config import KVTransferConfig, set_current_vllm_config
    from vllm.distributed import parallel_state
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_scheduler import (
        NixlPushConnectorScheduler,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
        NixlPushConnectorWorker,
    )

    from racesim.engine_vllm._vllm import VllmEngineShape, _config

    v = vllm_backend
    base_vc, spec = _config(VllmEngineShape(64, _BLOCK, 16, 2048, 256, False, True))
    kvc = v.KVCacheConfig(num_blocks=65, kv_cache_tensors=[],
                          kv_cache_groups=[v.KVCacheGroupSpec(["layer"], spec)])

    def config(engine_id: str) -> Any:
        vc = copy.copy(base_vc)
        vc.cache_config = copy.copy(base_vc.cache_config)
        vc.cache_config.kv_cache_layout = "NHD"  # what the engine core resolves at start
        vc.kv_transfer_config = KVTransferConfig(kv_connector="NixlPushConnector",
                                                 kv_role="kv_both", engine_id=engine_id)
        return vc

    saved = base_worker.NixlWrapper, base_worker.check_nixl_version
    base_worker.NixlWrapper = _FakeNixlAgent
    base_worker.check_nixl_version = lambda version: None
    if not parallel_state.model_parallel_is_initialized():
        with set_current_vllm_config(config("P")):
            parallel_state.init_distributed_environment(
                world_size=1, rank=0, local_rank=0, backend="gloo",
                distributed_init_method=f"file://{tempfile.mktemp()}")
            parallel_state.ensure_model_parallel_initialized(1, 1)

    class Push:
        def scheduler(self, engine_id: str) -> Any:
            return NixlPushConnectorScheduler(config(engine_id), engine_id, kvc)

        def worker(self, engine_id: str) -> Any:
            return NixlPushConnectorWorker(config(engine_id), engine_id, kvc)

        def blocks(self, ids: list[int]) -> Any:
            from vllm.v1.core.kv_cache_manager import KVCacheBlocks
            from vllm.v1.core.kv_cache_utils import KVCacheBlock
            return KVCacheBlocks(blocks=([KVCacheBlock(block_id=b) for b in ids],))

    yield Push()
    base_worker.NixlWrapper, base_worker.check_nixl_version = saved


def _internal_ids(external: str, n: int, salt: int) -> list[str]:
    """``n`` internal IDs for ``external`` from vLLM's own assign_request_id, seeded."""
    from racesim.engine_vllm._vllm import assign_request_id

    draws = iter(f"{salt:x}{i:x}".ljust(32, "c") for i in range(n))
    return [assign_request_id(external, lambda: next(draws)) for _ in range(n)]


def _request(rid: str, params: dict[str, Any]) -> Any:
    from racesim.engine_vllm._vllm import new_request

    req = new_request(rid, list(range(3, 3 + 2 * _BLOCK)), 8, 0, 0.0, _BLOCK, [])
    req.kv_transfer_params = params
    return req


def _wait(cond: Any, what: str) -> None:
    deadline = time.monotonic() + 20.0
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"the writer thread never {what}")
        time.sleep(0.002)


def _pairings(push: Any, p_externals: list[str], d_externals: list[str],
              d_order: list[int]) -> tuple[dict[str, str], list[str], list[str]]:
    """Finish P requests for ``p_externals`` (in order), then let the D requests for
    ``d_externals`` register in ``d_order``; return {P internal ID: D internal ID} as P's own
    writer thread paired them, and the P and D internal IDs."""
    from vllm.v1.request import RequestStatus

    p_ids = [_internal_ids(e, 1, 10 + i)[0] for i, e in enumerate(p_externals)]
    d_ids = [_internal_ids(e, 1, 20 + i)[0] for i, e in enumerate(d_externals)]

    # P's scheduler: each request finished after its one token and is held for D.
    p_sched = push.scheduler("P")
    for i, rid in enumerate(p_ids):
        req = _request(rid, {"do_remote_decode": True, "do_remote_prefill": False})
        req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        req.num_computed_tokens = 2 * _BLOCK
        held, _ = p_sched.request_finished(req, ([10 + 2 * i, 11 + 2 * i],))
        assert held
    p_meta = p_sched.build_connector_meta(None)
    assert list(p_meta.push_finished_blocks) == p_ids

    # D's scheduler: each D request allocated its blocks and stages a registration.
    d_sched = push.scheduler("D")
    for i in d_order:
        params = {"do_remote_prefill": True, "do_remote_decode": False,
                  "remote_engine_id": "P", "remote_host": "p-host", "remote_port": 5600,
                  "tp_size": 1, "remote_request_id": d_externals[i]}
        d_sched.update_state_after_alloc(_request(d_ids[i], params),
                                         push.blocks([40 + 2 * i, 41 + 2 * i]), 2 * _BLOCK)
    d_meta = d_sched.build_connector_meta(None)
    assert list(d_meta.push_registrations) == [d_ids[i] for i in d_order]

    # D's worker encodes and sends each PUSH_REG (handshake with P already done).
    d_worker = push.worker("D")
    d_worker._remote_agents["P"] = {(0, 0): "P-agent"}
    for rid, reg in d_meta.push_registrations.items():
        d_worker._do_send_reg_notif(rid, reg)
    notifs = [msg for _, msg in d_worker.nixl_wrapper.sent]
    assert len(notifs) == len(d_order)

    # P's worker: its own writer thread pairs finished blocks with registrations.
    p_worker = push.worker("P")
    paired: dict[str, str] = {}
    p_worker._do_start_push_kv = (
        lambda request_id, blocks, reg: paired.__setitem__(request_id, reg["request_id"]))
    thread = threading.Thread(target=p_worker._push_writer_loop, daemon=True)
    thread.start()
    try:
        p_worker.start_load_kv(p_meta)  # queues P's finished blocks, wakes the writer
        _wait(lambda: len(p_worker._push_finished_blocks) == len(p_ids), "filed P's blocks")
        for k, msg in enumerate(notifs):  # one PUSH_REG at a time, in D's order
            p_worker.nixl_wrapper.inbox.put(msg)
            p_worker._push_writer_wake.set()
            _wait(lambda k=k: len(paired) + len(p_worker._pending_d_registrations) == k + 1,
                  "took a registration")
    finally:
        p_worker._push_writer_stop.set()
        p_worker._push_writer_wake.set()
        thread.join(timeout=5)
    return paired, p_ids, d_ids


def test_vllm_pairs_two_requests_with_one_external_id_crosswise(push: Any) -> None:
    """Clients A and B both send X; P finishes A then B; B's decode leg registers first.
    vLLM's writer gives A's KV to B's decode request, and B's to A's."""
    paired, (p_a, p_b), (d_a, d_b) = _pairings(push, ["X", "X"], ["X", "X"], d_order=[1, 0])
    assert p_a != p_b and d_a != d_b and len({p_a, p_b, d_a, d_b}) == 4  # randomized
    assert paired == {p_a: d_b, p_b: d_a}


def test_vllm_pairs_distinct_external_ids_correctly(push: Any) -> None:
    """The control: with distinct external IDs the suffix-stripped lookup pairs each leg with
    its own, whatever order D registers in."""
    paired, (p_x, p_y), (d_x, d_y) = _pairings(push, ["X", "Y"], ["X", "Y"], d_order=[1, 0])
    assert paired == {p_x: d_x, p_y: d_y}

