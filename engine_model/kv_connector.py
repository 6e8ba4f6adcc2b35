"""NixlConnector's lifecycle, scheduler side, for P/D disaggregation (vLLM #20139, #25067).

Prefill (P): a ``do_remote_decode`` request that finishes with a status the profile holds
(LENGTH_CAPPED; in 0.33 also STOPPED, nixl/pull_scheduler.py:235-244) keeps its blocks and its
``Scheduler.requests`` entry until the decode side's notice or the hold's end
(``_reqs_need_send``, keyed by ID). Decode (D): a ``do_remote_prefill`` request allocates blocks,
waits in WAITING_FOR_REMOTE_KVS while the worker reads P's blocks, notifies P, then decodes.

The hold is the vLLM profile's: a fixed timeout (480 s, #25897), or in 0.33 a lease
(``kv_lease_duration``, 30 s, #41383) that D's scheduler renews with heartbeats every lease//6
seconds while it waits for the blocks (nixl/base_scheduler.py:202-241, 513-518), each extending
it to now + ``kv_lease_duration * 2 // 3`` (nixl/base_worker.py:627-631, 3380-3397): 20 s at the
default 30 s lease.

In push mode (``[pd] connector = "nixl-push"``) the holds are the same; the pairing of P's held
blocks with D's registration is :class:`racesim.engine_model.kv_push.PushMatcher`'s. With
``connector = "mooncake"`` P's holds and their pairing are
:class:`racesim.engine_model.kv_mooncake.MooncakeSender`'s, and D sends no heartbeats.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from racesim.engine_model.events.pd import PdHold, PdRecvStart
from racesim.engine_model.kv_cache import KVCacheManager
from racesim.engine_model.kv_mooncake import MooncakeSender
from racesim.engine_model.kv_push import PushMatcher
from racesim.engine_model.messages import KVTransferParams
from racesim.engine_model.request import Request, RequestStatus
from racesim.engine_model.versions import VllmProfile
from racesim.sim.world import World

__all__ = ["ConnectorScheduler"]


class ConnectorScheduler:
    """The NIXL connector's scheduler side, for one engine (prefill or decode)."""

    __slots__ = ("world", "component", "engine_index", "kv", "hold_timeout", "reqs_need_send",
                 "finished_recving", "done_sending", "_start_read", "_lease", "_hb_interval",
                 "_extension", "_heartbeat", "_last_heartbeat", "_send_heartbeat", "_handshaken",
                 "_free_on_recv", "failed_recving", "_held_finishes", "push", "mooncake",
                 "decoder_ttl", "_abort_notify", "_recving", "_notify_pending", "_send_notice",
                 "recv_ready", "idle_step")

    def __init__(self, world: World, component: str, engine_index: int, kv: KVCacheManager,
                 hold_timeout: float, start_read: Callable[[Request], None],
                 profile: VllmProfile,
                 send_heartbeat: Callable[[int, list[str]], None] | None = None,
                 send_notice: Callable[[KVTransferParams], None] | None = None) -> None:
        self.world = world
        self.component = component
        self.engine_index = engine_index
        self.kv = kv
        self.hold_timeout = hold_timeout
        self.reqs_need_send: dict[str, float] = {}      # P: ID -> expiry time
        self.finished_recving: dict[str, None] = {}     # D: IDs whose read the worker ended
        #: D: reads the scheduler has been told of (finished_recving_kv_req_ids)
        self.recv_ready: dict[str, None] = {}
        self.failed_recving: dict[str, None] = {}       # D: IDs whose read failed
        self.done_sending: dict[str, str] = {}          # P: IDs to release -> cause
        self._start_read = start_read
        self._lease = profile.pd_hold == "lease"
        self._held_finishes = profile.pd_held_finishes
        # Both follow the lease in use (nixl/base_scheduler.py:88, base_worker.py:631). vLLM
        # refuses no lease: under 6 s the interval is 0, a heartbeat at every schedule()
        # (base_scheduler.py:513-518: now - last >= 0), and under 2 s the extension is 0.
        self._hb_interval = float(int(hold_timeout) // 6)
        self._extension = float(int(hold_timeout) * 2 // 3)
        #: the shortest wait of the idle loop for a heartbeat (the engine's step_time): vLLM's
        #: busy loop steps while a request waits for remote KV, many times per step_time when
        #: nothing is scheduled; the model wakes once per step_time instead, so an interval of
        #: 0 does not wake it again at the same instant for ever (a modelling floor)
        self.idle_step = 0.0
        #: P's engines a heartbeat has gone to: the first one to each only starts the NIXL
        #: handshake and is not sent, but still takes the throttle slot (base_worker.py:3520-3532)
        self._handshaken: dict[int, None] = {}
        #: D: local ID -> (P's engine, P's request ID), while the blocks are awaited.
        self._heartbeat: dict[str, tuple[int, str]] = {}
        # vLLM starts from 0.0 on a perf_counter clock, so the first heartbeat goes at once.
        self._last_heartbeat = -math.inf
        self._send_heartbeat = send_heartbeat
        #: D: aborted requests whose blocks are freed when their read completes.
        self._free_on_recv: dict[str, Request] = {}
        #: P, NIXL push mode: the writer thread's pairing of held blocks with registrations.
        self.push: PushMatcher | None = None
        #: P, MooncakeConnector: the sender loop's table keyed by transfer_id.
        self.mooncake: MooncakeSender | None = None
        #: D with bidirectional_kv_xfer: how long a finished request is kept (None: not kept).
        self.decoder_ttl: float | None = None

        #: D (#19223): a request that ends before its read started still notifies P, with no
        #: blocks to read, at the next schedule() (nixl/pull_scheduler.py:219-230 in 0.33).
        self._abort_notify = "pd-abort-notify" in profile.features
        self._send_notice = send_notice
        #: D: the requests whose read has started, by ID (the object tells incarnations apart)
        self._recving: dict[str, Request] = {}
        self._notify_pending: list[KVTransferParams] = []

    def use_mooncake(self, sender: MooncakeSender | None) -> None:
        """MooncakeConnector on this engine (``sender``: P's): no lease, no heartbeats."""
        self._lease = False
        self.mooncake = sender

    # -- prefill side ---------------------------------------------------------------------------

    def request_finished(self, request: Request) -> tuple[bool, KVTransferParams | None]:
        if self.mooncake is not None:
            return self._mooncake_finished(request, self.mooncake), None
        if not request.do_remote_decode:
            self._heartbeat.pop(request.request_id, None)
            started = self._recving.pop(request.request_id, None) is request
            params = request.kv_transfer_params
            if (self._abort_notify and params is not None and params.do_remote_prefill
                    and not started and not request.remote_kv_ready):
                self._notify_pending.append(params)
            if self.decoder_ttl is None or params is None:
                return False, None
            return self._decoder_hold(request, self.decoder_ttl), None
        if request.status not in self._held_finishes:
            return False, None  # aborted (or not held here): _reqs_not_processed, free now
        blocks = self.kv.get_block_ids(request.request_id)
        if not blocks:
            return False, None
        expiry = self.world.now + self.hold_timeout
        self.reqs_need_send[request.request_id] = expiry
        self.world.emit(self.component, request.request_id, request.inc, PdHold(blocks, expiry))
        if self.push is not None:
            self.push.add_finished(request.request_id, tuple(blocks), request.inc)
        return True, KVTransferParams(do_remote_prefill=True, remote_engine=self.engine_index,
                                      remote_request_id=request.request_id,
                                      remote_block_ids=tuple(blocks), remote_inc=request.inc)

    def _decoder_hold(self, request: Request, ttl: float) -> bool:
        """D, bidirectional KV transfer (nixl/pull_scheduler.py:232-269): a request that
        finished LENGTH_CAPPED or STOPPED keeps its blocks for a turn-2 read-back, for a plain
        ``decoder_kv_blocks_ttl`` (no lease), or until a reader's notice names it."""
        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED,
                                  RequestStatus.FINISHED_STOPPED):
            return False
        blocks = self.kv.get_block_ids(request.request_id)
        if not blocks:
            return False
        expiry = self.world.now + ttl
        self.reqs_need_send[request.request_id] = expiry
        self.world.emit(self.component, request.request_id, request.inc, PdHold(blocks, expiry))
        return True

    def _mooncake_finished(self, request: Request, sender: MooncakeSender) -> bool:
        """mooncake_connector.py:1186-1219: P holds only a LENGTH_CAPPED finish with blocks;
        any other finish of a request with a transfer_id drops its entry ("not processed")."""
        params = request.kv_transfer_params
        if params is None or not params.transfer_id or not request.do_remote_decode:
            return False
        if request.status != RequestStatus.FINISHED_LENGTH_CAPPED:
            sender.not_processed(params.transfer_id)
            return False
        blocks = self.kv.get_block_ids(request.request_id)
        if not blocks:
            return False
        sender.finished_held(request.request_id, params.transfer_id, tuple(blocks), request.inc)
        return True

    def after_alloc(self, request: Request) -> None:
        """``update_state_after_alloc`` for a request the scheduler just admitted: with
        Mooncake, P queues its transfer_id so that its sender creates the entry
        (mooncake_connector.py:1130-1136)."""
        params = request.kv_transfer_params
        if self.mooncake is not None and params is not None and params.do_remote_decode:
            self.mooncake.after_alloc(request.request_id, params.transfer_id, request.inc)

    def recognizes(self, request_id: str, request: Request | None) -> bool:
        """Whether a transfer-done notice names a request this side knows.

        NIXL's worker looks the ID up in ``_reqs_to_send`` and ``_reqs_to_process``; a notice
        for neither (say, its hold timed out) is logged as "Potentially invalid KV blocks for
        unrecognized request" and dropped, and the prefill engine lives on.
        """
        return request_id in self.reqs_need_send or (
            request is not None and request.do_remote_decode)

    def notice(self, request_id: str) -> None:
        """The decode side's "<id>:<n>" arrived (keyed by ID only)."""
        self.reqs_need_send.pop(request_id, None)
        self.done_sending[request_id] = "notify"

    def extend_lease(self, request_ids: tuple[str, ...]) -> None:
        """A heartbeat from D: each named hold now ends no sooner than now + lease * 2 // 3
        (base_worker.py:631, 3388-3392)."""
        until = self.world.now + self._extension
        for rid in request_ids:
            expiry = self.reqs_need_send.get(rid)
            if expiry is not None and until > expiry:
                self.reqs_need_send[rid] = until

    def next_expiry(self) -> float | None:
        if self.mooncake is not None:
            return self.mooncake.next_expiry()
        return min(self.reqs_need_send.values(), default=None)

    def has_finished(self) -> bool:
        """Whether the worker has a transfer result to report now: a notice, a read done or
        failed, or a hold whose time is up."""
        if self.done_sending or self.failed_recving or self.finished_recving:
            return True
        if self.mooncake is not None and self.mooncake.finished:
            return True
        expiry = self.next_expiry()
        return expiry is not None and expiry <= self.world.now

    def take_recved(self) -> list[str]:
        """D: the reads the worker ended since the last step (finished_recving)."""
        done = list(self.finished_recving)
        self.finished_recving.clear()
        return done

    def recv_freed(self, request_id: str) -> bool:
        """D: a request aborted while its read was in flight: its blocks go now."""
        return self._free_on_recv.pop(request_id, None) is not None

    def get_finished(self) -> list[tuple[str, str]]:
        """IDs whose hold ends now: notified ones, then expired ones (with a warning in
        vLLM)."""
        now = self.world.now
        for rid, expiry in list(self.reqs_need_send.items()):
            if expiry <= now:
                del self.reqs_need_send[rid]
                self.done_sending[rid] = "timeout"
                if self.push is not None:
                    self.push.evict(rid)
        if self.mooncake is not None:
            self.mooncake.expire()
            self.done_sending.update(self.mooncake.take_finished())
        done = list(self.done_sending.items())
        self.done_sending.clear()
        return done

    # -- decode side ----------------------------------------------------------------------------

    def on_new_request(self, request: Request) -> None:
        """D (lease profiles): heartbeat P for this request until its blocks arrive."""
        params = request.kv_transfer_params
        if self._lease and params is not None and params.do_remote_prefill:
            self._heartbeat[request.request_id] = (params.remote_engine,
                                                   params.remote_request_id)

    def next_heartbeat(self) -> float | None:
        """When the next heartbeat is due (None: nothing to renew). vLLM's busy loop keeps
        stepping while a request waits for remote KV, so heartbeats go out on time even
        though nothing is scheduled; the model wakes its loop for them instead."""
        if not self._heartbeat or self._send_heartbeat is None:
            return None
        return self._last_heartbeat + max(self._hb_interval, self.idle_step)

    def build_meta(self) -> None:
        """Each schedule(): with Mooncake, hand this schedule's metadata to P's sender loop;
        the notices of requests that ended before their read (the worker sends them as a read
        with no blocks, pull_worker.py:49-75), then the heartbeats that are due, throttled to
        one per interval."""
        if self.mooncake is not None:
            self.mooncake.flush()
        if self._notify_pending:
            pending, self._notify_pending = self._notify_pending, []
            if self._send_notice is not None:
                for params in pending:
                    self._send_notice(params)
        send = self._send_heartbeat
        due = None if not self._heartbeat or send is None else \
            self._last_heartbeat + self._hb_interval  # vLLM's throttle, on every schedule()
        now = self.world.now
        # The loop wakes at ``due`` computed as now + (due - now), which floating point may
        # land a hair short of: within a nanosecond counts as due.
        if due is None or send is None or now < due - 1e-9:
            return
        self._last_heartbeat = now
        by_engine: dict[int, list[str]] = {}
        for engine, remote_id in self._heartbeat.values():
            by_engine.setdefault(engine, []).append(remote_id)
        for engine in sorted(by_engine):
            if engine not in self._handshaken:
                self._handshaken[engine] = None
                continue
            send(engine, by_engine[engine])

    def recv_done(self, request: Request) -> bool:
        """Whether the scheduler knows the read into ``request``'s blocks has completed (and
        forget that it has; scheduler.py:3017-3024)."""
        return self.recv_ready.pop(request.request_id, 0) is None

    def free_when_received(self, request: Request) -> None:
        self._heartbeat.pop(request.request_id, None)
        self._free_on_recv[request.request_id] = request

    def start_recv(self, request: Request) -> None:
        self._recving[request.request_id] = request
        self.world.emit(self.component, request.request_id, request.inc, PdRecvStart())
        self._start_read(request)

    def take_failed_recving(self) -> list[str]:
        """D: the IDs whose read failed since the last call; they need no more heartbeats."""
        failed = list(self.failed_recving)
        self.failed_recving.clear()
        for rid in failed:
            self._heartbeat.pop(rid, None)
        return failed

    def take_finished_recving(self, request: Request) -> bool:
        rid = request.request_id
        if rid not in self.recv_ready:
            return False
        del self.recv_ready[rid]
        self._heartbeat.pop(rid, None)
        request.remote_kv_ready = True
        request.status = RequestStatus.WAITING
        # The last prompt token is recomputed locally so that D samples the next token.
        request.num_computed_tokens = request.prompt_tokens - 1
        return True
