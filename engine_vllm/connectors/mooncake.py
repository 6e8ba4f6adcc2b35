"""MooncakeConnector on the vllm backend: vLLM 0.33's own scheduler side and worker code.

All line numbers are 0.33.0's ``kv_connector/v1/mooncake/mooncake_connector.py``. Each engine's
``Scheduler`` builds vLLM's ``MooncakeConnector`` (``kv_connector = "MooncakeConnector"``) and
calls its ``MooncakeConnectorScheduler``. The worker is vLLM's ``MooncakeConnectorWorker`` on an
instance that holds the state its ``__init__`` sets (1225-1412: that constructor needs the native
``mooncake`` package, a CUDA device, torch.distributed's TP/PP groups, threads and sockets; one
TP and PP rank here), and these of its methods run as vLLM wrote them:

- ``register_kv_caches`` (2061-2282) on a one-layer CPU tensor of the scheduler's KV spec, with
  the simulated ``TransferEngine``'s ``batch_register_memory`` and a seeded ``secrets.randbits``;
- P: ``_mooncake_sender_listener`` (its ROUTER socket, ``register_worker_with_bootstrap`` with
  vLLM's own ``MooncakeBootstrapServer.register_worker``), its ``_sender_worker`` tasks,
  ``send_kv_to_decode`` (the ``reqs_need_send`` lookup by transfer_id, the ``ready`` wait with
  ``VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT``, ``_prepare_transfer_regions``,
  ``_build_transfer_params``, ``_send_blocks``, ``sent`` / ``need_send``, the response),
  ``record_send_reqs``, ``fetch_finished_sending_reqs``;
- D: ``_start_load_kv``, ``handle_new_engine_id``, ``_connect_to_prefiller_bootstrap`` (vLLM's
  own ``MooncakeBootstrapServer.query`` answers), ``receive_kv``,
  ``receive_kv_from_single_worker``, ``process_pulling_result``, ``_handle_failed_recv``;
- both: ``start_load_kv``, ``get_transfer_results`` / ``get_finished``,
  ``get_block_ids_with_load_errors``.

Simulated (connectors/mooncake_fakes.py, mooncake_loop.py): the TransferEngine, the sockets
(D's DEALER frames cross the ``pd.kv:notify`` channel to P's ROUTER, P's replies cross back on
it; the bootstrap query is an HTTP round trip at ``pd.mooncake:bootstrap``), the threads
(loops and executor as World tasks). What this module adds is only observation: it records
``pd.pull``, ``pd.hold``, ``pd.hold_lost`` and ``pd.push_write`` with each request's
ground-truth incarnation, read from the requests that own the blocks.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import threading
from typing import Any

from racesim.engine_model.events.pd import PdHold, PdHoldLost, PdPull, PdPushWrite, PdReadFailed
from racesim.engine_vllm.connectors import mooncake_fakes as fakes
from racesim.engine_vllm.connectors.mooncake_loop import MooncakeLoop
from racesim.engine_vllm.connectors.mooncake_state import install, new_worker

__all__ = ["MooncakeTransport", "mooncake_params", "ZmqFrames", "BOOTSTRAP"]

M = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector"
#: what the proxy gives the decode leg as ``remote_bootstrap_addr``: P's bootstrap server
BOOTSTRAP = "http://prefill:8998"


def mooncake_params(params: Any) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` vLLM's Mooncake proxy sends each leg
    (examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py): P's names the
    transfer_id; D's also P's engine ID and bootstrap address (what
    ``update_state_after_alloc`` requires, 1104-1120)."""
    if params is None:
        return None
    if params.do_remote_decode:
        return {"do_remote_decode": True, "do_remote_prefill": False,
                "transfer_id": params.transfer_id}
    if params.do_remote_prefill:
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_engine_id": "prefill", "remote_bootstrap_addr": BOOTSTRAP,
                "transfer_id": params.transfer_id}
    return None


