"""P/D on the vllm backend: vLLM 0.33's own NixlConnector scheduler side, a simulated transport.

Each engine's vLLM ``Scheduler`` is built with a ``kv_transfer_config`` naming NixlConnector
(``kv_producer`` on the prefill engine, ``kv_consumer`` on the decode engine), so the scheduler
creates and calls vLLM's own ``NixlPullConnector`` / ``NixlPullConnectorScheduler``
(``get_num_new_matched_tokens``, ``update_state_after_alloc``, ``build_connector_meta``,
``request_finished``; v1/core/sched/scheduler.py:179, 1130-1142, 1467-1486, 1756-1758, 3349-3402)
and reads each step's ``KVConnectorOutput`` in ``update_from_output`` (:2273-2303, 2581-2582,
3556-3582). What stands in for the NIXL worker is :class:`NixlTransport`, one per engine:

- Its request bookkeeping is vLLM's own ``NixlPullConnectorWorker`` methods, run on an instance
  that holds only their state (the pull worker's ``__init__`` needs the nixl package and
  registered KV caches): ``start_load_kv`` (nixl/pull_worker.py:49-125: ``_reqs_to_process``,
  ``_reqs_to_send``, the abort assert ``req_id not in self._reqs_to_send``, ``_recving_metadata``),
  ``_get_new_notifs`` (:650-701: transfer-done and heartbeat notices) and
  ``_reap_expired_send_leases`` / ``_handle_heartbeat`` (nixl/base_worker.py:3352-3400). A
  KeyError or failed assert there is vLLM's own, and kills the engine as it would.
- Modelled (nixl/base_worker.py:3191-3330 needs NIXL transfer handles and the handshake's
  topology): the read itself, at the ``pd.kv:read`` await point, and its outcome in
  ``get_transfer_results``: a read done is ``finished_recving``; a failed one is
  ``finished_recving`` and ``failed_recving`` with its local blocks in ``invalid_block_ids``
  (:3240-3258, 3863-3876); its ``"<remote id>:1"`` notice reaches the prefill side over the
  ``pd.kv:notify`` channel when the read completes (a failed read sends none). A request with no
  blocks to read (it ended before its read) only sends the notice (pull_worker.py:69-76). The
  first heartbeat to a prefill engine only starts the handshake (base_worker.py:3517-3545).

``time.perf_counter`` in the NIXL modules reads the World's clock, so leases and heartbeats run
on simulated time. A real ``perf_counter`` is far from 0 when the first heartbeat is packaged, so
the scheduler's heartbeat throttle starts at minus infinity rather than 0.0
(``_last_heartbeat_time``, base_scheduler.py:139, 513-518): the first heartbeat goes at once.
"""

from __future__ import annotations

import json
import math
import queue
import sys
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from racesim.engine_model.events.pd import (
    PdHeartbeat,
    PdHold,
    PdNotice,
    PdNoticeUnknown,
    PdRead,
    PdReadFailed,
    PdRecvStart,
)
from racesim.engine_model.messages import KVDoneNotice, KVHeartbeat, KVTransferParams
from racesim.engine_vllm.connectors.nixl_fakes import SimTime, Stats

__all__ = ["NixlFabric", "NixlTransport", "install_clock", "producer_params", "first_group"]

_NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
_CLOCKED = ("base_scheduler", "pull_scheduler", "base_worker", "pull_worker", "push_scheduler",
            "push_worker",
            "scheduler", "worker")  # 0.20's nixl package (nixl/scheduler.py, nixl/worker.py)
#: before 0.20 one module (kv_connector/v1/nixl_connector.py)
_LEGACY = "vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector"


_CLOCK: SimTime | None = None


def install_clock(now: Callable[[], float]) -> None:
    """Point the NIXL modules' ``perf_counter`` at ``now`` (the running World's clock)."""
    global _CLOCK
    if _CLOCK is None:
        import importlib

        for name in (*(f"{_NIXL}.{n}" for n in _CLOCKED), _LEGACY):
            try:
                module = importlib.import_module(name)
            except ImportError:  # a module of another release's NIXL layout
                continue
            if _CLOCK is None:
                _CLOCK = SimTime(module.time)
            module.time = _CLOCK
    _CLOCK.now = now


def push_decode_params(remote_request_id: str) -> dict[str, Any]:
    """What the 0.33-era push demo proxy sends the decode leg (disagg_proxy_pushconnector_demo.py
    before it gained a ``transfer_id``): P's coordinates and the proxy's request ID, no blocks
    (D registers its own, push_scheduler.py:177-189 reads these keys)."""
    return {"do_remote_prefill": True, "do_remote_decode": False,
            "remote_engine_id": "prefill", "remote_request_id": remote_request_id,
            "remote_block_ids": None, "remote_host": "prefill", "remote_port": 5600,
            "tp_size": 1}


