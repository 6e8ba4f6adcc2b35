"""A ``MooncakeConnectorWorker`` (vLLM 0.33) holding the state its ``__init__`` sets, and the
module-level stand-ins its code looks up (``time``, ``httpx``, ``make_zmq_socket``).

``MooncakeConnectorWorker.__init__`` (mooncake_connector.py:1225-1412) cannot run here: it
raises without the native ``mooncake`` package (1234-1236), binds a CUDA device (1242-1243),
asks torch.distributed for TP/PP ranks (1285-1286, 1320), starts threads, a thread pool and the
bootstrap HTTP server (1327-1362), and reads the model's attention layers
(``get_current_attn_backends``, 1382). :func:`new_worker` sets the attributes it would set for
one TP and PP rank, with vLLM's own ``TransferTopology`` and ``MooncakeKVConnectorStats``, then
runs vLLM's own ``register_kv_caches`` on a CPU tensor of the scheduler's KV spec.
"""

from __future__ import annotations

import asyncio
import queue
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from racesim.engine_vllm.connectors import mooncake_fakes as fakes
from racesim.engine_vllm.connectors.nixl_fakes import SimTime

__all__ = ["install", "new_worker", "LAYER"]

#: the one attention layer the worker registers (``extract_layer_index`` needs an index)
LAYER = "model.layers.0.self_attn.attn"


def install(m: Any, now: Callable[[], float]) -> fakes.Httpx:
    """Point the connector module's ``time.perf_counter`` at ``now``, its ``httpx`` at the
    simulated bootstrap routes and its ``make_zmq_socket`` at simulated DEALERs (once per
    process; the clock per run). Returns the routes' owner."""
    from racesim.engine_vllm.connectors.mooncake_loop import AFTER_RUN

    if not isinstance(m.time, SimTime):
        m.time = SimTime(m.time)
    clock = m.time
    clock.now = now
    # after the run the module's clock is the real one again (vLLM's code outside a World)
    AFTER_RUN.append(lambda: setattr(clock, "now", clock._real.perf_counter))
    if not isinstance(m.httpx, fakes.Httpx):
        m.httpx = fakes.Httpx(m.httpx)
        m.make_zmq_socket = fakes.make_zmq_socket(m.make_zmq_socket)
    return m.httpx  # the prefill engine's transport sets this run's routes


def _kv_config(spec: Any, num_blocks: int) -> Any:
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec([LAYER], spec)])


def new_worker(m: Any, core: Any, engine_id: str, engine: fakes.TransferEngine,
               ctx: fakes.ZmqContext, loop: asyncio.AbstractEventLoop,
               randbits: Callable[[int], int]) -> Any:
    """The worker for ``engine_id`` ("prefill": kv_producer, "decode": kv_consumer)."""
    import torch

    from vllm.distributed.kv_transfer.kv_connector.utils import TransferTopology
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.stats import (
        MooncakeKVConnectorStats,
    )

    sched = core.sched
    vc = sched.vllm_config
    spec = sched.kv_cache_config.kv_cache_groups[0].kv_cache_spec
    kvc = _kv_config(spec, sched.kv_cache_config.num_blocks)
    producer = engine_id == "prefill"
    w = m.MooncakeConnectorWorker.__new__(m.MooncakeConnectorWorker)
    state: dict[str, Any] = dict(
        vllm_config=vc, device_id=0, engine=engine, hostname=engine_id,
        is_kv_producer=producer, is_kv_consumer=not producer, num_sender_workers=10,
        num_sender_tasks=20, rpc_port=engine.get_rpc_port(),
        _remote_agents={}, _pending_bootstrap_queries={}, side_channel_port=0,
        engine_id=engine_id, tp_rank=0, tp_size=1, block_len_per_layer=[],
        kv_block_len_per_layer=[], registered_layer_names=[], registered_layer_indices=[],
        registered_group_indices=[], region_shared_groups=[], region_row_offsets=[],
        opaque_packed_storages=set(), seen_base_addresses=[], _kv_data_lens=[],
        _kv_unregistered=False, _prepared_transfer_regions={}, _layout_by_peer=OrderedDict(),
        _kv_layout_id=0, _acked_layout_peers=set(), dp_rank=0, pp_size=1, pp_rank=0,
        kv_caches_base_addr=[], device_kv_caches={}, reqs_need_send={},
        finished_sending_reqs=set(), finished_recving_reqs=set(),
        _invalid_block_ids=queue.Queue(), _is_hma_required=False,
        _failed_recv_reqs=queue.Queue(), xfer_stats=MooncakeKVConnectorStats(),
        block_size=spec.block_size, model_config=vc.model_config,
        cache_config=vc.cache_config, kv_cache_config=kvc, use_mla=False,
        _physical_blocks_per_logical_kv_block=1, attn_backends=[],
        _tp_size={engine_id: 1}, _layer_specs={LAYER: spec},
        transfer_topo=TransferTopology(tp_rank=0, tp_size=1, block_size=spec.block_size,
                                       engine_id=engine_id, is_mla=False, is_mamba=False,
                                       total_num_kv_heads=spec.num_kv_heads, attn_backends=[]),
        async_zmq_ctx=ctx, _encoder=m.msgspec.msgpack.Encoder(),
        _xfer_meta_decoder=m.msgspec.msgpack.Decoder(m.MooncakeXferMetadata),
        _xfer_resp_decoder=m.msgspec.msgpack.Decoder(m.MooncakeXferResponse))
    if producer:
        # the thread pool is the loop's executor (mooncake_loop.py)
        state.update(_sender_executor=None, sender_loop=loop,
                     sender_worker_queue=asyncio.Queue())
    else:
        state.update(receiver_loop=loop)
    for name, value in state.items():
        setattr(w, name, value)
    w.shutdown = lambda: None  # __del__: there are no threads or sockets to close
    # One layer's KV as the CPU backend lays it out, block-major; register_kv_caches derives
    # the transfer layout from it. Its tail starts the sender listener and waits for it on a
    # thread (2282-2300): for P the transport starts the listener on the loop instead.
    blocks = kvc.num_blocks
    cache = torch.zeros((blocks, spec.page_size_bytes // 4), dtype=torch.float32)
    real_secrets = m.secrets
    w.is_kv_consumer = True
    m.secrets = fakes.Secrets(randbits)
    try:
        w.register_kv_caches({LAYER: cache})
    finally:
        m.secrets = real_secrets
        w.is_kv_consumer = not producer
    return w
