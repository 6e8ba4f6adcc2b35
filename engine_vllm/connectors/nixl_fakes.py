"""What stands in for NIXL itself under vLLM's own NIXL connector code: no racesim imports.

``racesim repro`` copies this file's text into the scripts it writes, so a script builds the
same objects the vllm backend builds (engine_vllm/connectors/push.py) from vLLM alone. Keep it
free of racesim imports and of anything but the standard library.

- :class:`SimTime`: the ``time`` module as the NIXL modules see it, ``perf_counter`` simulated;
- :class:`Agent`: ``nixl_wrapper``, the NIXL agent: notifications (``send_notif``,
  ``get_new_notifs``) and WRITE handles (``make_prepped_xfer``, ``transfer``,
  ``check_xfer_state``), each reported to callbacks;
- :class:`Wake` and :class:`OnePass`: the writer thread's events, so that one call of vLLM's
  ``_push_writer_loop`` (push_worker.py:256-314) runs exactly one pass;
- :func:`push_worker`: a ``NixlPushConnectorWorker`` holding the state its ``__init__`` gives
  the request and writer code (base_worker.py:602-1040, push_worker.py:90-138), and what a
  finished handshake leaves for one TP rank with equal block sizes (``transfer_topo``,
  ``tp_mappings``, transfer handles, descriptor counts).
"""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

__all__ = ["SimTime", "Stats", "Wake", "OnePass", "Agent", "push_worker"]


class SimTime:
    """The ``time`` module as the NIXL modules see it: ``perf_counter`` reads ``now``."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.now: Callable[[], float] = lambda: 0.0

    def perf_counter(self) -> float:
        return self.now()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class Stats:
    """``xfer_stats``: vLLM counts metrics here; nothing reads them."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class Wake:
    """``_push_writer_wake`` (a ``threading.Event``): ``set`` calls ``wake``."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def set(self) -> None:
        self._wake()

    def is_set(self) -> bool:
        return False

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def clear(self) -> None:
        pass


class OnePass:
    """``_push_writer_stop``: lets ``_push_writer_loop`` run exactly one pass per call."""

    def __init__(self) -> None:
        self.passes = 0

    def is_set(self) -> bool:
        self.passes += 1
        return self.passes % 2 == 0

    def wait(self, timeout: float | None = None) -> bool:
        return False

    def set(self) -> None:
        pass


class Agent:
    """``nixl_wrapper``: the notifications that arrived (``inbox``), and WRITE handles (the
    RDMA: ``handles`` maps each to "PROC" or "DONE"). ``on_notif(agent, msg)``,
    ``on_write(handle, local_descs, remote_descs, notif)`` and ``on_transfer(handle)`` are
    told what vLLM's code sends."""

    def __init__(self, on_notif: Callable[[str, bytes], None],
                 on_write: Callable[[int, list[int], list[int], bytes], None],
                 on_transfer: Callable[[int], None]) -> None:
        self.inbox: list[bytes] = []
        self.handles: dict[int, str] = {}
        self._next = 0
        self._on_notif, self._on_write, self._on_transfer = on_notif, on_write, on_transfer

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        got, self.inbox = self.inbox, []
        return {"peer": got} if got else {}

    def send_notif(self, agent_name: str, notif_msg: bytes) -> None:
        self._on_notif(agent_name, notif_msg)

    def make_prepped_xfer(self, op: str, local_handle: Any, local_descs: Any,
                          remote_handle: Any, remote_descs: Any, notif_msg: bytes) -> int:
        self._next += 1
        self.handles[self._next] = "PROC"
        self._on_write(self._next, [int(b) for b in local_descs],
                       [int(b) for b in remote_descs], notif_msg)
        return self._next

    def transfer(self, handle: int) -> str:
        self._on_transfer(handle)
        return "PROC"

    def check_xfer_state(self, handle: int) -> str:
        return self.handles[handle]

    def get_xfer_telemetry(self, handle: int) -> None:
        return None

    def release_xfer_handle(self, handle: int) -> None:
        self.handles.pop(handle, None)


def push_worker(cls: Any, engine_id: str, block_size: int, num_blocks: int, lease: int,
                agent: Agent, wake: Callable[[], None],
                heartbeats: Callable[[Any], None]) -> Any:
    """A ``NixlPushConnectorWorker`` (``cls``) with only the state its request and writer
    code reads; the handshake is done (``_ensure_handshake`` leaves the peer's agent and
    returns None: no future to wait on, base_worker.py:1385-1460); ``_send_heartbeats`` is
    ``heartbeats``."""
    w = cls.__new__(cls)
    info = SimpleNamespace(remote_tp_size=1, remote_block_size=block_size,
                           remote_physical_blocks_per_logical=1)
    state = dict(
        engine_id=engine_id, world_size=1, tp_rank=0, pcp_rank=0, pcp_dcp_sharded=False,
        _physical_blocks_per_logical_kv_block=1,
        _lease_extension=lease * 2 // 3,  # base_worker.py:627-631
        _recving_metadata={}, _recving_transfers=defaultdict(list), _reqs_to_send={},
        _reqs_to_process=set(), _replicated_pcp_done_sending=set(),
        consumer_notification_counts_by_req=defaultdict(int),
        expected_consumer_notifications_by_req={}, _recv_failures=set(),
        _failed_recv_reqs=queue.Queue(), _pending_recv_notifs={},
        _invalid_block_ids=queue.Queue(), _is_hma_required=False, use_host_buffer=False,
        enable_permute_local_kv=False, enable_heterogeneous_attn_post_process=False,
        _sending_transfers=defaultdict(list), _send_failures=set(),
        _sending_transfers_lock=threading.Lock(), _push_finished_blocks={},
        _pending_d_registrations={}, _reg_send_inbox=queue.Queue(),
        _finished_blocks_inbox=queue.Queue(), _pending_completion_notifs=queue.Queue(),
        _evict_finished_inbox=queue.Queue(), _deferred_push_inbox=queue.Queue(),
        _push_writer_wake=Wake(wake), _push_writer_stop=OnePass(),
        _handshake_lock=threading.Lock(), _remote_agents={}, _engine_last_active={},
        transfer_topo=SimpleNamespace(get_engine_info=lambda engine_id: info,
                                      tp_ratio=lambda tp: 1, block_size_ratio=lambda b: 1),
        tp_mappings=defaultdict(lambda: SimpleNamespace(all_source_ranks=[0],
                                                        source_ranks_per_group=[[0]])),
        region_group_ids=[0], dst_region_group_ids=defaultdict(lambda: [0]),
        _transfer_layer_group_ids=[], use_mla=False, _has_mamba=False, _is_csa_linear=False,
        _group_spec_types=[None], src_xfer_handles_by_block_size=defaultdict(int),
        dst_xfer_side_handles=defaultdict(lambda: {0: 0}),
        dst_num_blocks=defaultdict(lambda: num_blocks),
        dst_region_num_blocks=defaultdict(lambda: None),
        dst_uses_region_group_mapping=defaultdict(bool), _uses_region_group_mapping=False,
        num_regions=1, block_len_per_layer=[1], xfer_stats=Stats())
    for name, value in state.items():
        setattr(w, name, value)
    w.nixl_wrapper = agent

    def _ensure_handshake(engine: str, host: str, port: int, tp_size: int,
                          **kwargs: Any) -> None:
        w._remote_agents.setdefault(engine, {0: engine})

    w._ensure_handshake = _ensure_handshake
    w._send_heartbeats = heartbeats
    return w
