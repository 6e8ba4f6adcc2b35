"""Scripted clients as asyncio tasks on an API server's loop, calling vLLM's AsyncLLM as the
OpenAI server's handlers do.

A client's task iterates ``AsyncLLM.generate()`` (v1/engine/async_llm.py ``generate``). A
disconnect or a cancelled handler is ``task.cancel()`` on that task, as ``with_cancellation``
does (entrypoints/utils.py): the ``CancelledError`` reaches ``generate`` at its next suspension
and it aborts by the internal ID. ``abort_at`` is a router's ``/abort_requests``: a separate task
calling ``AsyncLLM.abort(id)`` by the external ID. The client records what it receives with the
model's client events; each token id carries its incarnation (the engine's fake vocabulary).
"""

from __future__ import annotations

import asyncio
from typing import Any

from racesim.engine_model.config import RequestSpec
from racesim.engine_model.events.client import (
    ClientAbort,
    ClientCancel,
    ClientDisconnect,
    ClientDone,
    ClientOutput,
    ClientSend,
)
from racesim.engine_model.messages import FinishReason
from racesim.engine_vllm.frontend.asyncllm import CALLER

__all__ = ["RealClient"]


class RealClient:
    """One scripted request on API server ``fe``."""

    def __init__(self, fe: Any, index: int, uid: int, spec: RequestSpec, vocab: Any) -> None:
        self.fe = fe
        self.world = fe.world
        self.index = index
        self.uid = uid
        self.spec = spec
        self.vocab = vocab
        self.name = f"client{index}"
        self.tokens = 0
        self.finish_reason: str | None = None
        self.accepted = False
        #: what generate() raised (the client saw an error)
        self.error = ""
        loop = fe.loop
        self.task = loop.create_task(self._run(), name=f"{self.name}:generate")
        fe.clients[self.task] = self
        if spec.abort_at is not None:
            loop.call_at(float(spec.abort_at), self._abort_at)
        if spec.cancel_at is not None:
            loop.call_at(float(spec.cancel_at), self._cancel_at)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def _terminate(self, reason: str) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
            self.world.emit(self.name, self.spec.id, 0, ClientDone(self.uid, reason, self.tokens))

    def _params(self) -> Any:
        v = self.fe.v
        spec = self.spec
        kind = v.RequestOutputKind.DELTA
        if spec.stop_string_at is None:
            return v.SamplingParams(n=spec.n, max_tokens=spec.max_tokens, detokenize=False,
                                    output_kind=kind)
        return v.SamplingParams(n=spec.n, max_tokens=spec.max_tokens, output_kind=kind,
                                stop=["a" * spec.stop_string_at])

    def _prompt(self, tokens: int | None = None) -> Any:
        from racesim.engine_vllm.engine.views import PROMPT_TOKEN

        ids = [PROMPT_TOKEN] * (self.spec.prompt_tokens if tokens is None else tokens)
        v = self.fe.v
        if v.tokens_input is not None:  # a rendered prompt, as the OpenAI server passes
            return v.tokens_input(ids)
        return {"prompt_token_ids": ids}  # TokensPrompt (before vllm.inputs.engine)

    async def _session(self) -> Any:
        """A streaming-input session's input stream (vLLM's ``StreamingInput`` chunks, which
        ``AsyncLLM.generate`` takes as an async generator): the first chunk at once, then one
        more every ``chunk_interval``, of ``chunk_tokens`` tokens (default: ``prompt_tokens``)
        as the model's client sends them; ending the stream is what makes vLLM send the
        session's final add (async_llm.py ``handle_inputs``)."""
        v = self.fe.v
        spec = self.spec
        for k in range(spec.input_chunks + 1):
            if k:
                await asyncio.sleep(spec.chunk_interval)
            yield v.StreamingInput(self._prompt(spec.chunk_tokens if k else None))

    async def _arrive(self) -> None:
        """The client's arrival: its start time, the ``client.send`` await point, its send."""
        world = self.world
        spec = self.spec
        loop = self.fe.loop
        if spec.at > loop.time():
            await asyncio.sleep(spec.at - loop.time())
        delay = world.pause("client.send", 0.0, self.name)
        if delay > 0:
            await asyncio.sleep(delay)
        world.emit(self.name, spec.id, 0, ClientSend(self.uid, spec.frontend, spec.n,
                                                     spec.prompt_tokens, spec.max_tokens,
                                                     spec.prompt))

    async def _run(self) -> None:
        await self._arrive()
        world = self.world
        spec = self.spec
        llm = self.fe.llm
        decode = self.vocab.decode
        CALLER.set(self)
        prompt = self._session() if spec.input_chunks else self._prompt()
        try:
            async for out in llm.generate(prompt, self._params(), spec.id):
                tokens = []
                for c in out.outputs:
                    for t in c.token_ids:
                        tok = decode(t)
                        tokens.append([c.index, tok.inc, tok.ctx])
                reason = None
                if out.finished:
                    reasons = [c.finish_reason for c in out.outputs if c.finish_reason]
                    reason = (FinishReason.ABORT if FinishReason.ABORT in reasons
                              else reasons[-1] if reasons else FinishReason.ABORT)
                self.tokens += len(tokens)
                world.emit(self.name, spec.id, 0, ClientOutput(self.uid, tokens, reason,
                                                               self.done))
                if reason is not None:
                    self._terminate(str(reason))
                    continue
                limit = spec.disconnect_after_tokens
                if limit is not None and self.tokens >= limit and not self.done:
                    # the server notices the disconnect and cancels the handler task
                    world.emit(self.name, spec.id, 0, ClientDisconnect(self.uid))
                    self._terminate(FinishReason.ABORT)
                    self.task.cancel()
        except asyncio.CancelledError:
            self._terminate(FinishReason.ABORT)
        except Exception as exc:  # EngineDeadError and what generate() raises on it
            cause = exc.__cause__ or exc
            self.error = f"{type(cause).__name__}: {cause}"
            tb = cause.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            where = tb.tb_frame.f_code.co_filename if tb is not None else ""
            if "/engine_vllm/frontend/" in where:
                self.fe.system.crashes.append(self.error)  # racesim's bug, not vLLM's answer
            # OutputProcessor.add_request's ValueError("Request id ... already running.")
            # (0.10.1.1 v1/engine/output_processor.py:333-335, 0.14.0 :466-468) refuses the
            # request before it reaches the engine: the client was rejected, as on the model
            rejected = isinstance(cause, ValueError) and where.endswith(
                "v1/engine/output_processor.py")
            self._terminate(FinishReason.REJECTED if rejected else FinishReason.ERROR)
        if not self.done:
            # generate() ended on vLLM's STREAM_FINISHED sentinel, which it does not yield
            # (async_llm.py generate): the stream ended with no finish reason
            self._terminate(FinishReason.STREAM_FINISHED)

    def _cancel_at(self) -> None:
        if self.done or self.task.done():
            return
        self.world.emit(self.name, self.spec.id, 0, ClientCancel(self.uid))
        self.task.cancel()

    def _abort_at(self) -> None:
        if self.done or not self.accepted:
            return
        task = self.fe.loop.create_task(self._router_abort(), name=f"{self.name}:abort")
        self.fe.clients[task] = self

    async def _router_abort(self) -> None:
        """A router's /abort_requests handler: AsyncLLM.abort by the external ID. The client
        gives its request up when the handler runs, so its ClientAbort and the
        ``abort_requests`` that ``abort`` calls before its first await are one step of this
        task: the checker pairs each abort with its asker even when other clients' handlers
        run at the same instant (abort-isolation, engine_model/monitors/isolation.py)."""
        self.world.emit(self.name, self.spec.id, 0, ClientAbort(self.uid))
        await self.fe.llm.abort(self.spec.id)
