"""AsyncLLM (vllm/v1/engine/async_llm.py): add_request, abort and the output handler loop.

One instance per API-server process. The lifecycle policy decides the request ID the engine sees
and the order of "drop frontend state" and "send ABORT" (racesim.engine_model.policies).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any

import simpy

from racesim.engine_model.config import FrontendConfig
from racesim.engine_model.data_parallel import DPLoadBalancer
from racesim.engine_model.events.dp import DpAbortUnrouted
from racesim.engine_model.events.frontend import (
    FeAbortIssue,
    FeAbortNoop,
    FeAddCancelled,
    FeEncodeError,
    FeReject,
    FeUtility,
)
from racesim.engine_model.frontend.output_processor import OutputProcessor, ParentRequest
from racesim.engine_model.frontend.outputs import (
    RequestOutputCollector,
    StreamingInputOutputCollector,
)
from racesim.engine_model.ipc import Channel
from racesim.engine_model.messages import (
    AbortMessage,
    EngineCoreRequest,
    EngineDead,
    FinishReason,
    KVTransferParams,
    UtilityMessage,
)
from racesim.engine_model.points import POINTS, UnknownPointError
from racesim.engine_model.versions import VllmProfile
from racesim.sim.world import World

if TYPE_CHECKING:
    from racesim.engine_model.frontend.hooks import LifecycleHooks
    from racesim.engine_model.frontend.state import FrontendState

__all__ = ["AsyncLLM", "STOP_POINT"]

#: the await on a stop-string ABORT's send (its width depends on the step's size)
STOP_POINT = "frontend.output_handler:before_abort_send"

Proc = Generator[simpy.Event, Any, Any]


class AsyncLLM:
    """One API server's engine client, bound to one engine."""

    def __init__(self, world: World, index: int, name: str, engine: int,
                 policy: LifecycleHooks, config: FrontendConfig,
                 next_inc: Callable[[], int], profile: VllmProfile,
                 output_processor: FrontendState | None = None) -> None:
        self.world = world
        self.index = index
        self.name = name
        self.engine = engine
        self.policy = policy
        self.config = config
        #: the model's OutputProcessor, or a backend's (vLLM's own, behind an adapter)
        self.output_processor: FrontendState = (
            output_processor if output_processor is not None
            else OutputProcessor(world, name, policy, profile))
        self.input_channel: Channel | None = None
        #: every engine this API server talks to (all of them under data parallelism).
        self.engines: tuple[int, ...] = (engine,)
        #: data parallelism: the load balancer, and an input channel per engine.
        self.dp: DPLoadBalancer | None = None
        self.input_channels: dict[int, Channel] = {}
        #: vLLM 0.8's generate() aborted the request ID even when add_request was cancelled
        #: before it returned (no ``q is None`` check).
        self._cancel_aborts = profile.cancel_before_collector == "abort"
        self._register_first = profile.fan_out == "register-first"
        self.engine_dead: str | None = None
        self._next_inc = next_inc
        self._inbox: deque[Any] = deque()
        self._wakeup: simpy.Event | None = None
        world.env.process(self._output_handler())

    # -- add_request ----------------------------------------------------------------------------

    def add_request(self, request_id: str, *, client_uid: int, prompt_tokens: int,
                    max_tokens: int, n: int = 1, eos_at: int | None = None,
                    stop_string_at: int | None = None,
                    kv_transfer_params: KVTransferParams | None = None, prompt: str = "",
                    fault: str = "", dp_rank: int | None = None,
                    ) -> Generator[simpy.Event, Any, RequestOutputCollector | str]:
        """Register then send; returns the collector, or the finish reason of a refusal.

        ``fault == "encode"``: encoding the ADD raises TypeError after the registration (and
        the DP engine choice), before the send (v1/serial_utils.py:220-225 from
        core_client.py:1289-1291); for n == 1 generate()'s ``except Exception`` finds ``q``
        None and aborts nothing (async_llm.py:838-851): the state stays. n > 1 aborts the
        parent (:561-564). ``dp_rank``: the ``X-data-parallel-rank`` pin (DP only).

        A caller cancelled at the await on the ADD send (``simpy.Interrupt``) leaves with the
        ADD unsent (pyzmq drops a send it has not made when its future is cancelled) and, as
        in vLLM 0.33, nothing aborted for n == 1: generate()'s ``q`` is still None
        (async_llm.py:578-584, 772-809; vLLM #57061). n > 1 aborts the parent (:561-564).
        n > 1 on a "register-first" profile: :meth:`_fan_out`."""
        world = self.world
        op = self.output_processor
        if self.engine_dead is not None:
            world.emit(self.name, request_id, 0, FeReject(client_uid, "EngineDeadError"))
            return FinishReason.ERROR
        internal = self.policy.assign_request_id(self, request_id)
        if n == 1:
            ids = [internal]
            parent = None
        else:
            ids = [f"{i}_{internal}" for i in range(n)]
        collector = RequestOutputCollector(world.env, internal)
        if n > 1:
            parent = ParentRequest(internal, request_id, collector, n=n)
            if self._register_first:
                return (yield from self._fan_out(
                    parent, ids, client_uid, prompt_tokens, max_tokens, eos_at,
                    stop_string_at, kv_transfer_params, prompt, fault, dp_rank))
        for index, rid in enumerate(ids):
            registered = not op.has_request(rid)
            if not registered and not op.finishes_duplicates:
                # OutputProcessor.add_request's ValueError("... already running") leaves
                # generate(), whose error path aborts the children already registered
                # (n > 1: another client took this child's ID while an earlier child's ADD
                # awaited its send).
                world.emit(self.name, rid, 0,
                           FeReject(client_uid, "already running", request_id))
                if index > 0:
                    yield from self.abort(internal, internal=True)
                return FinishReason.REJECTED
            req = EngineCoreRequest(rid, request_id, prompt_tokens, max_tokens, self.index,
                                    eos_at, kv_transfer_params, self._next_inc(), prompt, fault)
            engine = self._register(req, parent, index, collector, client_uid, stop_string_at,
                                    registered, dp_rank)
            if fault == "encode":
                world.emit(self.name, rid, req.inc, FeEncodeError(client_uid))
                if n > 1:
                    yield from self.abort(internal, internal=True)
                return FinishReason.ERROR
            ev = world.sleep("frontend.add_request:before_send", 0.0, self.name)
            if ev is not None:
                try:
                    yield ev
                except simpy.Interrupt:
                    world.emit(self.name, rid, req.inc, FeAddCancelled(client_uid))
                    if n > 1:
                        yield from self.abort(internal, internal=True)
                    elif self._cancel_aborts:
                        yield from self.abort(request_id)
                    raise
            self._send(req, [rid], engine, incs=[req.inc])
        return collector

    def _register(self, req: EngineCoreRequest, parent: ParentRequest | None, index: int,
                  collector: RequestOutputCollector, client_uid: int,
                  stop_string_at: int | None, registered: bool,
                  dp_rank: int | None = None, route: bool = True) -> int:
        """``OutputProcessor.add_request`` for one request (or child), and the engine its ADD
        goes to. A duplicate on a profile that finishes duplicates is no error: the old stream
        ends, the new request is not registered, and its ADD still goes (vLLM 0.33
        async_llm.py:567-585, output_processor.py:663-713). DPLBAsyncMPClient picks the engine
        inside add_request_async, before its only await (core_client.py:1607-1617): in the same
        tick as the registration."""
        op = self.output_processor
        if not registered:
            op.finish_stream(req)
        engine = (self.engine if self.dp is None or not route
                  else self.dp.choose(req.request_id, req.inc, rank=dp_rank))
        if registered:
            op.add_request(req, parent, index, collector, client_uid, engine, stop_string_at)
        else:
            op.note_unregistered(req, client_uid, index)
        return engine

    def _fan_out(self, parent: ParentRequest, ids: list[str], client_uid: int,
                 prompt_tokens: int, max_tokens: int, eos_at: int | None,
                 stop_string_at: int | None, kv_transfer_params: KVTransferParams | None,
                 prompt: str, fault: str, dp_rank: int | None = None,
                 ) -> Generator[simpy.Event, Any, RequestOutputCollector | str]:
        """n > 1 in vLLM 0.33 (async_llm.py:538-565): every child is registered in the
        OutputProcessor first, with no await between, then each child's ADD send is awaited
        in turn; any exception there (a caller's cancel) aborts the parent by its internal ID
        and re-raises. A cancel at the k-th send thus aborts all n children, of which only the
        first k were sent. The sends are eager pyzmq sends (``frontend.add_request:before_send``
        is latent), so a race through a cancel there is a latent hazard.

        Under data parallelism vLLM picks a child's engine inside its ``add_request_async``
        (core_client.py:1607-1617), the model at its registration: the choices differ only
        when a delay at that latent point lets another request be routed in between."""
        world = self.world
        op = self.output_processor
        request_id = parent.external_req_id
        collector = parent.collector
        sends: list[tuple[EngineCoreRequest, int]] = []
        for index, rid in enumerate(ids):
            req = EngineCoreRequest(rid, request_id, prompt_tokens, max_tokens, self.index,
                                    eos_at, kv_transfer_params, self._next_inc(), prompt, fault)
            registered = not op.has_request(rid)
            if not registered and not op.finishes_duplicates:
                # OutputProcessor.add_request raised inside the try: abort, re-raise
                world.emit(self.name, rid, 0,
                           FeReject(client_uid, "already running", request_id))
                if index > 0:
                    yield from self.abort(parent.request_id, internal=True)
                return FinishReason.REJECTED
            # An encode error stops the fan-out at the first child's add_request_async, the
            # only one vLLM routes (core_client.py:1607-1616): the others are never chosen.
            sends.append((req, self._register(req, parent, index, collector, client_uid,
                                              stop_string_at, registered, dp_rank,
                                              route=not (fault == "encode" and index > 0))))
        for req, engine in sends:
            if fault == "encode":
                # the first child's encode raises inside the try: abort the parent, re-raise
                world.emit(self.name, req.request_id, req.inc, FeEncodeError(client_uid))
                yield from self.abort(parent.request_id, internal=True)
                return FinishReason.ERROR
            ev = world.sleep("frontend.add_request:before_send", 0.0, self.name)
            if ev is not None:
                try:
                    yield ev
                except simpy.Interrupt:
                    world.emit(self.name, req.request_id, req.inc, FeAddCancelled(client_uid))
                    yield from self.abort(parent.request_id, internal=True)
                    raise
            self._send(req, [req.request_id], engine, incs=[req.inc])
        return collector

    # -- streaming input ------------------------------------------------------------------------

    def add_streaming_request(self, request_id: str, *, client_uid: int, prompt_tokens: int,
                              max_tokens: int, eos_at: int | None, chunks: int,
                              interval: float,
                              ) -> Generator[simpy.Event, Any, RequestOutputCollector | str]:
        """_add_streaming_input_request (async_llm.py:590-700): one internal ID for the whole
        session, the collector at once, and a task that adds each input chunk under that ID
        (resumable) and then the final, non-resumable add."""
        if self.engine_dead is not None:
            self.world.emit(self.name, request_id, 0, FeReject(client_uid, "EngineDeadError"))
            return FinishReason.ERROR
        internal = self.policy.assign_request_id(self, request_id)
        collector = StreamingInputOutputCollector(self.world.env, internal)
        self.world.env.process(self._handle_inputs(
            internal, request_id, collector, client_uid, prompt_tokens, max_tokens, eos_at,
            chunks, interval, self._next_inc()))
        return collector
        yield  # a generator, like add_request

    def _handle_inputs(self, internal: str, request_id: str,
                       collector: RequestOutputCollector, client_uid: int, prompt_tokens: int,
                       max_tokens: int, eos_at: int | None, chunks: int, interval: float,
                       inc: int) -> Proc:
        world = self.world
        op = self.output_processor
        for k in range(chunks + 1):
            if k:
                yield world.env.timeout(interval)
                if not op.has_request(internal):
                    return  # the session finished (aborted or errored): no more input
            req = EngineCoreRequest(internal, request_id, prompt_tokens, max_tokens, self.index,
                                    eos_at, None, inc, resumable=True)
            yield from self._send_chunk(req, k == 0, collector, client_uid)
        if op.has_request(internal):
            final = EngineCoreRequest(internal, request_id, 1, max_tokens, self.index, eos_at,
                                      None, inc, resumable=False)
            yield from self._send_chunk(final, False, collector, client_uid)

    def _send_chunk(self, req: EngineCoreRequest, first: bool,
                    collector: RequestOutputCollector, client_uid: int) -> Proc:
        """_add_request for one session add: register (or queue the update), then send. Only
        the first add is a new incarnation for the checker; the others continue it. A first
        add whose internal ID is held already (equal IDs) is that request's streaming update
        (output_processor.py:672-674): this session is never registered."""
        rid = req.request_id
        op = self.output_processor
        engine = self.engine if self.dp is None else self.dp.choose(rid, req.inc, req.resumable)
        if first and not op.has_request(rid):
            op.add_request(req, None, 0, collector, client_uid, engine, None)
            op.open_session(rid)
        else:
            op.streaming_update(req)
            if first:
                op.note_unregistered(req, client_uid, 0)
        ev = self.world.sleep("frontend.add_request:before_send", 0.0, self.name)
        if ev is not None:
            yield ev
        self._send(req, [rid], engine, incs=[req.inc] if first else [],
                   resumable=req.resumable)

    # -- abort ----------------------------------------------------------------------------------

    def abort(self, request_id: str, internal: bool = False) -> Proc:
        """AsyncLLM.abort: what is dropped when, and when the ABORT leaves, is the policy's."""
        ids = self.output_processor.flatten_req_to_abort([request_id], internal)
        if not ids:
            self.world.emit(self.name, request_id, 0, FeAbortNoop())
            return
        op = self.output_processor
        incs = [op.inc_of(r) for r in ids]
        engines = None if self.dp is None else [op.engine_of(r) for r in ids]
        self.world.emit(self.name, request_id, incs[0] if len(incs) == 1 else 0,
                        FeAbortIssue(ids, "abort", engines))
        yield from self.policy.abort(self, ids)

    def send_abort(self, request_ids: Sequence[str], point: str) -> Proc:
        """Pass ``point`` (the await on the socket send), then put the ABORT on the wire.

        A policy names the point; a name outside the catalogue would be a point no delay can
        ever reach (a misspelling reads as "safe"), so it is refused."""
        if point not in POINTS:
            raise UnknownPointError(f"send_abort: unknown await point {point!r} (known: "
                             f"{', '.join(POINTS.names())})")
        ev = self.world.sleep(point, 0.0, self.name)
        if ev is not None:
            yield ev
        if not request_ids:
            return
        if self.dp is not None and self.engine_dead is not None:
            # DPLBAsyncMPClient.abort_requests_async sends nothing once an engine died
            # (core_client.py:1874-1876); the engine monitor then shuts the other ranks down
            # (core_client.py:822-850), so what they hold is not audited as a leak.
            return
        tag = self._next_inc()
        if self.dp is None:
            self._send(AbortMessage(tuple(request_ids), tag), list(request_ids), self.engine,
                       tag=tag)
            return
        # DPLBAsyncMPClient.abort_requests_async (core_client.py:1874-1900): each ID goes to
        # the engine reqs_in_flight names; an ID with no entry is sent nowhere.
        by_engine, unrouted = self.dp.route_aborts(request_ids)
        if unrouted:
            self.world.emit(self.name, None, 0, DpAbortUnrouted(unrouted))
        for engine in sorted(by_engine):
            ids = by_engine[engine]
            self._send(AbortMessage(tuple(ids), tag), ids, engine, tag=tag)

    def pause_generation(self, method: str, mode: str = "") -> None:
        """pause_generation / resume_generation: a UTILITY call to every engine (all mode
        handling is the engine's, async_llm.py:989-1028)."""
        self.world.emit(self.name, None, 0, FeUtility(method, mode))
        for engine in self.engines:
            self._send(UtilityMessage(method, mode), ["*"], engine)

    def next_inc(self) -> int:
        """A fresh ground-truth number (the System's counter)."""
        return self._next_inc()

    def send_add(self, req: EngineCoreRequest, engine: int) -> None:
        """Put an ADD on ``engine``'s input socket (the send after its await point)."""
        self._send(req, [req.request_id], engine, incs=[req.inc])

    def _send(self, msg: Any, request_ids: list[str], engine: int, *,
              incs: list[int] | None = None, tag: int | None = None,
              resumable: bool | None = None) -> None:
        channel = self.input_channel if self.dp is None else self.input_channels[engine]
        assert channel is not None
        channel.send(msg, request_ids, to=engine, incs=incs, tag=tag, resumable=resumable)

    # -- output handler -------------------------------------------------------------------------

    def deliver(self, msg: Any) -> None:
        """Output socket: EngineCoreOutputs (or the engine's death) arrived. The socket task
        lets the load balancer forget finished IDs before the handler sees the outputs
        (core_client.py:1819-1825). The outputs are the model's or a backend's (vLLM's own
        behind an envelope): both name ``finished_requests``."""
        dp = self.dp
        if dp is not None and not isinstance(msg, EngineDead):
            finished = msg.finished_requests
            if finished:
                dp.finished(finished)
        self._inbox.append(msg)
        ev = self._wakeup
        if ev is not None and not ev.triggered:
            ev.succeed()

    def _output_handler(self) -> Proc:
        world = self.world
        env = world.env
        inbox = self._inbox
        op = self.output_processor
        chunk = self.config.output_chunk_size
        while True:
            while not inbox:
                self._wakeup = env.event()
                yield self._wakeup
            msg = inbox.popleft()
            if isinstance(msg, EngineDead):
                self.engine_dead = msg.reason
                # Under data parallelism one dead engine fails the whole client.
                op.fail_engine(msg.engine if self.dp is None else None, msg.reason)
                # The handler's loop ends with its first exception (async_llm.py:880-945;
                # the socket task's too, core_client.py:1259-1262): nothing after the death
                # is processed, not even another DP rank's outputs.
                return
            # EngineCoreOutputs: the model's, or vLLM's own behind a backend's envelope
            outputs = msg.outputs
            if len(outputs) <= chunk:  # one chunk: no slice, no await between chunks
                reqs_to_abort = op.process_outputs(outputs)
                if reqs_to_abort:
                    yield from self.policy.abort_stop_strings(self, reqs_to_abort)
                continue
            for start in range(0, len(outputs), chunk):
                reqs_to_abort = op.process_outputs(outputs[start:start + chunk])
                more = start + chunk < len(outputs)
                if more:
                    ev = world.sleep("frontend.output_handler:between_chunks", 0.0, self.name)
                    if ev is not None:
                        yield ev
                if reqs_to_abort:
                    if more:
                        # async_llm.py:905-922: this chunk's stop-string ABORT waits behind
                        # the sleep(0) between chunks, so its window yields
                        world.widen_next(STOP_POINT)
                    yield from self.policy.abort_stop_strings(self, reqs_to_abort)

