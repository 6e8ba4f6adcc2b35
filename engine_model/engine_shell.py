"""EngineShell: the process around an engine core, shared by the model's and vLLM's backends.

vLLM 0.33's ``EngineCoreProc`` (vllm/v1/engine/core.py) runs an input thread that preprocesses
each message and queues it (``process_input_sockets``, :1933), and a busy loop that applies the
queued inputs only between steps, then steps (``run_busy_loop`` :1621, ``_process_input_queue``
:1647, ``_process_engine_step`` :1678); an exception escaping a step kills the process
(:1582-1587).
This shell is that process: its sockets, both threads, the eager ``aborts_queue``, the GPU
queue's timing and death. What a step does, and what adding, aborting or pausing means, is the
backend's: a subclass supplies those as the hooks below.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import Any

import simpy

from racesim.engine_model.config import EngineConfig, batch_queue_depth
from racesim.engine_model.events.engine import EngineFatalEvent, EngineFault, EngineResume
from racesim.engine_model.fatal import EngineFatal
from racesim.engine_model.ipc import Channel
from racesim.engine_model.kv_connector import ConnectorScheduler
from racesim.engine_model.messages import (
    AbortMessage,
    EngineCoreRequest,
    EngineDead,
    UtilityMessage,
)
from racesim.engine_model.versions import VllmProfile
from racesim.sim.world import World


def _no_attrs(*_attrs: object, **_kwattrs: object) -> Any:
    return lambda cls: cls


try:
    from mypy_extensions import mypyc_attr
except ImportError:  # a pure-Python install may lack it; only mypyc reads the attribute
    mypyc_attr = _no_attrs

__all__ = ["EngineShell"]

#: ``engine_recovery_timeout_sec``'s default (vLLM 0.33 config/fault_tolerance.py:12).
_FT_RECOVERY_TIMEOUT = 120.0


@mypyc_attr(allow_interpreted_subclasses=True)  # the vllm backend's core is interpreted
class EngineShell:
    """One engine process: the input thread, the busy loop, the GPU queue and death; a subclass
    is the core that steps. It calls :meth:`start` once its own parts exist."""

    def __init__(self, world: World, index: int, name: str, config: EngineConfig,
                 profile: VllmProfile, fatal: type[Exception] = EngineFatal) -> None:
        self.world = world
        self.index = index
        self.name = name
        self.config = config
        #: decode side under P/D: the connector whose leases and heartbeats wake an idle loop.
        #: (the vllm backend's NixlTransport stands in for it: typed loosely, so the compiled
        #: shell accepts that interpreted class)
        self.connector: ConnectorScheduler | Any = None
        self.output_channels: dict[int, Channel] = {}
        #: decode side: where transfer-done notices go, by remote engine index.
        self.notify_channels: dict[int, Channel] = {}
        #: P, NIXL push mode: where a WRITE's completion notice goes, by decode engine.
        self.push_channels: dict[int, Channel] = {}
        self.dead: str | None = None
        #: ``pause_generation`` in "abort"/"wait" mode: adds of new IDs get a retryable ERROR.
        self.reject_new_requests = False
        self.input_queue: deque[tuple[str, Any]] = deque()
        #: run once each when the busy loop next finds no work (vLLM 0.33's
        #: ``_idle_state_callbacks``, core.py:1650-1652, 1698-1701: a pause's deferred reply)
        self.idle_callbacks: list[Any] = []
        self.aborts_queue: deque[AbortMessage] = deque()
        # vLLM 0.33 core.py:1650-1666: an idle busy loop discards aborts_queue (every ABORT is
        # also in input_queue).
        self._idle_clears_aborts = profile.idle_clears_aborts
        self._max_batches = batch_queue_depth(config)
        self._fatal = fatal
        self._inbox: deque[Any] = deque()
        self._input_wakeup: simpy.Event | None = None
        self._loop_wakeup: simpy.Event | None = None
        self._gpu_free_at = 0.0
        self._c_input = f"{name}.input"
        self.c_core = f"{name}.core"

    def start(self) -> None:
        """Start both threads (after the subclass has built its parts, so that every process
        of the engine is created in the same order as before)."""
        env = self.world.env
        env.process(self._input_thread())
        env.process(self._busy_loop())

    # -- the backend's hooks --------------------------------------------------------------------

    def _preprocess(self, msg: EngineCoreRequest) -> Any:
        """``preprocess_add_request``: what the input thread queues for an ADD."""
        raise NotImplementedError

    def _reject(self, rid: str, inc: int, client: int, why: str) -> None:
        """An ADD answered with an ERROR output and never scheduled."""
        raise NotImplementedError

    def _apply_input(self, kind: str, payload: Any) -> None:
        """One queued input ("add", "abort" or "utility"), applied between steps."""
        raise NotImplementedError

    def _abort(self, msg: AbortMessage, cause: str) -> None:
        raise NotImplementedError

    def _has_work(self) -> bool:
        """The scheduler holds requests, or a batch is in flight."""
        raise NotImplementedError

    def _step(self) -> Generator[simpy.Event, Any, bool]:
        """One pass of step / step_with_batch_queue; returns whether anything ran."""
        raise NotImplementedError

    # -- sockets --------------------------------------------------------------------------------

    def deliver(self, msg: Any) -> None:
        """A message arrived on the input socket."""
        self._inbox.append(msg)
        ev = self._input_wakeup
        if ev is not None and not ev.triggered:
            ev.succeed()

    def _wake_loop(self) -> None:
        ev = self._loop_wakeup
        if ev is not None and not ev.triggered:
            ev.succeed()

    # -- input thread (EngineCoreProc.process_input_sockets) ------------------------------------

    def _input_thread(self) -> Generator[simpy.Event, Any, None]:
        world = self.world
        env = world.env
        inbox = self._inbox
        natural = self.config.preprocess_time
        while True:
            while not inbox:
                self._input_wakeup = env.event()
                yield self._input_wakeup
            msg = inbox.popleft()
            ev = world.sleep("engine.input:preprocess", natural, self._c_input)
            if ev is not None:
                yield ev
            if self.dead is not None:
                continue
            if isinstance(msg, EngineCoreRequest):
                if msg.fault == "preprocess":
                    # core.py:2016-2020, 2161-2168: an exception in preprocess_add_request
                    # sends an ERROR output from this thread; nothing is queued.
                    self._reject(msg.request_id, msg.inc, msg.client_index, "preprocess-error")
                    continue
                self.input_queue.append(("add", self._preprocess(msg)))
            elif isinstance(msg, AbortMessage):
                if self.config.eager_aborts:
                    self.aborts_queue.append(msg)
                self.input_queue.append(("abort", msg))
            elif isinstance(msg, UtilityMessage):
                self.input_queue.append(("utility", msg))
            self._wake_loop()

    # -- busy loop (EngineCoreProc.run_busy_loop) -----------------------------------------------

    def _busy_loop(self) -> Generator[simpy.Event, Any, None]:
        """``run_busy_loop`` under ``fault_tolerant_wrapper`` (v1/fault_tolerance/
        engine_core_sentinel.py:207-231): without fault tolerance an exception kills the
        engine; with it, :meth:`_fault` decides whether the loop runs again."""
        while self.dead is None:
            try:
                yield from self._run_busy_loop()
            except self._fatal as exc:
                if not self.config.fault_tolerance:
                    # the vllm backend's fatal error names vLLM's file:line (engine_vllm/oracle.py)
                    where = getattr(exc, "where", None)
                    self._die(str(exc), where if isinstance(where, str) else None)
                    return
                resumed = yield from self._fault(str(exc))
                if not resumed:
                    return

    def _run_busy_loop(self) -> Generator[simpy.Event, Any, None]:
        while self.dead is None:
            # A transfer's end reaches the scheduler only through a step: the worker reports it
            # in that step's KVConnectorOutput, which update_from_output applies (0.33
            # scheduler.py:2581-2582, 3556-3582), after the loop applied the queued inputs
            # (core.py:1621-1690). A backend's _has_work counts such a report.
            while not self._has_work() and self.idle_callbacks:
                self.idle_callbacks.pop()()
            while not self.input_queue and not self._has_work():
                if self._idle_clears_aborts:
                    self.aborts_queue.clear()
                yield from self._idle_wait()
            while self.input_queue:
                self._apply_input(*self.input_queue.popleft())
            progressed = yield from self._step()
            if not progressed and not self.input_queue:
                # Nothing could be scheduled (e.g. the pool is full of a waiting request's
                # needs): the real loop spins; here we wait for the next input instead.
                if self.aborts_queue:
                    if self._has_work():
                        # each spin's step() applies the eager copies (0.33 core.py:690)
                        self._process_aborts_queue()
                    elif self._idle_clears_aborts:
                        self.aborts_queue.clear()  # 0.33 core.py:1650-1666, every idle pass
                yield from self._idle_wait()

    def _fault(self, reason: str) -> Generator[simpy.Event, Any, bool]:
        """``EngineCoreSentinel.on_fault`` (engine_core_sentinel.py:82-107): finish every
        request as aborted and send their ABORT outputs, then wait for the retry instruction
        (``retry``, :155-169, which the input thread takes even now, core.py:2024-2028)
        for up to ``engine_recovery_timeout_sec`` (120 s, config/fault_tolerance.py:12). A
        retry drains the batch queue, whose sampled tokens are discarded
        (``_drain_batch_queue``, :109-140), and the loop resumes with what the input queue
        and ``aborts_queue`` still hold. No retry: the engine dies."""
        world = self.world
        retry = self.config.ft_retry_after
        world.emit(self.c_core, None, 0, EngineFault(reason, retry))
        self._abort_all_for_fault()
        if retry is None or retry > _FT_RECOVERY_TIMEOUT:
            yield world.env.timeout(_FT_RECOVERY_TIMEOUT)
            self._die(reason)
            return False
        yield world.env.timeout(retry)
        world.emit(self.c_core, None, 0, EngineResume(self._drain_batches()))
        return True

    def _abort_all_for_fault(self) -> None:
        """``scheduler.finish_requests(None, FINISHED_ABORTED)`` and ``_send_abort_outputs``."""
        raise NotImplementedError

    def _drain_batches(self) -> list[int]:
        """Discard the batches in flight; their step numbers."""
        raise NotImplementedError

    def _idle_wait(self) -> Generator[simpy.Event, Any, None]:
        env = self.world.env
        self._loop_wakeup = env.event()
        expiry = None
        connector = self.connector
        if connector is not None and self._kv_wakes_idle():
            expiry = connector.next_expiry()
            beat = connector.next_heartbeat()
            if beat is not None and (expiry is None or beat < expiry):
                expiry = beat
        if expiry is not None:
            yield self._loop_wakeup | env.timeout(max(0.0, expiry - env.now))
        else:
            yield self._loop_wakeup
        self._loop_wakeup = None

    def _kv_wakes_idle(self) -> bool:
        """Whether a hold's end or a heartbeat due wakes the idle loop (the backend says)."""
        return True

    def _process_aborts_queue(self) -> None:
        while self.aborts_queue:
            self._abort(self.aborts_queue.popleft(), "abort(eager)")

    # -- the GPU queue --------------------------------------------------------------------------

    def _on_gpu(self, value: Any, executes: bool) -> simpy.Event:
        """A batch submitted with execute_model(non_block=True): its future, done with
        ``value`` once the GPU queue reaches it and (``executes``: it has tokens to compute)
        its forward pass ends."""
        world = self.world
        now = world.now
        if executes:
            delay = world.pause("engine.step:execute", self.config.step_time, self.c_core)
        else:
            delay = 0.0
        start = self._gpu_free_at if self._gpu_free_at > now else now
        self._gpu_free_at = start + delay
        return world.env.timeout(self._gpu_free_at - now, value)

    # -- death ----------------------------------------------------------------------------------

    def _die(self, reason: str, where: str | None = None) -> None:
        """EngineCoreProc died: ENGINE_DEAD to every client. ``where``: the vLLM ``file:line``
        that raised, when vLLM's own code did."""
        self.dead = reason
        self.world.emit(self.c_core, None, 0, EngineFatalEvent(reason, where))
        channels = self.output_channels
        for client in sorted(channels):
            channels[client].send(EngineDead(self.index, reason), ["*"])
