"""AsyncLLM's side toward its engine cores: the sends (vLLM's AsyncMPClient and
DPLBAsyncMPClient, vllm/v1/engine/core_client.py) and the output handler task that reads their
outputs (``output_handler`` in vllm/v1/engine/async_llm.py). What a request's add and abort
mean is :class:`AsyncLLM`'s (async_llm.py), which is this with the request API.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any

import simpy

from racesim.engine_model.config import FrontendConfig
from racesim.engine_model.data_parallel import DPLoadBalancer
from racesim.engine_model.events.dp import DpAbortUnrouted
from racesim.engine_model.events.frontend import FeUtility
from racesim.engine_model.frontend.output_processor import OutputProcessor
from racesim.engine_model.ipc import Channel
from racesim.engine_model.messages import (
    AbortMessage,
    EngineCoreRequest,
    EngineDead,
    UtilityMessage,
)
from racesim.engine_model.points import POINTS, UnknownPointError
from racesim.engine_model.versions import VllmProfile
from racesim.sim.world import World

if TYPE_CHECKING:
    from racesim.engine_model.frontend.hooks import LifecycleHooks
    from racesim.engine_model.frontend.state import FrontendState

__all__ = ["EngineIO", "STOP_POINT"]

#: the await on a stop-string ABORT's send (its width depends on the step's size)
STOP_POINT = "frontend.output_handler:before_abort_send"

Proc = Generator[simpy.Event, Any, Any]


class EngineIO:
    """One API server's sockets to its engine cores and its output handler; :class:`AsyncLLM`
    adds the request API."""

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

    # -- sends ----------------------------------------------------------------------------------

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

    def pause_generation(self, method: str, mode: str = "", clear_cache: bool = False) -> None:
        """pause_generation / resume_generation: a UTILITY call to every engine (all mode
        handling, and the cache clearing, is the engine's, async_llm.py:989-1028)."""
        self.world.emit(self.name, None, 0, FeUtility(method, mode))
        for engine in self.engines:
            self._send(UtilityMessage(method, mode, clear_cache), ["*"], engine)

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
