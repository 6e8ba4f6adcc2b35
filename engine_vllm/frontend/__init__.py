"""Each API server's request state is vLLM's own ``OutputProcessor``, behind a thin adapter.

Line numbers are 0.33.0's; the calls that differ in older releases go through the release's
generation adapter (racesim.engine_vllm._api).

AsyncLLM's tasks and await points stay the model's (racesim.engine_model.frontend.async_llm);
at each of its calls into the output processor the adapter calls vLLM's
``vllm/v1/engine/output_processor.py`` instead, and records the trace events the model's
OutputProcessor records, with the same meaning, so the monitors read both backends alike:

- ``add_request`` -> ``OutputProcessor.add_request`` (:663), with a real ``EngineCoreRequest``
  (``external_req_id`` set) and, for n > 1, vLLM's ``ParentRequest`` (parallel_sampling.py)
  with all its children named by ``get_child_info`` before the first is registered, as
  ``AsyncLLM.add_request`` does (async_llm.py:542-555);
- a same-ID add (``finish_stream``) and a streaming-input session's later adds
  (``streaming_update``) -> the same ``add_request`` with the same internal ID: vLLM's
  ``_update_streaming_request_state`` (:695-726) queues or applies a resumable chunk, and takes
  a non-resumable add as the session's end, or finishes the old state with STREAM_FINISHED;
  a session's first add (``resumable=True``) opens it in ``RequestState`` (:249-252, 346);
- an abort -> ``abort_requests(ids, internal)`` (:596-660). vLLM resolves and pops in that one
  call; the model resolves in ``flatten_req_to_abort`` and pops in the policy's
  ``abort_requests`` right after, with no await between (the policies this backend runs), so
  the adapter calls vLLM's at the first and records the pops at the second;
- each engine output -> ``process_outputs([output])`` (:734): one output per call, so the
  events of each output follow it as in the model; vLLM's loop keeps no state across outputs.

Ground truth never comes from IDs: every registration gets its own queue object bound to its
incarnation and client, and each ``RequestState`` is mapped back by the object. vLLM's
``RequestOutputCollector`` is asyncio; the queue's ``put`` converts vLLM's ``RequestOutput`` to
the model's and puts it into the model's simpy collector (tokens decode through the fake
vocabulary, which carries their incarnation).

Stats: the adapter runs vLLM with ``log_stats=False``, which computes none. ``fe.stats`` is
recorded where vLLM's ``process_outputs`` calls ``_update_stats_from_finished`` (:884-887):
a state it finished on an engine output or a stop string; aborts made here are not counted
(:652-660 only updates ``lora_states``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from racesim.engine_model.events.frontend import (
    FeAbortIssue,
    FeAdd,
    FeDrop,
    FeError,
    FeOutput,
    FePop,
    FeStats,
)
from racesim.engine_model.frontend.output_processor import ParentRequest
from racesim.engine_model.frontend.outputs import (
    CompletionOutput,
    RequestOutput,
    RequestOutputCollector,
)
from racesim.engine_model.messages import EngineCoreRequest, FinishReason
from racesim.engine_vllm import _vllm
from racesim.engine_vllm.engine.views import PROMPT_TOKEN, StopTokenizer, Vocabulary
from racesim.engine_vllm.frontend.envelope import EngineCoreOutputs, Envelope, _OrderedIds
from racesim.sim.world import World

__all__ = ["VllmOutputProcessor", "EngineCoreOutputs", "Envelope", "StopTokenizer"]


class _Queue:
    """The queue vLLM's RequestState puts into, for one registration: converts each
    ``RequestOutput`` and feeds the model's simpy collector. Bound to its incarnation."""

    __slots__ = ("op", "collector", "rid", "external", "index", "inc", "uid", "top", "engine",
                 "state", "session", "source")

    def __init__(self, op: VllmOutputProcessor, collector: RequestOutputCollector, rid: str,
                 external: str, index: int, inc: int, uid: int, top: str, engine: int,
                 session: bool = False) -> None:
        self.op = op
        self.collector = collector
        self.rid = rid
        self.external = external
        self.index = index
        self.inc = inc
        self.uid = uid
        self.top = top
        self.engine = engine  # the engine the request was sent to (the DP client's choice)
        self.state: Any = None  # vLLM's RequestState this queue belongs to
        #: a streaming-input session's (its first add was resumable)
        self.session = session
        self.source: int | None = None  # the incarnation whose output is being processed

    def put(self, output: Any) -> None:
        op = self.op
        if isinstance(output, Exception):
            error = f"{type(output).__name__}: {op.dead_reason}"  # the model's error text
            self.collector.put(RequestOutput(self.external, [], True, None, error))
            op.world.emit(op.component, self.rid, self.inc, FeError(self.uid, self.top))
            return
        kv = None
        if output is op.v.STREAM_FINISHED:
            # vLLM's sentinel (outputs=[], finished=True): the model's marker for a stream that
            # ended with no finish reason
            completions = [CompletionOutput(self.index, [], FinishReason.STREAM_FINISHED)]
            finished = True
        else:
            decode = op.vocab.decode
            completions = [CompletionOutput(c.index, [decode(t) for t in c.token_ids],
                                            c.finish_reason) for c in output.outputs]
            finished = bool(output.finished)
            if op.fabric is not None and output.kv_transfer_params:
                # P/D: a prefill's params (of the P incarnation that produced them), which the
                # proxy forwards to the decode engine
                kv = op.fabric.from_prefill(output.kv_transfer_params, self.inc
                                            if self.source is None else self.source)
        self.collector.put(RequestOutput(self.external, completions, finished, kv))
        trace = op.world.trace
        if trace.reads(FeOutput.KIND):
            for c in completions:
                trace.emit(op.component, self.rid, self.inc,
                           FeOutput(len(c.tokens), c.finish_reason))
        else:
            trace.skip()