@dataclasses.dataclass(frozen=True)
class ZmqFrames:
    """A DEALER/ROUTER message: D's ``MooncakeXferMetadata`` or P's ``MooncakeXferResponse``,
    msgpack bytes as vLLM encoded them; ``incs`` is ground truth riding beside (D's request
    ID -> incarnation)."""

    identity: bytes
    data: bytes
    incs: tuple[tuple[str, int], ...] = ()


class MooncakeTransport:
    """One engine's Mooncake worker: vLLM's own code, its native and I/O parts simulated."""

    def __init__(self, core: Any, engine_id: str, lease: int, transfer_time: float,
                 fabric: Any) -> None:
        self.core = core
        self.world = core.world
        self.engine_id = engine_id
        self.fabric = fabric
        self.component = f"{core.name}.connector"
        # read by send_kv_to_decode, record_send_reqs and fetch_finished_sending_reqs
        os.environ["VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT"] = str(int(lease))
        self.m = importlib.import_module(M)
        self.httpx = install(self.m, lambda: float(self.world.now))
        self.producer = engine_id == "prefill"
        self.loop = MooncakeLoop(self.world, f"{core.name}.mooncake", transfer_time,
                                 self._after_pass)
        self.loop.start()
        #: vLLM's MooncakeConnectorScheduler, which the engine's Scheduler calls
        self.scheduler = core.sched.connector.connector_scheduler
        #: P: why each finished-sending request is done ("pushed" or "timeout")
        self.causes: dict[str, str] = {}
        self._dealers: dict[bytes, fakes.Dealer] = {}
        #: P: each D session's requests and blocks, as its pulls named them
        self._sessions: dict[str, dict[str, tuple[list[int], int]]] = {}
        self.router: fakes.Router | None = None
        #: P: held blocks (each tail of a hold's list) -> the request whose KV they hold
        self._content: dict[tuple[int, ...], tuple[str, int]] = {}
        self.server: Any = None
        self.engine = fakes.TransferEngine(15000 + core.index, self._write)
        ctx = fakes.ZmqContext(self._new_router, self._new_dealer)
        rng = self.world.rng.stream(f"mooncake-layout/{core.name}")
        self.worker = new_worker(self.m, core, engine_id, self.engine, ctx, self.loop,
                                 rng.getrandbits)
        self._observe(self.worker)
        if self.producer:
            self._start_sender()

    # -- P: the bootstrap server and the sender listener ---------------------------------------

    def _start_sender(self) -> None:
        """What ``__init__`` (1352, the server on global rank 0) and ``register_kv_caches``'s
        tail (2282-2300, the listener on the sender loop) start."""
        m, w = self.m, self.worker
        self.server = m.MooncakeBootstrapServer("0.0.0.0", 8998)  # not started: no socket
        host, port = m.get_mooncake_bootstrap_addr(w.vllm_config)
        self.httpx.routes[m.make_zmq_path("http", host, port)] = self._serve_http
        self.httpx.routes[BOOTSTRAP] = self._serve_remote
        m.asyncio.run_coroutine_threadsafe(w._mooncake_sender_listener(threading.Event()),
                                           self.loop)

    async def _serve_http(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """The bootstrap server's routes (mooncake_utils.py:53-56), vLLM's own handlers."""
        from fastapi import HTTPException

        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_utils import (
            RegisterWorkerPayload,
        )

        if method == "POST" and path == "/register":
            try:
                return 200, await self.server.register_worker(RegisterWorkerPayload(**body))
            except HTTPException as exc:
                return exc.status_code, {"detail": exc.detail}
        workers = await self.server.query()
        return 200, {str(k): dataclasses.asdict(v) for k, v in workers.items()}

    def _new_router(self) -> fakes.Router:
        self.router = fakes.Router(self.loop, 17000 + self.core.index, self._reply)
        return self.router

    def _reply(self, identity: bytes, data: bytes) -> None:
        """P's ROUTER ``send_multipart`` (1778): the response crosses back to D."""
        resp = self.m.msgspec.msgpack.decode(data)
        # sorted: the lists follow asyncio.wait's done set, ordered by the tasks' addresses
        ids = sorted({*(resp.get("ok_reqs") or ()), *(resp.get("err_reqs") or ())})
        self._send(self.core.push_channels, ZmqFrames(identity, data), ids)

    # -- D: the DEALER and the bootstrap query --------------------------------------------------

    def _new_dealer(self, addr: str) -> fakes.Dealer:
        identity = f"{self.core.name}-{len(self._dealers) + 1}".encode()
        dealer = fakes.Dealer(self.loop, identity, addr, self._pull)
        self._dealers[identity] = dealer
        return dealer

    def _pull(self, dealer: fakes.Dealer, data: bytes) -> None:
        """D's DEALER ``send`` (2452): the pull reaches P's ROUTER."""
        meta = self.m.msgspec.msgpack.decode(data)
        requests = self.core.sched.requests
        incs = []
        remote = self.fabric.engine_ids.get("prefill", 0)
        for rid, (tid, groups) in meta["req_blocks"].items():
            inc = self.core.inc_of(requests.get(rid))
            incs.append((rid, inc))
            self.world.emit(self.component, rid, inc,
                            PdPull(remote, tid, list(groups[0]) if groups else []))
        self._send(self.core.notify_channels, ZmqFrames(dealer.identity, data, tuple(incs)),
                   [rid for rid, _ in incs])

    async def _serve_remote(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """D's ``GET /query`` (``_connect_to_prefiller_bootstrap``, 2585): an HTTP round trip
        to P's bootstrap server on its own connection, the ``pd.mooncake:bootstrap`` await
        point (two socket hops by default)."""
        hop = max((c.latency for c in self.core.push_channels.values()), default=0.0)
        delay = self.world.pause("pd.mooncake:bootstrap", 2 * hop, f"{self.core.name}.bootstrap")
        if delay > 0:
            await self.m.asyncio.sleep(delay)
        return await self._serve_http(method, path, body)

    def _send(self, channels: dict[int, Any], msg: Any, ids: list[str]) -> None:
        for engine in sorted(channels):
            channels[engine].send(msg, ids)

    # -- arrivals (the engine shell hands them over) --------------------------------------------

    def deliver(self, msg: Any) -> None:
        """P: a pull arrived from D."""
        if isinstance(msg, ZmqFrames) and self.router is not None:
            meta = self.m.msgspec.msgpack.decode(msg.data)
            session = f"{meta['remote_hostname']}:{meta['remote_port']}"
            incs = dict(msg.incs)
            known = self._sessions.setdefault(session, {})
            for rid, (_tid, groups) in meta["req_blocks"].items():
                known.pop(rid, None)  # the latest pull last: a block's newest owner wins
                known[rid] = (list(groups[0]) if groups else [], incs.get(rid, 0))
            self.router.arrive([msg.identity, msg.data])

    def deliver_write_notice(self, msg: Any) -> None:
        """D: P's response arrived."""
        if isinstance(msg, ZmqFrames):
            dealer = self._dealers.get(msg.identity)
            if dealer is not None:
                dealer.arrive(msg.data)

    # -- the write ------------------------------------------------------------------------------

    def _write(self, session: str, src: list[int], dst: list[int], lengths: list[int]) -> int:
        """``batch_transfer_sync_write``: P's blocks into D's, recorded as ``pd.push_write``
        naming the P request that owns the source blocks and the D request that asked for the
        destination ones."""
        w = self.worker
        base, size = w.kv_caches_base_addr[0], w.block_len_per_layer[0]
        d_base = self._remote_base.get(session, 0)
        pairs: list[tuple[int, int]] = []
        for s, d, n in zip(src, dst, lengths):
            pairs += [((s - base) // size + k, (d - d_base) // size + k)
                      for k in range(max(1, n // size))]
        # one pull can name several D requests (one schedule's): one record per D request
        groups: dict[str, tuple[int, list[tuple[int, int]]]] = {}
        known = self._sessions.get(session, {})
        for p_block, d_block in pairs:
            dest, dest_inc = next(((rid, inc) for rid, (blocks, inc) in reversed(known.items())
                                   if d_block in blocks), ("", 0))
            groups.setdefault(dest, (dest_inc, []))[1].append((p_block, d_block))
        # send_kv_to_decode takes the ready legs from asyncio.wait's done set (ordered by the
        # tasks' addresses): record them in the order the pull named them
        order = {rid: i for i, rid in enumerate(known)}
        for dest, (dest_inc, group) in sorted(groups.items(),
                                              key=lambda kv: order.get(kv[0], -1)):
            mine, theirs = [p for p, _ in group], [d for _, d in group]
            owner, inc = self._owner(mine)
            self.world.emit(self.component, owner, inc,
                            PdPushWrite(mine, self.fabric.engine_ids.get("decode", 1), dest,
                                        theirs, dest_inc, "transfer_id"))
        return 0

    @property
    def _remote_base(self) -> dict[str, int]:
        """Each D session's registered KV base, from the layouts its pulls carried."""
        out: dict[str, int] = {}
        for key, (_local, remote) in self.worker._layout_by_peer.items():
            if remote:
                out[f"{key[0]}:{key[1]}"] = remote[0].base_addr
        for key, (_local, remote, _err) in self.worker._prepared_transfer_regions.items():
            if remote:
                out.setdefault(f"{key[0]}:{key[1]}", remote[0].base_addr)
        return out

    def _owner(self, blocks: list[int]) -> tuple[str, int]:
        """Whose KV ``blocks`` hold: the request holding them, or, once freed (a second D
        request written from an entry whose first write already freed it), the request last
        held for transfer in them."""
        sched = self.core.sched
        for rid, req in sched.requests.items():
            held = sched.kv_cache_manager.get_block_ids(rid)
            if held and blocks and set(blocks) <= set(held[0]):
                return rid, self.core.inc_of(req)
        return self._content.get(tuple(blocks), ("", 0))

    # -- observing the sender's bookkeeping -----------------------------------------------------

    def _observe(self, w: Any) -> None:
        """``record_send_reqs``, observed: ``pd.hold`` for each finish it records, and
        ``pd.hold_lost`` for the finished requests an exception leaves unrecorded (its future
        is never read, 2718-2729)."""
        real = w.record_send_reqs

        async def record_send_reqs(metadata: Any) -> None:
            before = {t: (e.p_req_id, e.ready.is_set()) for t, e in w.reqs_need_send.items()}
            try:
                await real(metadata)
            except Exception as exc:
                self._recorded(metadata, before, f"{type(exc).__name__}: {exc}")
                raise
            self._recorded(metadata, before, "")

        w.record_send_reqs = record_send_reqs
        real_failed = w._handle_failed_recv

        def _handle_failed_recv(pull_metas: Any, req_ids: Any, reason: str) -> None:
            requests = self.core.sched.requests
            for rid in sorted(req_ids):  # err_reqs follow asyncio.wait's done set
                meta = pull_metas.get(rid)
                if meta is not None and not meta.failed and any(meta.local_block_ids):
                    self.world.emit(self.component, rid, self.core.inc_of(requests.get(rid)),
                                    PdReadFailed(""))
            real_failed(pull_metas, req_ids, reason)

        w._handle_failed_recv = _handle_failed_recv

    def _recorded(self, metadata: Any, before: dict[str, tuple[str, bool]],
                  error: str) -> None:
        """``pd.hold`` for each finish its entry still names after the batch; ``pd.hold_lost``
        for one a later finish of the batch overwrote, and, after an exception, for those
        never recorded (from the ``KeyError``'s finish on) and an owner whose ready entry
        ``reqs_not_processed`` popped (``assert not send_meta.ready.is_set()``, 2714-2716)."""
        table, requests = self.worker.reqs_need_send, self.core.sched.requests
        items = [(rid, tid, blocks) for rid, (tid, blocks) in metadata.reqs_to_send.items()
                 if blocks]
        upto = len(items)
        if error.startswith("KeyError"):
            upto = next((k for k, (_r, tid, _b) in enumerate(items) if tid not in table), upto)
        out: dict[str, Any] = {}
        for k, (rid, tid, blocks) in enumerate(items):
            entry = table.get(tid)
            if k < upto and entry is not None and entry.p_req_id == rid \
                    and entry.local_block_ids is blocks:
                out[rid] = PdHold(list(blocks[0]), float(entry.expire_time))
                inc = self.core.inc_of(requests.get(rid))
                for n in range(1, len(blocks[0]) + 1):  # a write takes D's count from the end
                    self._content[tuple(blocks[0][-n:])] = (rid, inc)
            elif k < upto and entry is not None and entry.p_req_id:
                out[rid] = PdHoldLost(tid, f"overwritten by {entry.p_req_id!r}")
            else:
                out[rid] = PdHoldLost(tid, error)
        for tid in sorted(metadata.reqs_not_processed) if error else ():
            owner, ready = before.get(tid, ("", False))
            if ready and owner and tid not in table:
                out.setdefault(owner, PdHoldLost(tid, error))
        for rid, record in out.items():
            self.world.emit(self.component, rid, self.core.inc_of(requests.get(rid)), record)

    # -- the engine thread ----------------------------------------------------------------------

    def before_schedule(self) -> None:
        pass

    def start_load_kv(self, meta: Any) -> None:
        # record_send_reqs pops reqs_not_processed, a set of strings, in hash order: sorted
        # here, so a run is the same under any PYTHONHASHSEED (a dict iterates as a set would)
        meta.reqs_not_processed = dict.fromkeys(sorted(meta.reqs_not_processed))
        self.worker.start_load_kv(meta)

    def _after_pass(self) -> None:
        if self.core.dead is None and self.has_results():
            self.core.wake()

    def has_results(self) -> bool:
        w = self.worker
        if w.finished_sending_reqs or w.finished_recving_reqs or not w._failed_recv_reqs.empty() \
                or not w._invalid_block_ids.empty():
            return True
        expiry = self.next_expiry()
        return expiry is not None and expiry <= self.world.now

    def transfer_results(self, v: Any) -> Any:
        """vLLM's own ``get_transfer_results`` and ``get_block_ids_with_load_errors``, as
        kv_connector_model_runner_mixin.py packs them; sets sorted (the scheduler iterates
        them)."""
        w = self.worker
        now = self.world.now
        expiring = {e.p_req_id for e in w.reqs_need_send.values()
                    if e.p_req_id and e.expire_time < now and e.sending == 0}
        results = w.get_transfer_results()
        invalid = w.get_block_ids_with_load_errors()
        for rid in sorted(results.finished_sending):
            self.causes.setdefault(rid, "timeout" if rid in expiring else "pushed")
        return v.KVConnectorOutput(
            finished_sending=dict.fromkeys(sorted(results.finished_sending)) or None,
            finished_recving=dict.fromkeys(sorted(results.finished_recving)) or None,
            failed_recving=dict.fromkeys(sorted(results.failed_recving)),
            invalid_block_ids=invalid)

    def next_expiry(self) -> float | None:
        """When ``fetch_finished_sending_reqs`` next frees an owned entry (``expire_time <
        now``: the first instant after it)."""
        times = [e.expire_time for e in self.worker.reqs_need_send.values()
                 if e.p_req_id and e.sending == 0 and e.expire_time < math.inf]
        return math.nextafter(min(times), math.inf) if times else None

    def next_heartbeat(self) -> float | None:
        return None  # Mooncake has no heartbeats
