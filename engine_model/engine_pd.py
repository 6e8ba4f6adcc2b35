"""EngineCore's P/D side: the KV connector's transfers between a prefill and a decode engine.

The decode side reads P's blocks (NIXL pull), registers its own blocks for P to write (NIXL push)
or asks P's sender for them (Mooncake); the prefill side takes the side channel's notices and
heartbeats. What the step does with the transfers' results is :class:`EngineCore`'s
(engine_core.py); the busy loop around both is :class:`EngineShell`.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from racesim.engine_model.engine_shell import EngineShell
from racesim.engine_model.events.pd import (
    PdHeartbeat,
    PdNotice,
    PdNoticeUnknown,
    PdPull,
    PdPushFailed,
    PdPushNotPosted,
    PdPushRegister,
    PdPushWrite,
    PdRead,
    PdReadFailed,
)
from racesim.engine_model.kv_cache import KVCacheManager
from racesim.engine_model.kv_mooncake import pull_result
from racesim.engine_model.kv_push import PushMatch
from racesim.engine_model.messages import (
    KVDoneNotice,
    KVHeartbeat,
    KVPullRequest,
    KVPullResult,
    KVPushRegistration,
    KVTransferParams,
)
from racesim.engine_model.request import Request, RequestStatus
from racesim.engine_model.scheduler import Scheduler

__all__ = ["PdCore"]


class PdCore(EngineShell):
    """The transfers of one engine core; :class:`EngineCore` sets these parts in its
    ``__init__`` (declared here so that compiled code knows their types)."""

    kv: KVCacheManager
    scheduler: Scheduler
    #: NIXL push mode: D registers its blocks with P, and P writes into them;
    #: Mooncake: D asks P for the transfer_id's KV, and P writes into D's blocks.
    push_mode: bool
    mooncake_mode: bool
    transfer_time: float
    # -- sockets --------------------------------------------------------------------------------

    def deliver_kv_notice(self, notice: KVDoneNotice | KVHeartbeat | KVPullRequest
                          | KVPushRegistration) -> None:
        """Prefill side: the decode side's transfer-done notice or heartbeat (NIXL side
        channel)."""
        if self.dead is not None or self.connector is None:
            return
        if isinstance(notice, KVHeartbeat):
            self.world.emit(self.c_core, None, 0, PdHeartbeat(list(notice.request_ids)))
            self.connector.extend_lease(notice.request_ids)
            return
        if isinstance(notice, KVPushRegistration):
            if self.connector.push is not None:
                self.connector.push.add_registration(notice)
            return
        if isinstance(notice, KVPullRequest):
            if self.connector.mooncake is not None:
                self.connector.mooncake.pull(notice)
            return
        rid = notice.request_id
        if not self.connector.recognizes(rid, self.scheduler.requests.get(rid)):
            self.world.emit(self.c_core, rid, notice.remote_inc, PdNoticeUnknown())
            return
        self.world.emit(self.c_core, rid, notice.remote_inc, PdNotice())
        self.connector.notice(rid)
        self._wake_loop()

    # -- P/D decode side ------------------------------------------------------------------------

    def _start_kv_read(self, request: Request) -> None:
        self.world.env.process(self._kv_read(request))

    def _kv_read(self, request: Request) -> Generator[simpy.Event, Any, None]:
        world = self.world
        if self.push_mode:
            self._push_register(request)
            return
        if self.mooncake_mode:
            self._mooncake_pull(request)
            return
        params = request.kv_transfer_params
        assert params is not None
        ev = world.sleep("pd.kv:read", self.transfer_time, f"{self.name}.connector")
        if ev is not None:
            yield ev
        if self.dead is not None:
            return
        if request.fault == "kv-load":
            # The read ended without the blocks (failed_recving); no done-notice reaches P,
            # whose hold then ends with its lease (the notice path on failure: unverified).
            world.emit(f"{self.name}.connector", request.request_id, request.inc,
                       PdReadFailed(params.remote_request_id))
            assert self.connector is not None
            self.connector.finished_recving[request.request_id] = None
            self.connector.failed_recving[request.request_id] = None
            self._wake_loop()
            return
        world.emit(f"{self.name}.connector", request.request_id, request.inc,
                   PdRead(params.remote_engine, params.remote_request_id,
                          list(params.remote_block_ids), params.remote_inc))
        assert self.connector is not None
        self.connector.finished_recving[request.request_id] = None
        self._wake_loop()
        channel = self.notify_channels.get(params.remote_engine)
        if channel is not None:
            channel.send(KVDoneNotice(params.remote_request_id, params.remote_inc),
                         [params.remote_request_id], remote_inc=params.remote_inc)

    def _send_notice(self, params: KVTransferParams) -> None:
        """D: the transfer-done notice of a request that ended before its read (#19223)."""
        channel = self.notify_channels.get(params.remote_engine)
        if channel is not None:
            channel.send(KVDoneNotice(params.remote_request_id, params.remote_inc),
                         [params.remote_request_id], remote_inc=params.remote_inc)

    def _send_heartbeat(self, engine: int, remote_ids: list[str]) -> None:
        channel = self.notify_channels.get(engine)
        if channel is not None:
            channel.send(KVHeartbeat(tuple(remote_ids)), remote_ids)

    # -- P/D, NIXL push mode --------------------------------------------------------------------

    def _push_register(self, request: Request) -> None:
        """D: register the blocks just allocated for ``request`` with P (a PUSH_REG keyed by
        D's own ID, push_scheduler.py:177-189); the load completes when P's WRITE notifies."""
        params = request.kv_transfer_params
        assert params is not None
        blocks = self.kv.get_block_ids(request.request_id)
        self.world.emit(f"{self.name}.connector", request.request_id, request.inc,
                        PdPushRegister(params.remote_engine, list(blocks)))
        channel = self.notify_channels.get(params.remote_engine)
        if channel is not None:
            channel.send(KVPushRegistration(request.request_id, self.index, tuple(blocks),
                                            request.inc, request.fault == "kv-load"),
                         [request.request_id])

    def _mooncake_pull(self, request: Request) -> None:
        """D: ask P's sender for the transfer_id's KV into the blocks just allocated
        (``_reqs_need_recv`` -> ``receive_kv``, mooncake_connector.py:1110-1124, 2622-2654)."""
        params = request.kv_transfer_params
        assert params is not None
        rid = request.request_id
        blocks = tuple(self.kv.get_block_ids(rid))
        self.world.emit(f"{self.name}.connector", rid, request.inc,
                        PdPull(params.remote_engine, params.transfer_id, list(blocks)))
        channel = self.notify_channels.get(params.remote_engine)
        if channel is not None:
            channel.send(KVPullRequest(rid, params.transfer_id, self.index, blocks,
                                       request.inc), [rid])

    def _send_pull_result(self, msg: KVPullRequest, ok: bool) -> None:
        channel = self.push_channels.get(msg.engine)
        if channel is not None:
            channel.send(pull_result(msg, ok), [msg.request_id], remote_inc=msg.inc)

    def _start_push(self, match: PushMatch) -> None:
        self.world.env.process(self._push_write(match))

    def _push_write(self, match: PushMatch) -> Generator[simpy.Event, Any, None]:
        """P: WRITE the matched request's blocks into D's registered blocks; the WRITE's
        notification names D's request (push_worker.py:681, 740). P's hold ends when the WRITE
        is done, unless its lease ran out first (push_worker.py:820-837)."""
        world = self.world
        component = f"{self.name}.connector"
        reg = match.registration
        if len(reg.blocks) > len(match.blocks):
            # base_worker.py:3791 asserts D's count <= P's; the writer thread's handler logs
            # the AssertionError and carries on (push_worker.py:305-306): both entries were
            # popped, so this pair is never written.
            world.emit(component, match.request_id, match.inc,
                       PdPushFailed(len(match.blocks), reg.request_id, len(reg.blocks), reg.inc))
            return
        if reg.write_fails:
            # make_prepped_xfer / transfer raise: vLLM logs transfer_setup_failed, adds P's ID
            # to _send_failures and posts no handle (push_worker.py:732-765), so no WRITE ends
            # P's hold (:820-837; it ends with its lease) and no notification reaches D.
            world.emit(component, match.request_id, match.inc,
                       PdPushNotPosted(reg.request_id, reg.inc))
            return
        # A partial prefix hit on D: only P's last len(D's) blocks are written (:3787-3793).
        blocks = match.blocks[len(match.blocks) - len(reg.blocks):]
        ev = world.sleep("pd.kv:push", self.transfer_time, component)
        if ev is not None:
            yield ev
        if self.dead is not None:
            return
        world.emit(component, match.request_id, match.inc,
                   PdPushWrite(list(blocks), reg.engine, reg.request_id, list(reg.blocks),
                               reg.inc, match.how))
        connector = self.connector
        assert connector is not None
        if connector.reqs_need_send.pop(match.request_id, None) is not None:
            connector.done_sending[match.request_id] = "pushed"
            self._wake_loop()
        channel = self.push_channels.get(reg.engine)
        if channel is not None:
            channel.send(KVDoneNotice(reg.request_id, reg.inc), [reg.request_id],
                         remote_inc=reg.inc)

    def deliver_push_done(self, notice: KVDoneNotice | KVHeartbeat | KVPullResult) -> None:
        """D: P's WRITE into ``notice.request_id``'s blocks completed; an unknown ID is
        logged and dropped (push_worker.py:785-793). With Mooncake, a failed pull is a failed
        load (``_handle_failed_recv``, mooncake_connector.py:2498-2541)."""
        if self.dead is not None or self.connector is None or isinstance(notice, KVHeartbeat):
            return
        if isinstance(notice, KVPullResult):
            req = self.scheduler.requests.get(notice.request_id)
            if not notice.ok and req is not None:
                self.world.emit(f"{self.name}.connector", notice.request_id, notice.inc,
                                PdReadFailed(""))
                self.connector.failed_recving[notice.request_id] = None
            notice = KVDoneNotice(notice.request_id, notice.inc)
        rid = notice.request_id
        req = self.scheduler.requests.get(rid)
        if req is None or req.status not in (RequestStatus.WAITING_FOR_REMOTE_KVS,
                                             RequestStatus.FINISHED_ABORTED):
            self.world.emit(self.c_core, rid, notice.remote_inc, PdNoticeUnknown())
            return
        self.connector.finished_recving[rid] = None
        self._wake_loop()
