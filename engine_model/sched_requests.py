"""The scheduler's request table (vllm/v1/core/sched/scheduler.py): what an ADD, an abort and a
finished transfer do to ``requests``, the queues and the blocks. Its steps, ``schedule`` and
``update_from_output``, are :class:`Scheduler`'s (scheduler.py), which is what the engine uses.
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
)
from racesim.engine_model.events.pd import PdRelease
from racesim.engine_model.fatal import EngineFatal, checked_del
from racesim.engine_model.kv_cache import KVCacheManager
from racesim.engine_model.messages import KVTransferParams
from racesim.engine_model.request import Request, RequestStatus
from racesim.engine_model.sessions import add_to_session, open_session
from racesim.engine_model.versions import VllmProfile, get_profile
from racesim.sim.world import World

if TYPE_CHECKING:
    from racesim.engine_model.kv_connector import ConnectorScheduler

__all__ = ["SchedulerRequests"]


class SchedulerRequests:
    """vLLM's Scheduler's state and its request table: requests by ID, waiting and running
    queues, the KV manager; adding, finishing and freeing. :class:`Scheduler` steps it."""

    __slots__ = ("world", "component", "config", "kv", "requests", "waiting", "running",
                 "finished_req_ids", "connector", "pause_state", "_step", "_async",
                 "_assert_duplicate", "_free_after_recv", "num_waiting_for_streaming_input",
                 "_reabort_held", "_xfer_unknown_warns")

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
        #: before #25067: an ABORT re-finishes a finished request held for transfer
        self._reabort_held = "reabort-held" in profile.features
        #: #25844 (0.11 only): finished_sending for an unknown ID is a warning, not a crash
        self._xfer_unknown_warns = "xfer-unknown-warns" in profile.features

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
            if req is None or (req.is_finished() and not self._reabort_held):
                # vLLM #25067: an ABORT for a finished request held for transfer is ignored.
                # Before it (0.10.1.1 v1/core/sched/scheduler.py:999, 0.11.0 :1126), only an
                # unknown ID was: the held request was finished again as ABORTED, and
                # _free_request, asking the connector again, freed its blocks at once.
                self.world.emit(self.component, rid, req.inc if req is not None else 0,
                                SchedAbortMiss(cause, tag))
                continue
            if req.is_finished():  # before #25067: the hold ends here, its blocks freed below
                self.world.emit(self.component, rid, req.inc, PdRelease("abort", req.status))
            elif req.status == RequestStatus.RUNNING:
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
                if self._xfer_unknown_warns:
                    continue  # 0.11.0 scheduler.py:1291-1294 logs a warning
                if self._reabort_held:  # 0.10.1.1 scheduler.py:1161: self.requests[req_id]
                    raise EngineFatal(f"KeyError: {rid!r}")
                raise EngineFatal(f"AssertionError: finished_sending {rid!r} not in requests")
            req = self.requests[rid]
            self.world.emit(self.component, rid, req.inc, PdRelease(cause, req.status))
            self._free_blocks(req)
