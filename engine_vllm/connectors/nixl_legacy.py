"""NIXL pull mode on vLLM releases before 0.33: their own NixlConnector, one adapter per layout.

Two NIXL API generations precede 0.33's ``nixl/`` package of base/pull/push modules:

- **0.20** (0.20.0): the ``nixl/`` package with one scheduler and one worker module
  (``nixl/scheduler.py``: ``NixlConnectorScheduler(vllm_config, engine_id, kv_cache_config)``,
  ``nixl/worker.py``: ``NixlConnectorWorker``), grouped block IDs (``BlockIds``), no lease and
  no heartbeats: a held request's blocks go when D's notice arrives or after
  ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT`` (worker.py:1708-1728);
- **0.10** (0.10.1.1, 0.11.0, 0.14.0): one module, ``kv_connector/v1/nixl_connector.py``, flat
  block lists; 0.10.1.1's worker has no ``_reqs_to_process`` (its abort path and notice check
  read ``_reqs_to_send`` alone, nixl_connector.py:1056-1080) and raises on a failed transfer
  (:1098-1100); 0.11.0 adds ``_reqs_to_process``; 0.14.0 adds failed-transfer handling
  (``_handle_failed_transfer``, ``_invalid_block_ids``, nixl_connector.py:2020-2033).

Both Schedulers build vLLM's own ``NixlConnector`` and call its scheduler side as usual (0.10-0.14
call ``request_finished`` with the one group's blocks, 0.14.0 scheduler.py:1684-1690, 0.10.1.1
:1105; 0.20's connector supports the hybrid allocator, so it gets
``request_finished_all_groups``, 0.20.0 :2030-2038). The worker is the release's own
``NixlConnectorWorker`` on an instance holding only its request bookkeeping, and the engine
step calls its own ``start_load_kv`` and ``get_finished`` (notices, done or failed transfers,
the timeout).
Simulated, as on 0.33 (connectors/nixl.py): the handshake (done: ``_remote_agents`` knows every
peer), the READ (``_read_blocks_for_req``: ``[pd] transfer_time`` at ``pd.kv:read``, then its
transfer handle reads "DONE", or "ERR" for a scripted ``kv-load`` fault, in
``check_xfer_state``; the notice ``"<P id>:1"`` reaches P when the read completes).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

from racesim.engine_model.events.pd import PdRead, PdReadFailed, PdRecvStart
from racesim.engine_model.messages import KVDoneNotice
from racesim.engine_vllm.connectors.nixl import _LEGACY, _NIXL, NixlTransport, first_group
from racesim.engine_vllm.connectors.nixl_fakes import Stats

__all__ = ["LegacyNixlTransport", "legacy_generation"]


def legacy_generation() -> str | None:
    """The installed release's NIXL layout: "0.20" (nixl/worker.py), "0.10" (nixl_connector.py),
    or None (0.33's base/pull/push package)."""
    import importlib.util

    def has(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # its package is not there (before 0.20)
            return False

    if has(f"{_NIXL}.pull_worker"):
        return None
    return "0.20" if has(f"{_NIXL}.worker") else "0.10"


class _Agent:
    """``nixl_wrapper``: notices that arrived, and READ handles ("PROC", "DONE" or "ERR")."""

    def __init__(self) -> None:
        self.pending: list[bytes] = []
        self.handles: dict[int, str] = {}

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        got, self.pending = self.pending, []
        return {"decode": got} if got else {}

    def check_xfer_state(self, handle: int) -> str:
        return self.handles[handle]

    def get_xfer_telemetry(self, handle: int) -> None:
        return None

    def release_xfer_handle(self, handle: int) -> None:
        self.handles.pop(handle, None)


class _Connected(dict):  # type: ignore[type-arg]
    """``_remote_agents`` once every handshake is done: it knows every engine."""

    def __contains__(self, key: object) -> bool:
        return True


class LegacyNixlTransport(NixlTransport):
    """One engine's NIXL worker on 0.10-0.20: the release's own bookkeeping and ``get_finished``,
    simulated reads. No heartbeats (they came with leases in 0.33)."""

    _FINISHED = "request_finished"

    def __init__(self, core: Any, engine_id: str, lease: int, transfer_time: float,
                 fabric: Any) -> None:
        # the hold: VLLM_NIXL_ABORT_REQUEST_TIMEOUT, read at each request_finished and
        # get_finished (vllm/envs.py evaluates it on access)
        os.environ["VLLM_NIXL_ABORT_REQUEST_TIMEOUT"] = str(int(lease))
        self.generation = legacy_generation() or "0.20"
        if self.generation == "0.20":
            # 0.20's NixlConnector supports the hybrid allocator (SupportsHMA), so its
            # Scheduler calls request_finished_all_groups (0.20.0 scheduler.py:2030-2038)
            self._FINISHED = "request_finished_all_groups"
        self._handles = 0
        super().__init__(core, engine_id, lease, transfer_time, fabric)

    def _make_worker(self, lease: int) -> Any:
        module = f"{_NIXL}.worker" if self.generation == "0.20" else _LEGACY
        cls = sys.modules[module].NixlConnectorWorker
        w = cls.__new__(cls)
        one = SimpleNamespace(remote_block_size=self.core.config.block_size,
                              remote_tp_size=1, remote_physical_blocks_per_logical=1)
        state = dict(
            engine_id=self.engine_id, world_size=1, tp_rank=0, use_host_buffer=False,
            use_mla=False, enable_permute_local_kv=False, _is_hma_required=False,
            enable_heterogeneous_attn_post_process=False,
            _physical_blocks_per_logical_kv_block=1, _recving_metadata={},
            _recving_transfers=defaultdict(list), _reqs_to_send={}, _reqs_to_process=set(),
            _ready_requests=queue.Queue(), consumer_notification_counts_by_req=defaultdict(int),
            _failed_recv_reqs=set(), _invalid_block_ids=set(), _remote_agents=_Connected(),
            _handshake_lock=threading.Lock(), xfer_stats=Stats(), nixl_wrapper=_Agent(),
            # what 0.10-0.11's __del__ stops (nixl_connector.py:552-556): no threads here
            _handshake_initiation_executor=SimpleNamespace(shutdown=lambda wait=True: None),
            _nixl_handshake_listener_t=None,
            shutdown=lambda: None,  # 0.14-0.20's __del__ calls it: no NIXL handles to release
            # what the handshake leaves: one TP rank, equal block sizes
            transfer_topo=SimpleNamespace(get_engine_info=lambda engine_id: one,
                                          block_size_ratio=lambda size: 1,
                                          tp_ratio=lambda tp: 1),
            kv_topo=SimpleNamespace(block_size_ratio_from_engine_id=lambda engine_id: 1,
                                    tp_ratio=lambda tp: 1))
        for name, value in state.items():
            setattr(w, name, value)
        w._read_blocks_for_req = self._read
        return w

    # -- the reads ------------------------------------------------------------------------------

    @staticmethod
    def _remote(req_id: str, meta: Any) -> tuple[str, str, list[int]]:
        """(P's request ID, P's engine ID, P's blocks) of a ReqMeta: ``meta.remote`` from 0.14,
        flat ``remote_*`` fields before; 0.10.1.1's has no ``remote_request_id``: its notice
        names D's own ID (``notif_id = f"{req_id}:{tp_ratio}"``, nixl_connector.py:1180)."""
        remote = getattr(meta, "remote", None)
        if remote is not None:
            return remote.request_id, remote.engine_id, first_group(remote.block_ids)
        return (getattr(meta, "remote_request_id", req_id), meta.remote_engine_id,
                first_group(meta.remote_block_ids))

    def _read(self, req_id: str, meta: Any) -> None:
        """``_read_blocks_for_req``: the READ (or, with no local blocks, only the notice,
        0.20.0 worker.py:1920-1930, 0.10.1.1 nixl_connector.py:1160-1170)."""
        core = self.core
        req = self.recv_objects.get(req_id)
        p_id, p_engine, p_blocks = self._remote(req_id, meta)
        notice = KVDoneNotice(p_id, core.remote_inc(req))
        engine = self.fabric.engine_ids.get(p_engine, -1)
        if not first_group(meta.local_block_ids):
            core.send_kv_notice(engine, notice)
            return
        inc = core.inc_of(req)
        self.world.emit(self.component, req_id, inc, PdRecvStart())
        self._handles += 1
        handle = self._handles
        self.worker.nixl_wrapper.handles[handle] = "PROC"
        bare = self.generation == "0.20" or hasattr(self.worker, "_handle_failed_transfer")
        entry = handle if bare else (handle, float(self.world.now))  # 0.10/0.11: (handle, start)
        self.worker._recving_transfers[req_id].append(entry)
        self.world.env.process(self._legacy_transfer(req_id, inc, req, p_id, p_blocks, engine,
                                                     notice, handle))

    def _legacy_transfer(self, req_id: str, inc: int, req: Any, p_id: str, p_blocks: list[int],
                         engine: int, notice: KVDoneNotice, handle: int) -> Any:
        core = self.core
        ev = self.world.sleep("pd.kv:read", self.transfer_time, self.component)
        if ev is not None:
            yield ev
        if core.dead is not None:
            return
        handles = self.worker.nixl_wrapper.handles
        if core.read_fails(req):
            self.world.emit(self.component, req_id, inc, PdReadFailed(p_id))
            if handle in handles:
                handles[handle] = "ERR"
        else:
            self.world.emit(self.component, req_id, inc,
                            PdRead(engine, p_id, p_blocks, notice.remote_inc))
            if handle in handles:
                handles[handle] = "DONE"
            core.send_kv_notice(engine, notice)  # NIXL delivers the READ's notif_msg
        core.wake()

    # -- get_finished ---------------------------------------------------------------------------

    def has_results(self) -> bool:
        w = self.worker
        if w.nixl_wrapper.pending or w._failed_recv_reqs:
            return True
        if any(state != "PROC" for state in w.nixl_wrapper.handles.values()):
            return True
        expiry = self.next_expiry()
        return expiry is not None and expiry <= self.world.now

    def transfer_results(self, v: Any) -> Any:
        """The release's own ``get_finished`` (and ``get_block_ids_with_load_errors`` where it
        has one), packed as its KVConnectorOutput; sets sorted (the scheduler iterates them)."""
        w = self.worker
        before = dict(w._reqs_to_send)
        sending, recving = w.get_finished()
        now = self.world.now
        for rid in sorted(sending):
            expired = rid in before and before[rid] <= now
            self.causes.setdefault(rid, "timeout" if expired else "notify")
        kw: dict[str, Any] = {"finished_sending": dict.fromkeys(sorted(sending)) or None,
                              "finished_recving": dict.fromkeys(sorted(recving)) or None}
        if hasattr(w, "get_block_ids_with_load_errors") and \
                "invalid_block_ids" in getattr(v.KVConnectorOutput, "__dataclass_fields__", {}):
            kw["invalid_block_ids"] = w.get_block_ids_with_load_errors()
        return v.KVConnectorOutput(**kw)

    def next_heartbeat(self) -> float | None:
        return None  # no heartbeats before 0.33

    def next_expiry(self) -> float | None:
        """A hold's timeout is seen only by a step's ``get_finished``, and EngineCore steps only
        while its Scheduler has requests (it blocks on its input queue otherwise, 0.10.1.1
        v1/engine/core.py:722-731): an idle engine is not woken for it."""
        if not self.core.sched.has_requests():
            return None
        return super().next_expiry()
