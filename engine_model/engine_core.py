"""EngineCore: the model's engine core, its steps (sync and async scheduling) and its inputs.

The process around it (input thread, busy loop, GPU queue, death) is :class:`EngineShell`, which
applies queued inputs only between steps, then steps: schedule -> execute -> update_from_output
-> send outputs. With ``async_scheduling`` the batch queue holds two steps, so step N+1 is
scheduled before step N's output is applied (``step_with_batch_queue`` in
vllm/v1/engine/core.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import simpy

from racesim.engine_model.config import EngineConfig
from racesim.engine_model.engine_outputs import EngineOutputs
from racesim.engine_model.engine_shell import EngineShell
from racesim.engine_model.events.engine import EngineUtility
from racesim.engine_model.events.pd import (
    PdHeartbeat,
    PdLoadFailed,
    PdNotice,
    PdNoticeUnknown,
    PdPull,
    PdPushFailed,
    PdPushRegister,
    PdPushWrite,
    PdRead,
    PdReadFailed,
)
from racesim.engine_model.kv_cache import KVCacheManager
from racesim.engine_model.kv_connector import ConnectorScheduler
from racesim.engine_model.kv_mooncake import MooncakeSender, pull_result
from racesim.engine_model.kv_push import PushMatch, PushMatcher
from racesim.engine_model.messages import (
    AbortMessage,
    EngineCoreRequest,
    KVDoneNotice,
    KVHeartbeat,
    KVPullRequest,
    KVPullResult,
    KVPushRegistration,
    KVTransferParams,
    Token,
    UtilityMessage,
)
from racesim.engine_model.request import Request, RequestStatus
from racesim.engine_model.runner import ModelRunner
from racesim.engine_model.scheduler import Scheduler, SchedulerOutput
from racesim.engine_model.versions import VllmProfile
from racesim.sim.world import World

if TYPE_CHECKING:
    from racesim.engine_model.policies import LifecyclePolicy

__all__ = ["EngineCore"]

_Batch = tuple[simpy.Event, SchedulerOutput]
#: a step's transfer results: failed reads, reads done, sends done (ID, cause)
_KvResults = tuple[list[str], list[str], list[tuple[str, str]]]


class EngineCore(EngineShell):
    """One engine process. ``index`` is its position in the system (0 = prefill under P/D)."""

    def __init__(self, world: World, index: int, name: str, config: EngineConfig,
                 policy: LifecyclePolicy, profile: VllmProfile, *,
                 hold_timeout: float | None = None, transfer_time: float = 0.0,
                 kv_connector: str = "nixl-pull") -> None:
        super().__init__(world, index, name, config, profile)
        self.policy = policy
        self.kv = KVCacheManager(world, f"{name}.kv", config.num_blocks, config.block_size,
                                 bool(config.prefix_caching), profile.free_order)
        self.kv.hash_by_id = "block-hashes-by-id" in profile.features
        self.scheduler = Scheduler(world, f"{name}.scheduler", config, self.kv, profile)
        self.runner = ModelRunner(world, f"{name}.runner", bool(config.async_scheduling))
        if hold_timeout is not None:
            self.connector = ConnectorScheduler(world, f"{name}.connector", index, self.kv,
                                                hold_timeout, self._start_kv_read, profile,
                                                self._send_heartbeat, self._send_notice)
            self.connector.idle_step = config.step_time
            self.scheduler.connector = self.connector
            if kv_connector == "nixl-push":
                self.connector.push = PushMatcher(self._start_push)
            elif kv_connector == "mooncake":
                self.connector.use_mooncake(None if index else MooncakeSender(
                    world, f"{name}.connector", hold_timeout, transfer_time,
                    lambda: self.dead is not None, self._send_pull_result, self._wake_loop))
        #: NIXL push mode: D registers its blocks with P, and P writes into them;
        #: Mooncake: D asks P for the transfer_id's KV, and P writes into D's blocks.
        self.push_mode = kv_connector == "nixl-push"
        self.mooncake_mode = kv_connector == "mooncake"
        self.transfer_time = transfer_time
        self.outputs = EngineOutputs(world, index, f"{name}.core")
        self.output_channels = self.outputs.channels
        self._batch_queue: deque[_Batch] = deque()
        self.start()

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

    # -- the shell's hooks ----------------------------------------------------------------------

    def _preprocess(self, msg: EngineCoreRequest) -> Request:
        return Request(msg)

    def _reject(self, rid: str, inc: int, client: int, why: str) -> None:
        self.outputs.reject(rid, inc, client, why)

    def _has_work(self) -> bool:
        return self.scheduler.has_requests() or bool(self._batch_queue) or self._kv_pending()

    def _kv_pending(self) -> bool:
        """The connector's worker has a transfer result to report (vLLM's busy loop keeps
        stepping while requests are held or wait for KV, so the next step reports it)."""
        c = self.connector
        return c is not None and c.has_finished()

    def _collect_kv_finished(self) -> _KvResults:
        """The worker's get_transfer_results, at the end of execute_model: failed reads, reads
        done, and sends done (update_from_output applies them later)."""
        c = self.connector
        if c is None:
            return [], [], []
        failed = c.take_failed_recving() if c.failed_recving else []
        done = c.get_finished()
        return failed, c.take_recved(), done

    def _apply_kv_finished(self, kv: _KvResults) -> None:
        """update_from_output's order: failed loads (scheduler.py:2292-2303, 2552-2579), then
        finished_recving and finished_sending (:3569-3582)."""
        failed, recved, done = kv
        if failed:
            self._kv_load_failed(failed)
        connector = self.connector
        sched = self.scheduler
        for rid in recved:
            assert connector is not None
            req = sched.requests.get(rid)
            if req is not None and req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                connector.recv_ready[rid] = None  # finished_recving_kv_req_ids
            elif connector.recv_freed(rid):
                sched.finish_kv_transfers([rid], "recv-done")  # aborted while reading
        for rid, cause in done:
            sched.finish_kv_transfers([rid], cause)

    def _kv_load_failed(self, request_ids: list[str]) -> None:
        """Failed remote KV reads (scheduler.py:3682-3694, 2556-2575): policy "fail" finishes
        each request with an ERROR output; "recompute" drops its blocks and prefills the whole
        prompt locally (:3476-3497)."""
        sched = self.scheduler
        recompute = self.config.kv_load_failure_policy == "recompute"
        for rid in request_ids:
            req = sched.requests.get(rid)
            if req is None or req.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
                continue
            self.world.emit(self.c_core, rid, req.inc,
                            PdLoadFailed("recompute" if recompute else "fail"))
            if not recompute:
                finished = sched.finish_requests([rid], RequestStatus.FINISHED_ERROR,
                                                 "kv-load-failure")
                self.outputs.note_finished(finished)
                self.outputs.finish(finished, "error")
                continue
            self.kv.free(req)
            req.num_computed_tokens = 0
            req.remote_kv_ready = True
            req.status = RequestStatus.WAITING

    def _apply_input(self, kind: str, payload: Any) -> None:
        if kind == "add":
            if self.reject_new_requests and payload.request_id not in self.scheduler.requests:
                # core.py:1796-1813: paused in "abort" mode, a new ADD gets a retryable ERROR.
                self.outputs.reject(payload.request_id, payload.inc, payload.client_index,
                                      "engine-paused")
                return
            self.scheduler.add_request(payload)
            if payload.fault == "abort-immediately":
                # core.py:558-562: added, then aborted at once so the KV connector's
                # request_finished runs (notify_kv_transfer_request_rejected)
                self._abort(AbortMessage((payload.request_id,), 0), "abort-immediately")
        elif kind == "abort":
            self._abort(payload, "abort")
        else:
            self._utility(payload)

    def _abort(self, msg: AbortMessage, cause: str) -> None:
        finished = self.scheduler.finish_requests(msg.request_ids, RequestStatus.FINISHED_ABORTED,
                                                  cause, msg.tag)
        if self.outputs.finished_by_client is not None:
            self.outputs.note_finished(finished)
        # bool(): a third-party policy may set the flag to 1, which compiled code would refuse
        if finished and bool(self.policy.engine_final_abort):
            # njhill's proposal in #15326: a final "abort" output for every aborted request.
            self.outputs.finish(finished, "abort")

    def _utility(self, msg: UtilityMessage) -> None:
        """pause_generation / resume_scheduler on this engine (core.py:2181-2237)."""
        sched = self.scheduler
        self.world.emit(self.c_core, None, 0, EngineUtility(msg.method, msg.mode))
        if msg.method != "pause_generation":
            sched.pause_state = "UNPAUSED"
            self.reject_new_requests = False
            return
        if msg.mode == "abort":
            # finish_requests(None, FINISHED_ABORTED), then _send_abort_outputs (:2202-2206).
            finished = sched.finish_requests(list(sched.requests), RequestStatus.FINISHED_ABORTED,
                                             "pause")
            self.outputs.note_finished(finished)
            if finished:
                self.outputs.finish(finished, "abort")
        sched.pause_state = "PAUSED_ALL" if msg.mode == "keep" else "PAUSED_NEW"
        self.reject_new_requests = msg.mode != "keep"

    def _abort_all_for_fault(self) -> None:
        """on_fault (engine_core_sentinel.py:89-90): every request finished ABORTED, an ABORT
        output to each one's client (as pause_generation(mode="abort") does)."""
        sched = self.scheduler
        finished = sched.finish_requests(list(sched.requests), RequestStatus.FINISHED_ABORTED,
                                         "fault")
        self.outputs.note_finished(finished)
        if finished:
            self.outputs.finish(finished, "abort")

    def _drain_batches(self) -> list[int]:
        steps = [out.step for _future, out in self._batch_queue]
        self._batch_queue.clear()
        return steps

    # -- steps ----------------------------------------------------------------------------------

    def _step(self) -> Generator[simpy.Event, Any, bool]:
        """One pass of step / step_with_batch_queue. Returns whether anything ran."""
        world = self.world
        sched = self.scheduler
        queue = self._batch_queue
        executed = False
        pending = self._kv_pending()
        if sched.has_requests() or pending:
            out = sched.schedule()
            # with nothing to compute, execute_model still reports the connector's transfers
            # (kv_connector_no_forward, gpu_model_runner.py:3970-3971)
            if out.num_scheduled_tokens or out.finished_req_ids or pending:
                executed = out.total_num_scheduled_tokens > 0
                queue.append((self._submit(out, executed), out))
                if executed and len(queue) < self._max_batches:
                    return True  # async: do not block on the step in flight
            elif not queue:
                return False
        elif not queue:
            return False
        future, out = queue.popleft()
        if not future.processed:
            yield future
        sampled: dict[str, Token] = future.value or {}
        # the KV connector's output rides with the step's ModelRunnerOutput (gpu_model_runner
        # get_kv_connector_output): what finished by the end of execute_model
        kv = self._collect_kv_finished()
        if self.aborts_queue:
            # vLLM #29987: aborts are also applied just before update_from_output.
            self._process_aborts_queue()
        ev = world.sleep("engine.step:update_from_output", 0.0, self.c_core)
        if ev is not None:
            yield ev
        self._apply_kv_finished(kv)
        results = sched.update_from_output(out, sampled)
        self.outputs.step_outputs(results)
        return True

    def _submit(self, out: SchedulerOutput, executes: bool) -> simpy.Event:
        """execute_model(non_block=True): _update_states now, the forward pass on the GPU queue
        (``executes``: the batch has tokens to compute)."""
        return self._on_gpu(self.runner.execute_model(out), executes)

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
                                            request.inc), [request.request_id])

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
