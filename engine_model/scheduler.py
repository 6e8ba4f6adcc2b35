"""Scheduler (vllm/v1/core/sched/scheduler.py and async_scheduler.py), keyed by request ID.

``requests`` is a dict keyed by the ID string. What an ADD for an ID already there does is the
vLLM profile's: before #28973 it overwrites the entry without a check (``waiting``/``running``
hold Request objects, so the overwritten object keeps running while the dict points at the new
one); in 0.33 it asserts "duplicate request id" and the engine dies.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from racesim.engine_model.config import EngineConfig
from racesim.engine_model.events.engine import (
    SchedAbortMiss,
    SchedAdd,
    SchedDuplicate,
    SchedFinish,
    SchedPreempt,
    SchedStep,
    SchedUpdate,
)
from racesim.engine_model.events.pd import PdRelease
from racesim.engine_model.fatal import EngineFatal, checked_del, checked_get
from racesim.engine_model.kv_cache import KVCacheManager
from racesim.engine_model.messages import EngineCoreOutput, KVTransferParams, Token
from racesim.engine_model.request import Request, RequestStatus
from racesim.engine_model.sched_output import NewRequestData, SchedulerOutput
from racesim.engine_model.sessions import (
    add_to_session,
    chunk_stopped,
    kv_holding_end,
    open_session,
)
from racesim.engine_model.versions import VllmProfile, get_profile
from racesim.sim.world import World

if TYPE_CHECKING:
    from racesim.engine_model.kv_connector import ConnectorScheduler

__all__ = ["Scheduler", "SchedulerOutput", "NewRequestData"]

_NONE: list[int] = []


class Scheduler:
    """vLLM's Scheduler: requests by ID, waiting and running queues, the KV manager."""

    __slots__ = ("world", "component", "config", "kv", "requests", "waiting", "running",
                 "finished_req_ids", "connector", "pause_state", "_step", "_async",
                 "_assert_duplicate", "_free_after_recv", "num_waiting_for_streaming_input")

    def __init__(self, world: World, component: str, config: EngineConfig,
                 kv: KVCacheManager, profile: VllmProfile | None = None) -> None:
        if profile is None:
            profile = get_profile(config.vllm)
        self.world = world
        self.component = component
        self.config = config
        self.kv = kv
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        #: sessions waiting for input: out of ``running``, yet each holds a model-runner slot
        #: that counts against max_num_seqs (scheduler.py:1070-1074)
        self.num_waiting_for_streaming_input = 0
        self.running: list[Request] = []
        # An ordered set (a dict), shipped to the model runner with the next step.
        self.finished_req_ids: dict[str, None] = {}
        self.connector: ConnectorScheduler | None = None
        #: vLLM 0.33 PauseState (scheduler.py:489): "UNPAUSED", "PAUSED_NEW" (waiting requests
        #: stay queued) or "PAUSED_ALL" (nothing is scheduled, :723-725, 1050-1066).
        self.pause_state = "UNPAUSED"
        self._step = 0
        self._async = bool(config.async_scheduling)
        self._assert_duplicate = profile.duplicate_add == "assert"
        self._free_after_recv = profile.remote_kv_abort == "free-after-recv"

    # -- inputs ---------------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        rid = request.request_id
        prev = self.requests.get(rid)
        if prev is not None and self._assert_duplicate:
            if add_to_session(self, prev, request):
                return
            # vLLM 0.33 scheduler.py:2931-2936: a non-streaming duplicate fails an assert, which
            # _handle_client_request does not catch: the engine dies.
            self.world.emit(self.component, rid, request.inc, SchedDuplicate(prev.inc))
            raise EngineFatal(f"AssertionError: duplicate request id {rid!r}")
        if request.resumable:
            open_session(request)
        # vLLM before #28973: no duplicate check; the dict entry is overwritten.
        self.waiting.append(request)
        self.requests[rid] = request
        if self.connector is not None:
            self.connector.on_new_request(request)
        self.world.emit(self.component, rid, request.inc,
                        SchedAdd(prev.inc if prev is not None else 0))

    def finish_requests(self, request_ids: tuple[str, ...] | list[str], status: str,
                        cause: str, tag: int = 0) -> list[Request]:
        """Abort path: end whatever request each ID maps to *now*."""
        finished = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None or req.is_finished():
                # vLLM #25067: an ABORT for a finished request held for transfer is ignored.
                self.world.emit(self.component, rid, req.inc if req is not None else 0,
                                SchedAbortMiss(cause, tag))
                continue
            if req.status == RequestStatus.RUNNING:
                self._remove_running(req)
            elif req.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
                self.num_waiting_for_streaming_input -= 1  # in no queue (scheduler.py:3002)
            else:
                self._remove_waiting(req)
            # vLLM 0.33 scheduler.py:3017-3025: a read into this request's blocks has started
            # and not finished, so they are freed when it reports done, not now.
            delay_free = (self._free_after_recv
                          and req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                          and self.connector is not None
                          and not self.connector.recv_done(req))
            req.status = status
            self.world.emit(self.component, rid, req.inc, SchedFinish(status, cause, tag))
            if delay_free:
                assert self.connector is not None
                self.finished_req_ids[rid] = None
                self.connector.free_when_received(req)
            else:
                self._free_request(req)
            finished.append(req)
        return finished

    def _remove_running(self, req: Request) -> bool:
        for i, r in enumerate(self.running):
            if r is req:
                del self.running[i]
                return True
        return False

    def _remove_waiting(self, req: Request) -> None:
        for i, r in enumerate(self.waiting):
            if r is req:
                del self.waiting[i]
                return

    def has_requests(self) -> bool:
        if self.num_waiting_for_streaming_input:
            return self._has_requests_with_sessions()
        return bool(self.waiting) or bool(self.running) or bool(self.finished_req_ids)

    def _has_requests_with_sessions(self) -> bool:
        """get_num_unfinished_requests (scheduler.py:3147-3155): vLLM queues each session
        waiting for input and subtracts its counter. A counter over by one (a chunk's stopping
        output applied twice, the in-flight count being the ID's) hides a waiting request, and
        the engine stops stepping."""
        held = sum(1 for r in self.requests.values()
                   if r.status == RequestStatus.WAITING_FOR_STREAMING_REQ)
        unfinished = (len(self.waiting) + len(self.running) + held
                      - self.num_waiting_for_streaming_input)
        return unfinished > 0 or bool(self.finished_req_ids)

    def live_ids(self) -> list[tuple[str, str, int]]:
        """``(table, request ID, incarnation)`` for every request still held: ``requests``,
        then ``queues`` (waiting, then running). Read by the checker's leak audit."""
        held = [("requests", rid, req.inc) for rid, req in self.requests.items()]
        held += [("queues", req.request_id, req.inc) for req in list(self.waiting) + self.running]
        return held

    # -- freeing --------------------------------------------------------------------------------

    def _free_request(self, request: Request) -> KVTransferParams | None:
        self.finished_req_ids[request.request_id] = None
        delay_free = False
        params = None
        if self.connector is not None:
            delay_free, params = self.connector.request_finished(request)
        if not delay_free:
            self._free_blocks(request)
        return params

    def _free_blocks(self, request: Request) -> None:
        if not request.is_finished():
            raise EngineFatal(f"AssertionError: _free_blocks of {request.request_id!r} which is "
                              f"{request.status}")
        self.kv.free(request)
        checked_del(self.requests, request.request_id, "Scheduler.requests")  # type: ignore[arg-type]

    def finish_kv_transfers(self, request_ids: list[str], cause: str) -> None:
        """_update_from_kv_xfer_finished on the prefill side: the held blocks can go."""
        for rid in request_ids:
            if rid not in self.requests:
                raise EngineFatal(f"AssertionError: finished_sending {rid!r} not in requests")
            req = self.requests[rid]
            self.world.emit(self.component, rid, req.inc, PdRelease(cause, req.status))
            self._free_blocks(req)

    # -- schedule -------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        self._step += 1
        out = SchedulerOutput(self._step)
        budget = self.config.max_num_batched_tokens
        admit = True
        if self.pause_state != "UNPAUSED":
            admit = False
            if self.pause_state == "PAUSED_ALL":
                budget = 0
        kv = self.kv
        running = self.running
        is_async = self._async

        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            if is_async and len(req.output) + req.num_output_placeholders >= req.max_tokens:
                i += 1
                continue
            n = min(req.num_tokens + req.num_output_placeholders - req.num_computed_tokens, budget)
            if n <= 0:
                i += 1
                continue
            scheduled = True
            while not kv.allocate_slots(req, n):
                victim = running.pop()
                self._preempt(victim)
                if victim is req:
                    scheduled = False
                    break
            if not scheduled:
                break
            out.scheduled_cached_reqs.append(req.request_id)
            self._note(out, req, n)
            budget -= n
            i += 1

        connector = self.connector
        caching = kv.caching
        skipped: list[Request] = []
        waiting = self.waiting
        limit = self.config.max_num_seqs - self.num_waiting_for_streaming_input
        while admit and waiting and budget > 0 and len(running) < limit:
            req = waiting[0]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                assert connector is not None
                if not connector.take_finished_recving(req):
                    skipped.append(waiting.popleft())
                    continue
            elif req.do_remote_prefill and not req.remote_kv_ready and connector is not None:
                # D side: allocate for the prompt and start reading P's blocks.
                if not kv.allocate_slots(req, req.prompt_tokens, delay_cache=True):
                    break
                req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                connector.start_recv(req)
                skipped.append(waiting.popleft())
                continue
            elif req.num_stale_output_tokens and not req.drop_stale_output:
                # scheduler.py:1084-1088: output from before a preemption is still in flight;
                # resuming now could resample a position it later delivers.
                skipped.append(waiting.popleft())
                continue
            computed = (kv.get_computed_blocks(req) if caching and req.num_computed_tokens == 0
                        else _NONE)
            hit = len(computed) * kv.block_size
            n = min(req.num_tokens - req.num_computed_tokens - hit, budget)
            if not kv.allocate_slots(req, n, computed):
                break
            if hit:
                # scheduler.py:1537, 1573: the prefix hit counts as computed
                req.num_computed_tokens = hit
            waiting.popleft()
            resumed = req.status == RequestStatus.PREEMPTED
            req.status = RequestStatus.RUNNING
            running.append(req)
            if connector is not None:
                connector.after_alloc(req)  # vLLM 0.33 scheduler.py:1482 update_state_after_alloc
            if resumed:
                out.scheduled_cached_reqs.append(req.request_id)
            else:
                out.scheduled_new_reqs.append(NewRequestData(
                    req.request_id, req.inc, req.prompt_tokens, req.eos_at,
                    req.num_computed_tokens))
            self._note(out, req, n)
            budget -= n
        waiting.extendleft(reversed(skipped))

        out.finished_req_ids = list(self.finished_req_ids)
        self.finished_req_ids = {}
        if connector is not None:
            connector.build_meta()
        self._update_after_schedule(out)
        if out.num_scheduled_tokens or out.finished_req_ids:
            self.world.emit(self.component, None, 0, SchedStep(
                out.step,
                [[r.request_id, r.inc, out.num_scheduled_tokens.get(r.request_id, 0)]
                 for r in out.scheduled_objects],
                out.finished_req_ids))
        return out

    def _note(self, out: SchedulerOutput, req: Request, n: int) -> None:
        rid = req.request_id
        out.num_scheduled_tokens[rid] = n
        out.num_computed_tokens[rid] = req.num_computed_tokens
        out.scheduled_objects.append(req)

    def _preempt(self, req: Request) -> None:
        """scheduler.py:1799-1843: free the blocks, reset the computed tokens, and put the
        request at the front of waiting (behind those holding blocks) to be recomputed. Output
        still in flight (async) is marked stale: delivered on return, it must not touch the
        reset counters."""
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        stale = req.num_in_flight_tokens
        # an undrained dropped share stays dropped (scheduler.py:1832-1834)
        req.drop_stale_output = req.drop_stale_output and req.num_stale_output_tokens > 0
        req.num_stale_output_tokens = stale
        req.num_output_placeholders = 0
        self.waiting.insert(kv_holding_end(self.waiting), req)
        self.world.emit(self.component, req.request_id, req.inc,
                        SchedPreempt(stale if stale else None))

    def _update_after_schedule(self, out: SchedulerOutput) -> None:
        # Keyed by ID, as in vLLM: with two objects under one ID only the dict's one advances.
        requests = self.requests
        for rid, n in out.num_scheduled_tokens.items():
            req = requests.get(rid)
            if req is None:  # vLLM: self.requests[req_id], a KeyError
                checked_get(requests, rid, "Scheduler.requests")  # type: ignore[arg-type]
                continue
            req.num_computed_tokens += n
            if self._async:
                req.num_in_flight_tokens += n
                if req.num_computed_tokens >= req.num_tokens + req.num_output_placeholders:
                    req.num_output_placeholders += 1

    # -- update_from_output ---------------------------------------------------------------------

    def update_from_output(self, out: SchedulerOutput,
                           sampled: dict[str, Token]) -> list[tuple[int, EngineCoreOutput]]:
        """Apply a step's sampled tokens to whatever request each ID maps to now."""
        results: list[tuple[int, EngineCoreOutput]] = []
        applied = []
        requests = self.requests
        is_async = self._async
        for rid, n in out.num_scheduled_tokens.items():
            req = requests.get(rid)
            if req is None or req.is_finished():
                continue
            token = sampled.get(rid)
            stale = False
            if is_async:
                # scheduler.py:2313-2323: in-flight counts drain; output from before a
                # preemption is stale: delivered, but it leaves the reset counters alone
                req.num_in_flight_tokens -= n
                if req.num_stale_output_tokens > 0:
                    stale = True
                    req.num_stale_output_tokens -= n
                    if req.num_stale_output_tokens < 0:  # another request's step, by ID
                        raise EngineFatal(
                            f"AssertionError: num_stale_output_tokens >= 0 for {rid!r}")
                elif token is not None and req.num_output_placeholders > 0:
                    # scheduler.py:2766-2769 resolves placeholders only while there are some:
                    # a step scheduled before a preemption reset them (to 0) and not marked
                    # stale (another request's step under this ID drained the stale count)
                    # leaves them at 0, with no assert; one token a step never drives them
                    # below 0.
                    req.num_output_placeholders -= 1
            if token is None:
                continue  # a partial prefill chunk samples nothing
            if stale and req.drop_stale_output:
                continue  # scheduler.py:2337-2339: a session's finished chunk, dropped
            req.output.append(token)
            applied.append([rid, req.inc, token.inc, token.ctx])
            reason = None
            if token.eos:
                req.status = RequestStatus.FINISHED_STOPPED
            elif len(req.output) >= req.max_tokens:
                req.status = RequestStatus.FINISHED_LENGTH_CAPPED
            params = None
            if req.is_finished():
                reason = RequestStatus.FINISH_REASON[req.status]
                if not self._remove_running(req) and is_async:
                    # a preempted request stopped by its stale output leaves waiting
                    # (scheduler.py:2486-2489, stopped_preempted_reqs)
                    self._remove_waiting(req)
                if req.streaming_queue is not None and chunk_stopped(self, req):
                    # a session's chunk ended; the session goes on
                    results.append((req.client_index, EngineCoreOutput(
                        rid, (token,), reason, None, req.inc, True)))
                    continue
                self.world.emit(self.component, rid, req.inc, SchedFinish(req.status, reason))
                params = self._free_request(req)
            results.append((req.client_index,
                            EngineCoreOutput(rid, (token,), reason, params, req.inc)))
        if out.scheduled_objects:
            self.world.emit(self.component, None, 0, SchedUpdate(out.step, applied))
        return results
