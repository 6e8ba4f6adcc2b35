"""EngineCore: the model's engine core, its steps (sync and async scheduling) and its inputs.
Its P/D transfers (reads, push, Mooncake, the side channel) are :class:`PdCore`'s, in engine_pd.py.

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
from racesim.engine_model.engine_pd import PdCore
from racesim.engine_model.events.engine import EngineUtility
from racesim.engine_model.events.pd import PdLoadFailed
from racesim.engine_model.kv_cache import KVCacheManager
from racesim.engine_model.kv_connector import ConnectorScheduler
from racesim.engine_model.kv_mooncake import MooncakeSender
from racesim.engine_model.kv_push import PushMatcher
from racesim.engine_model.messages import AbortMessage, EngineCoreRequest, Token, UtilityMessage
from racesim.engine_model.request import Request, RequestStatus
from racesim.engine_model.runner import ModelRunner, carry_of
from racesim.engine_model.scheduler import Scheduler, SchedulerOutput
from racesim.engine_model.versions import VllmProfile
from racesim.sim.world import World

if TYPE_CHECKING:
    from racesim.engine_model.policies import LifecyclePolicy

__all__ = ["EngineCore"]

_Batch = tuple[simpy.Event, SchedulerOutput]
#: a step's transfer results: failed reads, reads done, sends done (ID, cause)
_KvResults = tuple[list[str], list[str], list[tuple[str, str]]]


class EngineCore(PdCore):
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
        self.runner = ModelRunner(world, f"{name}.runner", bool(config.async_scheduling),
                                  "runner-duplicate-row" in profile.features,
                                  carry_of(profile.features))
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
        self._kv_idle_blocks = "kv-idle-blocks" in profile.features
        #: 0.9.2/0.10.1.1 step_with_batch_queue (0.10.1.1 v1/engine/core.py:319-346): schedule
        #: only while the queue is not full, return after submitting a batch, and submit no
        #: batch without tokens, so its finished_req_ids never reach the runner (#23440);
        #: 0.11 submits every scheduled output (0.11.0 core.py:323-335)
        self._drops_empty = ("batch-queue-drops-empty" in profile.features
                             and self._max_batches > 1)
        self.push_mode = kv_connector == "nixl-push"
        self.mooncake_mode = kv_connector == "mooncake"
        self.transfer_time = transfer_time
        self.outputs = EngineOutputs(world, index, f"{name}.core")
        self.output_channels = self.outputs.channels
        self._batch_queue: deque[_Batch] = deque()
        self.start()

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
        return c is not None and self._kv_wakes_idle() and c.has_finished()

    def _kv_wakes_idle(self) -> bool:
        """Up to 0.20 a held request is in no queue, so an engine holding only such requests
        has none (has_requests: waiting, running or just finished; 0.10.1.1
        v1/core/sched/scheduler.py:1040-1044, 0.20.0 :1856-1869) and blocks on its input
        queue (0.10.1.1 v1/engine/core.py:722-731, 0.20.0 :1152-1158, 1174-1196): a notice
        or a timeout waits for the next request's step. 0.33 counts held requests
        (scheduler.py:3157-3165) and keeps stepping."""
        return not self._kv_idle_blocks or self.scheduler.has_requests()

    def _collect_kv_finished(self) -> _KvResults:
        """The worker's get_transfer_results, at the end of execute_model: failed reads, reads
        done, and sends done (update_from_output applies them later)."""
        c = self.connector
        if c is None:
            return [], [], []
        failed = c.take_failed_recving() if c.failed_recving else []
        done = c.get_finished()
        return failed, c.take_recved(), done

    def _apply_kv_failed(self, kv: _KvResults) -> None:
        """update_from_output's order: failed loads (scheduler.py:2292-2303, 2552-2579) before
        the step's model outputs; finished_recving and finished_sending (:3569-3582) after them
        (:2580-2582; 0.10.1.1 :895-898), so a request that finishes in this step is finished
        when a transfer's end frees its blocks."""
        failed = kv[0]
        if failed:
            self._kv_load_failed(failed)

    def _apply_kv_transfers_done(self, kv: _KvResults) -> None:
        """finished_recving, then finished_sending (after the step's model outputs)."""
        _failed, recved, done = kv
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
        drops = self._drops_empty
        if (sched.has_requests() or pending) and not (drops and len(queue) >= self._max_batches):
            out = sched.schedule()
            executed = out.total_num_scheduled_tokens > 0
            # with nothing to compute, execute_model still reports the connector's transfers
            # (kv_connector_no_forward, gpu_model_runner.py:3970-3971); before 0.11 the batch
            # queue drops such an output, finished_req_ids and all
            if executed or not drops and (out.num_scheduled_tokens or out.finished_req_ids
                                          or pending):
                queue.append((self._submit(out, executed), out))
                if executed and (drops or len(queue) < self._max_batches):
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
        self._apply_kv_failed(kv)
        results = sched.update_from_output(out, sampled)
        self._apply_kv_transfers_done(kv)
        self.outputs.step_outputs(results)
        return True

    def _submit(self, out: SchedulerOutput, executes: bool) -> simpy.Event:
        """execute_model(non_block=True): _update_states now, the forward pass on the GPU queue
        (``executes``: the batch has tokens to compute)."""
        return self._on_gpu(self.runner.execute_model(out), executes)
