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
from racesim.engine_model.frontend.output_processor import OutputProcessor, ParentRequest
from racesim.engine_model.frontend.outputs import RequestOutputCollector
from racesim.engine_model.ipc import Channel
from racesim.engine_model.messages import (
    AbortMessage,
    EngineCoreRequest,
    EngineDead,
    FinishReason,
    KVTransferParams,
)
from racesim.engine_model.versions import VllmProfile
from racesim.sim.world import World

if TYPE_CHECKING:
    from racesim.engine_model.frontend.hooks import LifecycleHooks
    from racesim.engine_model.frontend.state import FrontendState

__all__ = ["AsyncLLM"]

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
        self.engine_dead: str | None = None
        self._next_inc = next_inc
        self._inbox: deque[Any] = deque()
        self._wakeup: simpy.Event | None = None
        world.env.process(self._output_handler())

    # -- add_request ----------------------------------------------------------------------------

    def add_request(self, request_id: str, *, client_uid: int, prompt_tokens: int,
                    max_tokens: int, n: int = 1, eos_at: int | None = None,
                    stop_string_at: int | None = None,
                    kv_transfer_params: KVTransferParams | None = None,
                    ) -> Generator[simpy.Event, Any, RequestOutputCollector | str]:
        """Register then send; returns the collector, or the finish reason of a refusal."""
        world = self.world
        op = self.output_processor
        if self.engine_dead is not None:
            world.record(self.name, "fe.reject", request_id, 0, uid=client_uid,
                         reason="EngineDeadError")
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
        for index, rid in enumerate(ids):
            registered = not op.has_request(rid)
            if not registered and not op.finishes_duplicates:
                # OutputProcessor.add_request's ValueError("... already running") leaves
                # generate(), whose error path aborts the children already registered
                # (n > 1: another client took this child's ID while an earlier child's ADD
                # awaited its send).
                world.record(self.name, "fe.reject", rid, 0, uid=client_uid,
                             reason="already running", external=request_id)
                if index > 0:
                    yield from self.abort(internal, internal=True)
                return FinishReason.REJECTED
            req = EngineCoreRequest(rid, request_id, prompt_tokens, max_tokens, self.index,
                                    eos_at, kv_transfer_params, self._next_inc())
            if registered:
                op.add_request(req, parent, index, collector, client_uid, self.engine,
                               stop_string_at)
            else:
                # vLLM 0.33 (async_llm.py:567-585, output_processor.py:663-713): no error; the
                # old stream is finished, the new request is not registered, its ADD still goes.
                op.finish_stream(req)
                op.note_unregistered(req, client_uid, index)
            ev = world.sleep("frontend.add_request:before_send", 0.0, self.name)
            if ev is not None:
                yield ev
            self._send(req, [rid], incs=[req.inc])
        return collector

    # -- abort ----------------------------------------------------------------------------------

    def abort(self, request_id: str, internal: bool = False) -> Proc:
        """AsyncLLM.abort: what is dropped when, and when the ABORT leaves, is the policy's."""
        ids = self.output_processor.flatten_req_to_abort([request_id], internal)
        if not ids:
            self.world.record(self.name, "fe.abort_noop", request_id, 0)
            return
        incs = [self.output_processor.inc_of(r) for r in ids]
        self.world.record(self.name, "fe.abort_issue", request_id, incs[0] if len(incs) == 1 else 0,
                          ids=ids, cause="abort")
        yield from self.policy.abort(self, ids)

    def send_abort(self, request_ids: Sequence[str], point: str) -> Proc:
        """Pass ``point`` (the await on the socket send), then put the ABORT on the wire."""
        ev = self.world.sleep(point, 0.0, self.name)
        if ev is not None:
            yield ev
        if request_ids:
            tag = self._next_inc()
            self._send(AbortMessage(tuple(request_ids), tag), list(request_ids), tag=tag)

    def _send(self, msg: Any, request_ids: list[str], **detail: Any) -> None:
        assert self.input_channel is not None
        self.input_channel.send(msg, request_ids, to=self.engine, **detail)

    # -- output handler -------------------------------------------------------------------------

    def deliver(self, msg: Any) -> None:
        """Output socket: EngineCoreOutputs (or the engine's death) arrived."""
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
                op.fail_engine(msg.engine, msg.reason)
                continue
            # EngineCoreOutputs: the model's, or vLLM's own behind a backend's envelope
            outputs = msg.outputs
            if len(outputs) <= chunk:  # one chunk: no slice, no await between chunks
                reqs_to_abort = op.process_outputs(outputs)
                if reqs_to_abort:
                    yield from self.policy.abort_stop_strings(self, reqs_to_abort)
                continue
            for start in range(0, len(outputs), chunk):
                reqs_to_abort = op.process_outputs(outputs[start:start + chunk])
                if start + chunk < len(outputs):
                    ev = world.sleep("frontend.output_handler:between_chunks", 0.0, self.name)
                    if ev is not None:
                        yield ev
                if reqs_to_abort:
                    yield from self.policy.abort_stop_strings(self, reqs_to_abort)