class VllmOutputProcessor:
    """One API server's request state: vLLM's ``OutputProcessor``, with the model's
    interface (:class:`racesim.engine_model.frontend.state.FrontendState`)."""

    #: under data parallelism the trace names each request's engine (set by the System)
    dp = False

    def __init__(self, world: World, component: str, engine: int, vocab: Vocabulary,
                 client_index: int) -> None:
        self.world = world
        self.component = component
        self.engine = engine
        self.vocab = vocab
        self.client_index = client_index
        self.v = v = _vllm.vllm()
        self.api = v.api
        #: the release's OutputProcessor takes a same-ID add as a streaming update (0.20+:
        #: 0.33 output_processor.py:672), else raises "already running"
        self.finishes_duplicates = v.api.finishes_duplicates
        self.real = v.OutputProcessor(tokenizer=StopTokenizer(), log_stats=False)
        #: the model's ParentRequest (AsyncLLM's) -> vLLM's, by object
        self._parents: dict[int, tuple[ParentRequest, Any]] = {}
        #: states vLLM's abort_requests popped, until the policy's pop is recorded
        self._aborted: dict[str, _Queue] = {}
        #: why the engine died (vLLM's EngineDeadError carries a fixed message)
        self.dead_reason = ""
        #: P/D: turns a prefill's kv_transfer_params into the model's (set by the System)
        self.fabric: Any = None

    # -- ground truth ---------------------------------------------------------------------------

    @staticmethod
    def _queue_of(state: Any) -> _Queue:
        queue = state.queue
        assert isinstance(queue, _Queue) and queue.state is state
        return queue

    def has_request(self, request_id: str) -> bool:
        # OutputProcessor.has_request (0.33 output_processor.py:576-577) is this test; older
        # releases lack the method
        return request_id in self.real.request_states

    def inc_of(self, request_id: str) -> int:
        queue = self._aborted.get(request_id)
        if queue is None:
            queue = self._queue_of(self.real.request_states[request_id])
        return queue.inc

    def engine_of(self, request_id: str) -> int:
        queue = self._aborted.get(request_id)
        if queue is None:
            queue = self._queue_of(self.real.request_states[request_id])
        return queue.engine

    def live_ids(self) -> list[tuple[str, int]]:
        return [(rid, self._queue_of(s).inc) for rid, s in self.real.request_states.items()]

    def orphan_parents(self) -> list[tuple[str, int]]:
        """vLLM's ``parent_requests`` entries with no child state left (an abort by external
        ID leaves them: output_processor.py:620-661)."""
        real = self.real
        held = {id(s.parent_req) for s in real.request_states.values()
                if s.parent_req is not None}
        incs = {id(r): m.incs for m, r in self._parents.values()}
        out = []
        for pid, p in real.parent_requests.items():
            if id(p) not in held:
                children = incs.get(id(p))
                out.append((pid, children[0] if children else 0))
        return out

    def orphan_external_ids(self) -> list[str]:
        real = self.real
        return [ext for ext, ids in self.api.external_req_ids(real).items()
                if not any(r in real.request_states or r in real.parent_requests for r in ids)]

    # -- add ------------------------------------------------------------------------------------

    def _params(self, max_tokens: int, n: int, stop_string_at: int | None) -> Any:
        v = self.v
        kind = v.RequestOutputKind.DELTA
        if stop_string_at is None:
            return v.SamplingParams(n=n, max_tokens=max_tokens, detokenize=False,
                                    output_kind=kind)
        return v.SamplingParams(n=n, max_tokens=max_tokens, output_kind=kind,
                                stop=["a" * stop_string_at])

    def _request(self, request: EngineCoreRequest, request_id: str, params: Any) -> Any:
        return self.api.engine_core_request(
            self.v.EngineCoreRequest, request_id=request_id,
            prompt_token_ids=[PROMPT_TOKEN] * request.prompt_tokens, mm_features=None,
            sampling_params=params, pooling_params=None, arrival_time=float(self.world.now),
            lora_request=None, cache_salt=None, data_parallel_rank=None,
            client_index=self.client_index, external_req_id=request.external_req_id,
            resumable=request.resumable)

    def _parent(self, parent: ParentRequest, request: EngineCoreRequest,
                stop_string_at: int | None) -> Any:
        entry = self._parents.get(id(parent))
        if entry is not None and entry[0] is parent:
            return entry[1]
        params = self._params(request.max_tokens, parent.n, stop_string_at)
        real = self.api.parent_request(self.v.ParentRequest,
                                       self._request(request, parent.request_id, params))
        real.child_requests = _OrderedIds()
        for index in range(parent.n):  # AsyncLLM names every child first (async_llm.py:542)
            real.get_child_info(index)
        self._parents[id(parent)] = (parent, real)
        return real

    def add_request(self, request: EngineCoreRequest, parent: ParentRequest | None, index: int,
                    collector: RequestOutputCollector, client_uid: int, engine: int,
                    stop_string_at: int | None) -> object:
        rid = request.request_id
        real_parent = None
        if parent is not None:
            real_parent = self._parent(parent, request, stop_string_at)
            child_id, params = real_parent.get_child_info(index)
            assert child_id == rid, (child_id, rid)
        else:
            params = self._params(request.max_tokens, 1, stop_string_at)
        top = parent.request_id if parent is not None else rid
        if parent is not None:
            parent.incs.append(request.inc)  # ground truth, for the leak audit
        queue = _Queue(self, collector, rid, request.external_req_id, index, request.inc,
                       client_uid, top, engine, request.resumable)
        self.real.add_request(self._request(request, rid, params), None, real_parent, index,
                              queue)
        queue.state = self.real.request_states[rid]
        self.world.emit(self.component, rid, request.inc,
                        FeAdd(client_uid, request.external_req_id, index,
                              dp_engine=engine if self.dp else None))
        return queue.state

    def finish_stream(self, request: EngineCoreRequest) -> None:
        self.streaming_update(request)

    def open_session(self, request_id: str) -> None:
        # vLLM's add_request opened it: a resumable request's state streams input (:346)
        assert self.real.request_states[request_id].streaming_input

    def streaming_update(self, request: EngineCoreRequest) -> None:
        """A later add of a held ID (AsyncLLM._add_request, async_llm.py:567-585): vLLM's
        ``add_request`` takes it as a streaming update (output_processor.py:672-674)."""
        rid = request.request_id
        old = self._queue_of(self.real.request_states[rid])
        params = self._params(request.max_tokens, 1, None)
        self.real.add_request(self._request(request, rid, params), None, None, 0, old)
        if self.real.request_states.get(rid) is not old.state:
            self.world.emit(self.component, rid, old.inc, FePop("stream-finished"))

    def note_unregistered(self, request: EngineCoreRequest, client_uid: int, index: int) -> None:
        self.world.emit(self.component, request.request_id, request.inc,
                        FeAdd(client_uid, request.external_req_id, index, tracked=False))

    # -- abort ----------------------------------------------------------------------------------

    def drop_parents(self, request_ids: Sequence[str]) -> None:
        """Nothing: vLLM's own ``abort_requests`` (called by :meth:`flatten_req_to_abort`)
        popped the parents already (output_processor.py:653-659)."""

    def parent_ids(self) -> list[str]:
        return list(self.real.parent_requests)

    def flatten_req_to_abort(self, request_ids: list[str], internal: bool) -> list[str]:
        states = self.real.request_states
        held = {rid: self._queue_of(s) for rid, s in states.items()}
        ids = self.api.abort_requests(self.real, request_ids, internal)
        for rid in ids:
            self._aborted[rid] = held[rid]
        return ids

    def abort_requests(self, request_ids: Sequence[str]) -> list[str]:
        popped = []
        for rid in request_ids:
            queue = self._aborted.pop(rid, None)
            if queue is None:  # not resolved by flatten_req_to_abort: vLLM's call pops it now
                state = self.real.request_states.get(rid)
                if state is None:
                    continue
                queue = self._queue_of(state)
                self.api.abort_requests(self.real, [rid], True)
            self.world.emit(self.component, rid, queue.inc, FePop("abort"))
            popped.append(rid)
        return popped

    def mark_finished(self, request_ids: Sequence[str]) -> None:
        raise NotImplementedError("vLLM's OutputProcessor has no finished-but-kept state")

    def pop_finished(self, request_ids: Sequence[str]) -> None:
        raise NotImplementedError("vLLM's OutputProcessor has no finished-but-kept state")

    # -- outputs --------------------------------------------------------------------------------

    def process_outputs(self, outputs: Sequence[Envelope]) -> list[str]:
        real = self.real
        states = real.request_states
        emit = self.world.emit
        component = self.component
        reqs_to_abort: list[str] = []
        for env in outputs:
            out = env.output
            rid = out.request_id
            state = states.get(rid)
            engine_finish = out.finish_reason
            if state is None:
                real.process_outputs([out])  # vLLM ignores it (:760-762)
                emit(component, rid, env.inc,
                     FeDrop(len(out.new_token_ids),
                            str(engine_finish) if engine_finish is not None else None))
                continue
            queue = self._queue_of(state)
            queue.source = env.inc  # the producer: with equal IDs, maybe another request
            to_abort = real.process_outputs([out]).reqs_to_abort
            queue.source = None
            if states.get(rid) is state:
                continue
            # finished here: where vLLM calls _update_stats_from_finished (:884-887)
            reason = str(engine_finish) if engine_finish is not None else FinishReason.STOP
            emit(component, rid, queue.inc, FeStats(reason, queue.uid))
            if queue.session:
                # no stop strings in a session (async_llm.py:705-719): an abort here is for a
                # chunk in flight that may re-create the session (output_processor.py:878-882)
                reqs_to_abort.extend(to_abort)
                emit(component, rid, queue.inc, FePop("finished"))
                continue
            if rid in to_abort:
                reqs_to_abort.append(rid)
                emit(component, rid, queue.inc,
                     FeAbortIssue([rid], "stop-string", [queue.engine] if self.dp else None))
            emit(component, rid, queue.inc,
                 FePop("stop-string" if rid in to_abort else "finished"))
        return reqs_to_abort

    def fail_engine(self, engine: int | None, reason: str) -> None:
        """vLLM's output handler gives every request state the EngineDeadError and keeps the
        states (async_llm.py:938-944, ``propagate_error``)."""
        self.dead_reason = reason
        self.real.propagate_error(self.v.EngineDeadError())
