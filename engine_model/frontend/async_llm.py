"""AsyncLLM (vllm/v1/engine/async_llm.py): add_request, streaming input and abort; its sends to
the engine cores and the output handler loop are :class:`EngineIO`'s (engine_io.py).

One instance per API-server process. The lifecycle policy decides the request ID the engine sees
and the order of "drop frontend state" and "send ABORT" (racesim.engine_model.policies).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from racesim.engine_model.events.frontend import (
    FeAbortIssue,
    FeAbortNoop,
    FeAddCancelled,
    FeEncodeError,
    FeReject,
)
from racesim.engine_model.frontend.engine_io import STOP_POINT, EngineIO, Proc
from racesim.engine_model.frontend.request_state import ParentRequest
from racesim.engine_model.frontend.outputs import (
    RequestOutputCollector,
    StreamingInputOutputCollector,
)
from racesim.engine_model.messages import EngineCoreRequest, FinishReason, KVTransferParams

__all__ = ["AsyncLLM", "STOP_POINT"]


class AsyncLLM(EngineIO):
    """One API server's engine client, bound to one engine: the request API (add, streaming
    input, abort) over :class:`EngineIO`'s sends and output handler."""

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
                              interval: float, chunk_tokens: int | None = None,
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
            chunks, interval, self._next_inc(),
            prompt_tokens if chunk_tokens is None else chunk_tokens))
        return collector
        yield  # a generator, like add_request

    def _handle_inputs(self, internal: str, request_id: str,
                       collector: RequestOutputCollector, client_uid: int, prompt_tokens: int,
                       max_tokens: int, eos_at: int | None, chunks: int, interval: float,
                       inc: int, chunk_tokens: int) -> Proc:
        world = self.world
        op = self.output_processor
        for k in range(chunks + 1):
            if k:
                yield world.env.timeout(interval)
                if not op.has_request(internal):
                    return  # the session finished (aborted or errored): no more input
            req = EngineCoreRequest(internal, request_id, chunk_tokens if k else prompt_tokens,
                                    max_tokens, self.index, eos_at, None, inc, resumable=True)
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