def first_group(blocks: Any) -> list[int]:
    """The block IDs of the first KV cache group: grouped (0.20+ ``BlockIds``, a tuple of
    lists) or flat (before 0.20, and what 0.20 passes ``request_finished`` for one group)."""
    if not blocks:
        return []
    first = blocks[0]
    return list(first) if isinstance(first, (list, tuple)) else list(blocks)


def producer_params() -> dict[str, Any]:
    """What the proxy sends the prefill engine (vLLM's toy_proxy_server.py, as in
    tests/v1/kv_connector/nixl_integration)."""
    return {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None}


class NixlFabric:
    """What connects the engines: their NIXL engine IDs, and each prefill's
    ``kv_transfer_params`` as the proxy forwards them to the decode engine."""

    def __init__(self, connector: str = "nixl-pull", decoder_ttl: float | None = None) -> None:
        #: the scenario's ``[pd] connector``: "nixl-pull" or "nixl-push"
        self.connector = connector
        #: ``kv_connector_extra_config`` beyond the lease, on both engines as one
        #: ``--kv-transfer-config`` would give them: bidirectional KV transfer when
        #: ``decoder_ttl`` is set (read by base_scheduler.py:176-185, base_worker.py:633-637)
        self.extra_config: tuple[tuple[str, Any], ...] = () if decoder_ttl is None else (
            ("bidirectional_kv_xfer", True), ("decoder_kv_blocks_ttl", decoder_ttl))
        self.engine_ids: dict[str, int] = {}
        self._params: dict[KVTransferParams, str] = {}
        #: push mode: each D request's incarnation by its ID (what P's WRITE names), and each
        #: PUSH_REG's bytes as D's writer sent them, by the message that carries them
        self.push_incs: dict[str, int] = {}
        self.push_bytes: dict[Any, bytes] = {}
        #: push mode: D requests whose WRITE fails to post (``kv_load_fails``, scripted)
        self.push_faults: set[str] = set()

    @property
    def connector_class(self) -> str:
        """The ``kv_connector`` vLLM builds (factory.py registers both names)."""
        if self.connector == "mooncake":
            return "MooncakeConnector"
        return "NixlPushConnector" if self.connector == "nixl-push" else "NixlConnector"

    def from_prefill(self, params: dict[str, Any], inc: int) -> KVTransferParams | None:
        """The model's view of the params a prefill request finished with (kept for D)."""
        if not params or not params.get("do_remote_prefill"):
            return None
        model = KVTransferParams(
            do_remote_prefill=True,
            remote_engine=self.engine_ids.get(str(params.get("remote_engine_id")), -1),
            remote_request_id=str(params.get("remote_request_id")),
            remote_block_ids=tuple(first_group(params.get("remote_block_ids"))),
            remote_inc=inc)
        self._params[model] = json.dumps(params)  # the proxy's JSON body
        return model

    def to_decode(self, params: KVTransferParams | None) -> dict[str, Any] | None:
        """The dict the decode engine's request carries (a fresh copy, as from JSON)."""
        if self.connector == "mooncake":
            from racesim.engine_vllm.connectors.mooncake import mooncake_params

            return mooncake_params(params)
        if params is None:
            return None
        if params.do_remote_decode:
            return producer_params()
        body = self._params.get(params)
        if body is None and self.connector == "nixl-push" and params.do_remote_prefill:
            return push_decode_params(str(params.remote_request_id))
        return json.loads(body) if body is not None else None


class _Notifs:
    """``nixl_wrapper`` as ``_get_new_notifs`` reads it: the notices that have arrived."""

    def __init__(self) -> None:
        self.pending: list[bytes] = []

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        got, self.pending = self.pending, []
        return {"decode": got} if got else {}


def _bare_worker(lease: int, read: Callable[[str, Any], None],
                 beat: Callable[[Any], None]) -> Any:
    """A ``NixlPullConnectorWorker`` holding only its request bookkeeping (the state its
    ``__init__`` sets for it, nixl/base_worker.py:602-1040), with the read and the heartbeats
    handed to the simulation."""
    cls = sys.modules[f"{_NIXL}.pull_worker"].NixlPullConnectorWorker
    w = cls.__new__(cls)
    w._recving_metadata = {}
    w._recving_transfers = defaultdict(list)
    w._reqs_to_send = {}
    w._reqs_to_process = set()
    w._ready_requests = queue.Queue()
    w.pcp_rank = 0
    w.pcp_dcp_sharded = False
    w._replicated_pcp_done_sending = set()
    w._physical_blocks_per_logical_kv_block = 1
    w.consumer_notification_counts_by_req = defaultdict(int)
    w.expected_consumer_notifications_by_req = {}
    w._lease_extension = lease * 2 // 3  # base_worker.py:627-631
    w.transfer_topo = True  # the handshake's topology: _get_new_notifs asserts it is set
    w.xfer_stats = Stats()
    w.nixl_wrapper = _Notifs()
    w._read_blocks_for_req = read
    w._send_heartbeats = beat
    return w


