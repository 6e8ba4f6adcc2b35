"""Scripted clients (the P/D proxy between a client and two engines is pd_proxy.py).

A client sends one request, streams its outputs, and may abort it explicitly (``abort_at``),
disconnect after k tokens, or be ended by EOS or a stop string. It records every output it
receives; each token carries the incarnation that generated it, which only the checker reads.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Protocol

import simpy

from racesim.engine_model.api_server import ApiServer
from racesim.engine_model.config import RequestSpec
from racesim.engine_model.events.client import (
    ClientAbort,
    ClientCancel,
    ClientDisconnect,
    ClientDone,
    ClientOutput,
    ClientSend,
)
from racesim.engine_model.frontend.async_llm import AsyncLLM
from racesim.engine_model.frontend.outputs import RequestOutput, RequestOutputCollector
from racesim.engine_model.messages import FinishReason, KVTransferParams
from racesim.engine_model.pd_proxy import Proxy  # re-exported: its path before pd_proxy.py
from racesim.sim.world import World

__all__ = ["Client", "Gateway", "Proxy"]

Proc = Generator[simpy.Event, Any, Any]


class Gateway(Protocol):
    """What a client talks to: an API server (AsyncLLM) or the P/D proxy."""

    def add_request(self, request_id: str, *, client_uid: int, prompt_tokens: int,
                    max_tokens: int, n: int = 1, eos_at: int | None = None,
                    stop_string_at: int | None = None,
                    kv_transfer_params: KVTransferParams | None = None, prompt: str = "",
                    fault: str = "", dp_rank: int | None = None,
                    ) -> Generator[simpy.Event, Any, RequestOutputCollector | str]: ...

    def abort(self, request_id: str, internal: bool = False) -> Proc: ...


def finish_reason_of(out: RequestOutput) -> str | None:
    if out.error is not None:
        return FinishReason.ERROR
    if not out.finished:
        return None
    reasons = [c.finish_reason for c in out.outputs if c.finish_reason is not None]
    if FinishReason.ABORT in reasons:
        return FinishReason.ABORT
    return reasons[-1] if reasons else FinishReason.ABORT


class Client:
    """One scripted request (``uid`` is its hidden identity; the system only sees ``spec.id``)."""

    def __init__(self, world: World, index: int, uid: int, spec: RequestSpec,
                 gateway: Gateway, api: ApiServer | None = None) -> None:
        self.world = world
        #: the API layer in front of ``gateway`` when ``spec.endpoint`` names an endpoint
        self.api = api if spec.endpoint is not None else None
        self.index = index
        self.uid = uid
        self.spec = spec
        self.gateway = gateway
        self.name = f"client{index}"
        self.tokens = 0
        self.finish_reason: str | None = None
        # Whether the request was accepted. The client keeps no reference to its collector: once
        # the frontend lets go of it, nothing can put an output there, so the finished client's
        # listening process becomes garbage instead of living until the end of the run.
        self._accepted = False
        #: the internal ID generate() holds once add_request returned (``q.request_id``).
        self._collector_id: str | None = None
        #: the ID AsyncLLM was given (the endpoint's, with the API layer)
        self._served_id = spec.id
        # The cancellable wrapper only when a cancel is scripted: it adds a generator frame
        # to every resume of the client.
        #: the Responses API's response ID (its background task is this client's request)
        self._response_id = ""
        self._responses = self.api is not None and spec.endpoint == "responses"
        #: per choice, the tokens read and whether it finished (n > 1 through an endpoint)
        self._choice_tokens: dict[int, int] = {}
        self._finished_choices: set[int] = set()
        self._proc = world.env.process(self._run() if spec.cancel_at is not None
                                       or self._responses else self._generate())
        if spec.abort_at is not None:
            # Armed now, so that at equal times scenario order decides who acts first.
            world.env.process(self._abort_at(spec.abort_at))
        if spec.cancel_at is not None:
            world.env.process(self._cancel_at(spec.cancel_at))

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def _terminate(self, reason: str, cancelled: bool = False) -> None:
        self.finish_reason = reason
        self.world.emit(self.name, self.spec.id, 0, ClientDone(self.uid, reason, self.tokens))
        if self._responses and self.api is not None and self._response_id:
            outcome = ("cancelled" if cancelled else "failed" if reason == FinishReason.ERROR
                       else "completed")
            self.api.responses_done(self._response_id, self.uid, outcome)

    def cancel_task(self) -> None:
        """The Responses API cancels this client's background task (task.cancel()): its
        generate() is cancelled, as a disconnect would (no client event: the client did not
        ask)."""
        if not self.done and self._proc.is_alive:
            self._proc.interrupt("cancelled")

    def _chunks(self, out: RequestOutput) -> list[tuple[list[list[int]], str | None]]:
        """What the client reads of one output: (tokens, finish reason) per read. Through an
        endpoint with n > 1, vLLM's stream generators send one SSE chunk per choice, skipping a
        choice's chunk with no tokens and no finish before its first token, and the stream ends
        with the last choice's finish (0.33.0 openai/completion/serving.py
        completion_stream_generator; scale_out/token_in_token_out/serving.py
        serve_tokens_stream_generator)."""
        if self.api is None or self._responses or self.spec.n < 2 or out.error is not None:
            return [([[c.index, t.inc, t.ctx] for c in out.outputs for t in c.tokens],
                     finish_reason_of(out))]
        chunks: list[tuple[list[list[int]], str | None]] = []
        for c in out.outputs:
            seen = self._choice_tokens.get(c.index, 0)
            if not c.tokens and c.finish_reason is None and not seen:
                continue
            self._choice_tokens[c.index] = seen + len(c.tokens)
            if c.finish_reason is not None:
                self._finished_choices.add(c.index)
            done = c.finish_reason is not None and len(self._finished_choices) >= self.spec.n
            chunks.append(([[c.index, t.inc, t.ctx] for t in c.tokens],
                           c.finish_reason if done else None))
        return chunks

    def _run(self) -> Proc:
        try:
            yield from self._generate()
        except simpy.Interrupt:
            yield from self._cancelled()

    def _cancel_at(self, at: float) -> Proc:
        """``with_cancellation`` cancels the HTTP handler task (entrypoints/utils.py)."""
        env = self.world.env
        if at > env.now:
            yield env.timeout(at - env.now)
        if self.done or not self._proc.is_alive:
            return
        self.world.emit(self.name, self.spec.id, 0, ClientCancel(self.uid))
        self._proc.interrupt("cancelled")

    def _cancelled(self) -> Proc:
        """generate()'s CancelledError path (async_llm.py:807-809): abort by the internal ID
        if add_request had returned; otherwise AsyncLLM.add_request already did what vLLM
        does there."""
        if self.done:
            return
        self._terminate(FinishReason.ABORT, cancelled=True)
        if self._collector_id is not None:
            yield from self.gateway.abort(self._collector_id, internal=True)

    def _generate(self) -> Proc:
        world = self.world
        env = world.env
        spec = self.spec
        if spec.at > 0:
            yield env.timeout(spec.at)
        ev = world.sleep("client.send", 0.0, self.name)
        if ev is not None:
            yield ev
        # a named prompt rides on the event (the checker compares shared blocks' prompts); an
        # unnamed one adds nothing, so traces without shared prompts keep their shape
        world.emit(self.name, spec.id, 0, ClientSend(self.uid, spec.frontend, spec.n,
                                                     spec.prompt_tokens, spec.max_tokens,
                                                     spec.prompt))
        # the ID AsyncLLM is given: the client's own, or the endpoint's (racesim.engine_model.
        # api_server), which a bare-ID abort then misses
        api = self.api
        if api is not None and spec.kv_rejected:
            # the endpoint's ErrorResponse, then the raw-ID cleanup ADD
            yield from api.reject_kv_request(spec, self.uid)
            self._terminate(FinishReason.ERROR)
            return
        if api is None:
            request_id = spec.id
        elif self._responses:
            self._response_id = api.base_id(spec)
            request_id = api.request_id(spec, self.uid, self._response_id)
            api.responses_create(self._response_id, self)
        else:
            request_id = api.request_id(spec, self.uid)
        self._served_id = request_id
        if spec.input_chunks:
            gateway = self.gateway
            assert isinstance(gateway, AsyncLLM)  # the loader allows sessions on one API server
            result = yield from gateway.add_streaming_request(
                spec.id, client_uid=self.uid, prompt_tokens=spec.prompt_tokens,
                max_tokens=spec.max_tokens, eos_at=spec.eos_at, chunks=spec.input_chunks,
                interval=spec.chunk_interval, chunk_tokens=spec.chunk_tokens)
        else:
            result = yield from self.gateway.add_request(
                request_id, client_uid=self.uid, prompt_tokens=spec.prompt_tokens,
                max_tokens=spec.max_tokens, n=spec.n, eos_at=spec.eos_at,
                stop_string_at=spec.stop_string_at,
                prompt=spec.prompt if spec.prompt is not None else f"#{self.uid}",
                fault="preprocess" if spec.preprocess_error else
                "kv-load" if spec.kv_load_fails else
                "encode" if spec.unserializable else "", dp_rank=spec.dp_rank)
        if isinstance(result, str):
            self._terminate(result)
            return
        self._accepted = True
        self._collector_id = result.request_id
        disconnected = False
        while True:
            out = result.take()
            while out is None:
                yield result.wait()
                out = result.take()
            for tokens, reason in self._chunks(out):
                self.tokens += len(tokens)
                world.emit(self.name, spec.id, 0, ClientOutput(self.uid, tokens, reason,
                                                               self.done))
                if self.done:
                    continue  # still listening: anything arriving now breaks one-terminal-output
                if reason is not None:
                    self._terminate(reason)
                    continue
                limit = spec.disconnect_after_tokens
                if limit is not None and self.tokens >= limit and not disconnected:
                    disconnected = True
                    # The HTTP handler is cancelled; generate() aborts by its internal ID.
                    world.emit(self.name, spec.id, 0, ClientDisconnect(self.uid))
                    self._terminate(FinishReason.ABORT)
                    yield from self.gateway.abort(result.request_id, internal=True)
                    return

    def _abort_at(self, at: float) -> Proc:
        env = self.world.env
        if at > env.now:
            yield env.timeout(at - env.now)
        if self.done or not self._accepted:
            return
        spec = self.spec
        self.world.emit(self.name, spec.id, 0, ClientAbort(self.uid))
        if self.api is None:
            yield from self.gateway.abort(spec.id)
            return
        if self._responses:
            # POST /v1/responses/{id}/cancel: by the response ID, which is the body's
            # request_id (openai/responses/protocol.py:989)
            self.api.responses_cancel(self._response_id, self.uid)
            return
        # a router's /abort_requests: the client names its own ID or the served one
        name = spec.id if spec.abort_names == "bare" else self._served_id
        yield from self.api.router_abort([name], self.uid,
                                         "scale-out" if spec.endpoint == "generate-tokens"
                                         else "rl")
