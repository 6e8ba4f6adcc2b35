"""OutputProcessor (vllm/v1/engine/output_processor.py): the API server's per-request state.

``request_states`` is keyed by the (internal) request ID and is local to one API-server process
(vLLM #27711). What an add for an ID already there does is the vLLM profile's: "already
running" (0.8), or in 0.33 the old stream ends with STREAM_FINISHED and the new request is not
registered (``finish_stream``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from racesim.engine_model.events.frontend import (
    FeAbortIssue,
    FeAdd,
    FeDrop,
    FeError,
    FeOutput,
    FePop,
    FeStats,
)
from racesim.engine_model.frontend.outputs import (
    CompletionOutput,
    RequestOutput,
    RequestOutputCollector,
)
from racesim.engine_model.frontend.request_state import ParentRequest, RequestState
from racesim.engine_model.messages import EngineCoreOutput, EngineCoreRequest, FinishReason, Token
from racesim.engine_model.versions import VllmProfile
from racesim.sim.world import World

if TYPE_CHECKING:
    from racesim.engine_model.frontend.hooks import LifecycleHooks

__all__ = ["OutputProcessor", "RequestState", "ParentRequest", "AlreadyRunning"]


class AlreadyRunning(Exception):
    """ValueError("Request id ... already running.") from OutputProcessor.add_request."""


class OutputProcessor:
    """One API server's request states, keyed by internal request ID."""

    def __init__(self, world: World, component: str, policy: LifecycleHooks,
                 profile: VllmProfile) -> None:
        self.world = world
        self.component = component
        self.policy = policy
        self.request_states: dict[str, RequestState] = {}
        self.parent_requests: dict[str, ParentRequest] = {}
        self.external_req_ids: dict[str, list[str]] = {}
        #: 0.33 output_processor.py:627: an unknown external ID aborts nothing; before, an
        #: abort's ID was looked up as given.
        self._unknown_external_noop = profile.abort_unknown_external == "noop"
        self.finishes_duplicates = profile.frontend_duplicate == "finish-old"
        #: 0.33 output_processor.py:620-661: an abort by external ID pops the children's
        #: states but not their parent's parent_requests entry.
        self._external_abort_keeps_parent = profile.external_abort_parent == "keep"
        #: before 0.10 (#22283) an abort made here gave the client no final output
        self._abort_final_output = profile.abort_final_output
        #: under data parallelism each state's engine is the load balancer's choice, and the
        #: trace names it where an abort is issued (for the checker).
        self.dp = False

    # -- add ------------------------------------------------------------------------------------

    def add_request(self, request: EngineCoreRequest, parent: ParentRequest | None, index: int,
                    collector: RequestOutputCollector, client_uid: int, engine: int,
                    stop_string_at: int | None) -> RequestState:
        rid = request.request_id
        if rid in self.request_states:
            raise AlreadyRunning(rid)
        state = RequestState(rid, request.external_req_id, index, parent, collector, request.inc,
                             client_uid, engine, stop_string_at)
        self.request_states[rid] = state
        top = parent.request_id if parent is not None else rid
        ids = self.external_req_ids.setdefault(request.external_req_id, [])
        if top not in ids:
            ids.append(top)
        if parent is not None:
            self.parent_requests[parent.request_id] = parent
            parent.child_requests.append(rid)
            parent.incs.append(request.inc)
        self.world.emit(self.component, rid, request.inc,
                        FeAdd(client_uid, request.external_req_id, index,
                              dp_engine=engine if self.dp else None))
        return state

    def has_request(self, request_id: str) -> bool:
        return request_id in self.request_states

    def inc_of(self, request_id: str) -> int:
        return self.request_states[request_id].inc

    def engine_of(self, request_id: str) -> int:
        return self.request_states[request_id].engine

    def open_session(self, request_id: str) -> None:
        """The first chunk of a streaming-input session was registered."""
        state = self.request_states[request_id]
        state.streaming_input = True
        state.input_chunk_queue = deque()

    def streaming_update(self, request: EngineCoreRequest) -> None:
        """``_update_streaming_request_state`` (output_processor.py:695-726): an add for an ID
        still here. A non-resumable one is the session's end, or, for a request that is no
        session (or whose last chunk the engine finished), ends its stream at once."""
        state = self.request_states[request.request_id]
        queue = state.input_chunk_queue
        if not request.resumable:
            if queue is None:
                self._end_stream(state)
            elif queue:
                queue[-1] = True
            else:
                state.streaming_input = False
            return
        if queue is None:
            state.streaming_input = True
            state.input_chunk_queue = deque()
        else:
            queue.append(False)

    def finish_stream(self, request: EngineCoreRequest) -> None:
        """vLLM 0.33 ``add_request`` of an ID that is still here, not resumable: the same
        ``_update_streaming_request_state`` (output_processor.py:672-713). For a request that
        is no session, or a session waiting for input, the old state is dropped with no stats
        and its stream ends with STREAM_FINISHED; a session with a chunk running takes the add
        as its final one (:708-711)."""
        self.streaming_update(request)

    def _end_stream(self, state: RequestState) -> None:
        if not state.finished:
            if state.parent is None:
                self._deliver(state, [], FinishReason.STREAM_FINISHED)
            else:
                # n > 1: STREAM_FINISHED (finished=True) goes straight into the queue the
                # children share (output_processor.py:703-707), not through ParentRequest, so
                # the parent's stream ends at its first child's same-ID add.
                state.collector.put(RequestOutput(
                    state.external_req_id,
                    [CompletionOutput(state.index, [], FinishReason.STREAM_FINISHED)], True))
                self.world.emit(self.component, state.request_id, state.inc,
                                FeOutput(0, FinishReason.STREAM_FINISHED))
        self._pop(state, "stream-finished")

    def live_ids(self) -> list[tuple[str, int]]:
        """``(request ID, incarnation)`` for every request state still held."""
        return [(rid, state.inc) for rid, state in self.request_states.items()]

    def orphan_parents(self) -> list[tuple[str, int]]:
        """``(parent ID, a child's incarnation)`` for every ``parent_requests`` entry none of
        whose children has a state left."""
        held = {id(s.parent) for s in self.request_states.values() if s.parent is not None}
        return [(pid, p.incs[0] if p.incs else 0) for pid, p in self.parent_requests.items()
                if id(p) not in held]

    def orphan_external_ids(self) -> list[str]:
        """The external IDs still mapped whose internal IDs are all gone."""
        return [ext for ext, ids in self.external_req_ids.items()
                if not any(r in self.request_states or r in self.parent_requests for r in ids)]

    def note_unregistered(self, request: EngineCoreRequest, client_uid: int, index: int) -> None:
        """Ground truth for the checker: a request whose ADD goes out but that this frontend
        never registered (see :meth:`finish_stream`)."""
        self.world.emit(self.component, request.request_id, request.inc,
                        FeAdd(client_uid, request.external_req_id, index, tracked=False))

    # -- abort ----------------------------------------------------------------------------------

    def flatten_req_to_abort(self, request_ids: list[str], internal: bool) -> list[str]:
        """The internal request IDs an abort of ``request_ids`` means, without popping anything."""
        out: list[str] = []
        for rid in request_ids:
            if internal:
                targets = [rid]
            elif self._unknown_external_noop:
                targets = list(self.external_req_ids.get(rid, ()))
            else:
                targets = list(self.external_req_ids.get(rid, [rid]))
            for t in targets:
                state = self.request_states.get(t)
                if state is not None:
                    if not state.finished:
                        out.append(t)
                    continue
                parent = self.parent_requests.get(t)
                if parent is not None:
                    if not internal and self._external_abort_keeps_parent:
                        parent.aborted_by_external = True
                    out.extend(c for c in parent.child_requests
                               if c in self.request_states and not self.request_states[c].finished)
        return out

    def drop_parents(self, request_ids: Sequence[str]) -> None:
        """vLLM 0.33 output_processor.py:653-659: an abort by a parent's internal ID pops its
        ``parent_requests`` entry after aborting the children it still lists."""
        for rid in request_ids:
            parent = self.parent_requests.get(rid)
            if parent is not None and not any(c in self.request_states
                                              for c in parent.child_requests):
                del self.parent_requests[rid]

    def parent_ids(self) -> list[str]:
        return list(self.parent_requests)

    def abort_requests(self, request_ids: Sequence[str]) -> list[str]:
        """Pop the states and give each client its final "abort" output (vLLM #22283).

        Aborts initiated here never reach the finished-request stats (vLLM's
        ``_update_stats_from_finished`` runs only for engine-reported finishes).
        """
        popped = []
        for rid in request_ids:
            state = self.request_states.get(rid)
            if state is None:
                continue
            if not state.finished and self._abort_final_output:
                self._deliver(state, [], FinishReason.ABORT)
            self._pop(state, "abort")
            popped.append(rid)
        return popped

    def mark_finished(self, request_ids: Sequence[str]) -> None:
        """Keep the states but give each client its final "abort" output now."""
        for rid in request_ids:
            state = self.request_states.get(rid)
            if state is not None and not state.finished:
                self._deliver(state, [], FinishReason.ABORT)
                state.finished = True

    def fail_engine(self, engine: int | None, reason: str) -> None:
        """EngineDeadError: every request on the dead engine (None: on any engine, data
        parallelism) ends with an error. Under data parallelism the states stay, as vLLM's
        ``propagate_error`` only queues the error (output_processor.py:593-597): another
        rank may still run them, and they are still this frontend's."""
        for rid in [r for r, s in self.request_states.items()
                    if engine is None or s.engine == engine]:
            state = self.request_states[rid]
            if not state.finished:
                top = state.parent.request_id if state.parent else rid
                state.collector.put(RequestOutput(state.external_req_id, [], True, None,
                                                  f"EngineDeadError: {reason}"))
                self.world.emit(self.component, rid, state.inc, FeError(state.client_uid, top))
            if engine is not None:
                self._pop(state, "error")

    # -- outputs --------------------------------------------------------------------------------

    def process_outputs(self, outputs: tuple[EngineCoreOutput, ...]) -> list[str]:
        """Route each output to the state its ID maps to; returns the stop-string aborts."""
        reqs_to_abort: list[str] = []
        states = self.request_states
        for out in outputs:
            rid = out.request_id
            state = states.get(rid)
            if state is None:
                self.world.emit(self.component, rid, out.inc,
                                FeDrop(len(out.new_tokens), out.finish_reason))
                continue
            if state.finished:
                # Finished here already; the engine's final answer lets the state go.
                if out.finish_reason is not None:
                    self._pop(state, "engine-final")
                continue
            tokens = list(out.new_tokens)
            finish = out.finish_reason
            stop_string = False
            state.num_generated += len(tokens)
            if (finish is None or finish == FinishReason.LENGTH) \
                    and state.stop_string_at is not None \
                    and state.num_generated >= state.stop_string_at:
                extra = state.num_generated - state.stop_string_at
                if extra:
                    del tokens[len(tokens) - extra:]
                    state.num_generated -= extra
                # A stop string found on the engine's last (max_tokens) token still makes the
                # finish STOP (output_processor.py:825-830); only a request the engine still
                # runs gets an ABORT (:875-880).
                stop_string = finish is None
                finish = FinishReason.STOP
            if finish is not None and state.streaming_input and finish not in (
                    FinishReason.ABORT, FinishReason.ERROR):
                # A chunk boundary (:844-875): the output is not final; the next queued
                # chunk applies, or the state waits for one.
                self._deliver(state, tokens, finish, out, boundary=True)
                queue = state.input_chunk_queue
                if queue:
                    state.streaming_input = not queue.popleft()
                else:
                    state.input_chunk_queue = None
                continue
            self._deliver(state, tokens, finish, out)
            if finish is None:
                continue
            if state.streaming_input:
                # The engine may still hold the session: a chunk in flight can re-create it.
                reqs_to_abort.append(rid)
            self.world.emit(self.component, rid, state.inc, FeStats(finish, state.client_uid))
            if stop_string:
                reqs_to_abort.append(rid)
                self.world.emit(self.component, rid, state.inc,
                                FeAbortIssue([rid], "stop-string",
                                             [state.engine] if self.dp else None))
                if bool(self.policy.pop_stop_string_finishes):  # (see EngineCore._abort)
                    self._pop(state, "stop-string")
                else:
                    state.finished = True
            else:
                self._pop(state, "finished")
        return reqs_to_abort

    def pop_finished(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            state = self.request_states.get(rid)
            if state is not None and state.finished:
                self._pop(state, "abort-sent")

    def _deliver(self, state: RequestState, tokens: list[Token], finish: str | None,
                 out: EngineCoreOutput | None = None, boundary: bool = False) -> None:
        parent = state.parent
        finished = finish is not None and not boundary
        if parent is not None and finished:
            parent.finished_children += 1
            finished = parent.finished_children >= len(parent.child_requests)
        params = out.kv_transfer_params if out is not None else None
        state.collector.put(RequestOutput(
            state.external_req_id, [CompletionOutput(state.index, tokens, finish)], finished,
            params))
        trace = self.world.trace
        if trace.reads(FeOutput.KIND):  # read by reports only: exploration runs skip it
            trace.emit(self.component, state.request_id, state.inc,
                       FeOutput(len(tokens), finish))
        else:
            trace.skip()

    def _pop(self, state: RequestState, why: str) -> None:
        rid = state.request_id
        if self.request_states.get(rid) is not state:
            return
        del self.request_states[rid]
        parent = state.parent
        top = rid
        if parent is not None:
            top = parent.request_id
            if all(c not in self.request_states for c in parent.child_requests):
                # vLLM 0.33 pops the parent in _finish_request (:917-932) and on an abort by
                # its internal ID (:653-659), never on an abort by external ID (:627-652):
                # that entry stays until a parent of equal ID replaces it.
                if not (why == "abort" and parent.aborted_by_external):
                    self.parent_requests.pop(parent.request_id, None)
            else:
                top = ""
        if top:
            ids = self.external_req_ids.get(state.external_req_id)
            if ids is not None and top in ids:
                ids.remove(top)
                if not ids:
                    del self.external_req_ids[state.external_req_id]
        self.world.emit(self.component, rid, state.inc, FePop(why))
