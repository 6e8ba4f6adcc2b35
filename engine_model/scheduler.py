"""Scheduler (vllm/v1/core/sched/scheduler.py and async_scheduler.py), keyed by request ID.

``requests`` is a dict keyed by the ID string. What an ADD for an ID already there does is the
vLLM profile's: before #28973 it overwrites the entry without a check (``waiting``/``running``
hold Request objects, so the overwritten object keeps running while the dict points at the new
one); in 0.33 it asserts "duplicate request id" and the engine dies.
"""

from __future__ import annotations

from racesim.engine_model.events.engine import SchedFinish, SchedPreempt, SchedStep, SchedUpdate
from racesim.engine_model.fatal import EngineFatal, checked_get
from racesim.engine_model.messages import EngineCoreOutput, Token
from racesim.engine_model.request import Request, RequestStatus
from racesim.engine_model.sched_output import NewRequestData, SchedulerOutput
from racesim.engine_model.sched_requests import SchedulerRequests
from racesim.engine_model.sessions import chunk_stopped, kv_holding_end

__all__ = ["Scheduler", "SchedulerOutput", "NewRequestData"]

_NONE: list[int] = []


class Scheduler(SchedulerRequests):
    """vLLM's Scheduler: requests by ID, waiting and running queues, the KV manager. Adding,
    finishing and freeing are :class:`SchedulerRequests`' (sched_requests.py); here, a step."""

    __slots__ = ()

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