class NixlTransport:
    """One engine's NIXL worker: vLLM's own bookkeeping, simulated transfers. The engine shell
    reads :meth:`next_expiry` and :meth:`next_heartbeat` to wake an idle busy loop."""

    #: what the Scheduler calls when a request is freed (0.33 scheduler.py:3399; before 0.33,
    #: ``request_finished`` with one group's blocks, 0.20.0 scheduler.py:2036)
    _FINISHED = "request_finished_all_groups"

    def __init__(self, core: Any, engine_id: str, lease: int, transfer_time: float,
                 fabric: NixlFabric) -> None:
        self.core = core
        self.world = core.world
        self.engine_id = engine_id
        self.fabric = fabric
        self.transfer_time = transfer_time
        self.component = f"{core.name}.connector"
        self.worker = self._make_worker(lease)
        self.scheduler = core.sched.connector.connector_scheduler
        self.scheduler._last_heartbeat_time = -math.inf
        self._interval = float(lease // 6)  # base_scheduler.py:88
        #: D: the requests of this step's build_connector_meta, by ID (an aborted one has
        #: already left Scheduler.requests when its empty read is started)
        self.recv_objects: dict[str, Any] = {}
        self._done: dict[str, None] = {}
        self._failed: dict[str, None] = {}
        self._handshaken: dict[str, None] = {}
        #: P: why each notified or expired request is done ("notify" or "timeout")
        self.causes: dict[str, str] = {}
        self._wrap_request_finished()

    def _make_worker(self, lease: int) -> Any:
        return _bare_worker(lease, self._read, self._heartbeats)

    # -- the scheduler side, observed -----------------------------------------------------------

    def _wrap_request_finished(self) -> None:
        """Record ``pd.hold`` when vLLM's own ``request_finished`` keeps a request's blocks: a
        prefill's for the decode side's read, or, with bidirectional KV transfer, a decode
        request's for a turn-2 read-back (its params then say ``do_remote_decode``,
        nixl/pull_scheduler.py:232-269)."""
        connector = self.core.sched.connector
        real = getattr(connector, self._FINISHED)

        def request_finished_all_groups(request: Any, block_ids: Any) -> Any:
            delay, params = real(request, block_ids)
            if delay and params and (params.get("do_remote_prefill")
                                     or params.get("do_remote_decode")):
                expiry = self.scheduler._reqs_need_send.get(request.request_id)
                blocks = first_group(params.get("remote_block_ids"))
                self.world.emit(self.component, request.request_id, self.core.inc_of(request),
                                PdHold(blocks, float(expiry) if expiry is not None else 0.0))
            return delay, params

        setattr(connector, self._FINISHED, request_finished_all_groups)

    def before_schedule(self) -> None:
        self.recv_objects = {rid: entry[0] for rid, entry in
                             self.scheduler._reqs_need_recv.items()}

    def start_load_kv(self, meta: Any) -> None:
        """execute_model's ``start_load_kv`` with this step's metadata (every step, also one
        with nothing to compute: kv_connector_no_forward)."""
        requests = self.core.sched.requests
        for rid in meta.reqs_to_recv:
            if rid not in self.recv_objects and rid in requests:
                self.recv_objects[rid] = requests[rid]
        self.worker.start_load_kv(meta)

    # -- the transfers --------------------------------------------------------------------------

    def _read(self, req_id: str, meta: Any) -> None:
        """``_read_blocks_for_req``: the READ (or, with no blocks, only the notice)."""
        core = self.core
        req = self.recv_objects.get(req_id)
        remote = meta.remote
        remote_inc = core.remote_inc(req)
        notice = KVDoneNotice(remote.request_id, remote_inc)
        engine = self.fabric.engine_ids.get(remote.engine_id, -1)
        if not (meta.awaiting_kvs or any(meta.local_block_ids)):
            core.send_kv_notice(engine, notice)
            return
        inc = core.inc_of(req)
        self.world.emit(self.component, req_id, inc, PdRecvStart())
        self.world.env.process(self._transfer(req_id, inc, req, remote, engine, notice))

    def _transfer(self, req_id: str, inc: int, req: Any, remote: Any, engine: int,
                  notice: KVDoneNotice) -> Any:
        core = self.core
        ev = self.world.sleep("pd.kv:read", self.transfer_time, self.component)
        if ev is not None:
            yield ev
        if core.dead is not None:
            return
        if core.read_fails(req):
            self.world.emit(self.component, req_id, inc, PdReadFailed(remote.request_id))
            self._failed[req_id] = None
        else:
            self.world.emit(self.component, req_id, inc,
                            PdRead(engine, remote.request_id, list(remote.block_ids[0]),
                                   notice.remote_inc))
            self._done[req_id] = None
            core.send_kv_notice(engine, notice)
        core.wake()

    def _heartbeats(self, meta: Any) -> None:
        """``_send_heartbeats``: to each prefill engine whose handshake is done, else start
        it (the heartbeat is not sent, base_worker.py:3521-3534)."""
        for engine_id in sorted(meta.heartbeat_by_engine):
            info = meta.heartbeat_by_engine[engine_id]
            if engine_id not in self._handshaken:
                self._handshaken[engine_id] = None
                continue
            self.core.send_kv_heartbeat(self.fabric.engine_ids.get(engine_id, -1),
                                        tuple(sorted(info.req_ids)))

    def deliver(self, notice: KVDoneNotice | KVHeartbeat) -> None:
        """P: a notice arrived from the decode side (NIXL's notification queue)."""
        w = self.worker
        if isinstance(notice, KVHeartbeat):
            self.world.emit(self.core.c_core, None, 0, PdHeartbeat(list(notice.request_ids)))
            w.nixl_wrapper.pending.append(("HB:" + ",".join(notice.request_ids)).encode())
            return
        rid = notice.request_id
        # _get_new_notifs recognizes only IDs in _reqs_to_send or _reqs_to_process (:669-681)
        known = rid in w._reqs_to_send or rid in w._reqs_to_process
        self.world.emit(self.core.c_core, rid, notice.remote_inc,
                        PdNotice() if known else PdNoticeUnknown())
        w.nixl_wrapper.pending.append(f"{rid}:1".encode())

    # -- get_transfer_results -------------------------------------------------------------------

    def has_results(self) -> bool:
        w = self.worker
        if self._done or self._failed or w.nixl_wrapper.pending:
            return True
        expiry = self.next_expiry()
        return expiry is not None and expiry <= self.world.now

    def transfer_results(self, v: Any) -> Any:
        """The step's ``KVConnectorOutput``: finished_sending from vLLM's own notice and lease
        handling; finished_recving / failed_recving / invalid_block_ids modelled. Sets of IDs
        are insertion-ordered dicts, sorted: the scheduler iterates them."""
        w = self.worker
        sending = sorted(w._get_new_notifs())
        for rid in sending:
            self.causes[rid] = "notify"
        expired: set[str] = set()
        w._reap_expired_send_leases(expired)
        for rid in sorted(expired):
            self.causes.setdefault(rid, "timeout")
            sending.append(rid)
        done, failed = list(self._done), list(self._failed)
        self._done, self._failed = {}, {}
        invalid: set[int] = set()
        for rid in [*done, *failed]:
            meta = w._recving_metadata.pop(rid, None)
            assert meta is not None, f"{rid} not found in recving_metadata list"  # :3244-3245
            if rid in self._failed_set(failed):
                invalid.update(meta.local_block_ids[0])
        return v.KVConnectorOutput(finished_sending=dict.fromkeys(sending) or None,
                                   finished_recving=dict.fromkeys(done + failed) or None,
                                   failed_recving=dict.fromkeys(failed),
                                   invalid_block_ids=invalid)

    @staticmethod
    def _failed_set(failed: list[str]) -> dict[str, None]:
        return dict.fromkeys(failed)

    # -- waking the busy loop -------------------------------------------------------------------

    def next_expiry(self) -> float | None:
        sends = self.worker._reqs_to_send
        return float(min(sends.values())) if sends else None

    def next_heartbeat(self) -> float | None:
        s = self.scheduler
        if not s._heartbeat_by_engine or self._interval <= 0:
            return None
        last = s._last_heartbeat_time
        if last == -math.inf:
            return self.world.now
        # the first time at which build_connector_meta's "now - last >= interval" holds
        # (a float sum can land a hair short of it, base_scheduler.py:515-516)
        t = float(last + self._interval)
        while t - last < self._interval:
            t = math.nextafter(t, math.inf)
        return t
