"""vLLM's own ``EngineCoreProc._process_input_queue`` and ``_handle_client_request``, fed the
inputs the shell's input thread queued.

The busy loop's first half is the release's code, called on the stepper's facade (an
``EngineCoreProc`` made with ``object.__new__``): which inputs it takes before a step, when it
blocks on the input queue (0.10.1.1 core.py:722-739 whenever no request is held, even with a
batch still queued; 0.11.0 core.py:730-748 and 0.14.0 core.py:958-983 not while a batch is
queued; 0.20.0 core.py:1174-1204 and 0.33.0 core.py:1647-1676 ``has_work()``, with the
idle-state callbacks; from 0.14 the idle loop drains ``aborts_queue``), and what each input does
(``_handle_client_request``: 0.33.0's ``_reject_add_while_paused``, ``EngineCore.add_request``
with ``abort_immediately``, ``abort_requests``, a utility call's dispatch).

The facade's ``input_queue`` (:class:`InputFeed`) hands vLLM the ``(EngineCoreRequestType,
request)`` pairs ``process_input_sockets`` would queue; a blocking ``get()`` on an empty queue
is the busy loop's idle wait (the simulation's time: the step's greenlet switches to the busy
loop's simpy process until an input arrives). What stays racesim's: the ground truth beside each
input (an ABORT's incarnation, the ADD's request object), the Scheduler calls' trace events
(the stepper wraps ``Scheduler.add_request`` as it wraps ``schedule``), ``abort_requests``
(stepper: one ABORT at a time, as ``finish_requests`` iterates a set), and a utility method's
body: pause_generation / resume_scheduler are racesim's model on the real Scheduler's pause state
(finishes.utility), dispatched by vLLM's code and answered by finishes.reply_when_paused, so
vLLM's own ``UtilityOutput`` for them is not sent; an exception inside that model kills the
engine, where vLLM's ``_invoke_utility_method`` would reply with a failure (no scenario reaches
it). An attribute vLLM's code reads that the facade was not given is racesim's gap
(oracle.StandInGap), never vLLM's verdict.
"""

from __future__ import annotations

import queue
from functools import cache
from typing import Any

from greenlet import getcurrent

from racesim.engine_model.events.engine import EngineReject
from racesim.engine_model.messages import AbortMessage
from racesim.engine_vllm.engine import finishes
from racesim.engine_vllm.oracle import StandInGap

__all__ = ["IDLE", "InputFeed", "OutputSink", "facade_class", "install", "abort_context"]

#: what the step's greenlet switches out with when vLLM's loop blocks on an empty input queue
IDLE = object()
#: the facade's name for racesim's utility model (vLLM's dispatch looks it up by name)
_UTILITY = "_racesim_utility"


class InputFeed:
    """``input_queue`` as vLLM's busy loop reads it, over the shell's ``input_queue`` of
    ``(kind, payload)`` entries; ``current`` is the entry being handled, for its ground truth."""

    def __init__(self, core: Any) -> None:
        from vllm.v1.engine import EngineCoreRequestType

        self.core = core
        self._types = EngineCoreRequestType
        #: before 0.10 an ADD is queued bare, not with its DP wave (0.9.2 core.py:638-641)
        self._bare_add = core.v.api.key < (0, 10)
        self.current: tuple[str, Any] | None = None
        #: inputs taken (and whether the loop blocked) since :meth:`reset`
        self.taken = 0
        self.blocked = False

    def reset(self) -> None:
        self.taken = 0
        self.blocked = False

    def empty(self) -> bool:
        return not self.core.input_queue

    def get(self, block: bool = True, timeout: float | None = None) -> tuple[Any, Any]:
        shell = self.core.input_queue
        while not shell:
            if not block:
                raise queue.Empty
            self.blocked = True
            getcurrent().parent.switch(IDLE)
        return self._take(shell.popleft())

    def get_nowait(self) -> tuple[Any, Any]:
        return self.get(False)

    def _take(self, entry: tuple[str, Any]) -> tuple[Any, Any]:
        kind, payload = entry
        self.current = entry
        self.taken += 1
        t = self._types
        if kind == "add":
            return t.ADD, (payload if self._bare_add else (payload, 0))
        if kind == "abort":
            return t.ABORT, list(payload.request_ids)
        # the shape of a decoded UTILITY request, (client, call_id, method, args), naming
        # racesim's pause model; its reply is racesim's (finishes.reply_when_paused)
        return t.UTILITY, (0, 0, _UTILITY, (payload,))


class OutputSink:
    """``output_queue`` for what ``_handle_client_request`` itself sends (0.33.0's paused-add
    ERROR, ``_send_finish_outputs_to_client``): vLLM's own outputs, to the client's channel
    with the input's incarnation beside them."""

    def __init__(self, core: Any, feed: InputFeed) -> None:
        self.core = core
        self.feed = feed

    def put_nowait(self, item: tuple[int, Any]) -> None:
        client, eco = item
        if eco.utility_output is not None:
            return  # racesim's utility model replies itself (finishes.reply_when_paused)
        core = self.core
        entry = self.feed.current
        req = entry[1] if entry is not None and entry[0] == "add" else None
        incs = []
        for o in eco.outputs:
            inc = core.inc_of(req) if req is not None and req.request_id == o.request_id else 0
            error = getattr(o, "error", None)
            why = error.code.replace("_", "-") if error is not None else str(o.finish_reason)
            core.world.emit(core.c_core, o.request_id, inc, EngineReject(why))
            incs.append(inc)
        finishes.send_outputs(core, client, eco, incs)


class _Dispatch:
    """The facade's ``_handle_client_request``: vLLM's, with the pause state racesim's utility
    model keeps; and that model as the utility method vLLM's dispatch calls."""

    def __init__(self, core: Any, facade: Any, feed: InputFeed) -> None:
        from vllm.v1.engine.core import EngineCoreProc

        self.core = core
        self.facade = facade
        self.feed = feed
        self.real = EngineCoreProc._handle_client_request.__get__(facade)
        self.error: BaseException | None = None

    def handle(self, request_type: Any, request: Any) -> None:
        self.facade.__dict__["reject_new_requests"] = self.core.reject_new_requests
        try:
            self.real(request_type, request)
        finally:
            self.feed.current = None
        if (exc := self.error) is not None:
            # racesim's model raised: not a failed utility call (vLLM's
            # _invoke_utility_method would log it and reply with a failure)
            self.error = None
            raise exc

    def utility(self, msg: Any) -> None:
        try:
            finishes.utility(self.core, msg)
        except BaseException as exc:  # noqa: BLE001 - re-raised once vLLM's dispatch returns
            self.error = exc


@cache
def facade_class() -> type:
    """``EngineCoreProc`` as the stepper's facade: an attribute it was not given is a
    :class:`StandInGap` (racesim's), not an AttributeError inside vLLM's code."""
    from vllm.v1.engine.core import EngineCoreProc

    class Facade(EngineCoreProc):  # type: ignore[misc,valid-type]
        def __getattr__(self, name: str) -> Any:
            raise StandInGap.of("EngineCoreProc", name)

    return Facade


def install(core: Any, facade: Any) -> InputFeed:
    """The busy loop's attributes on the facade (EngineCoreProc.__init__, 0.33.0
    core.py:1192-1229: not the engine of a DP group, running, blocking on its input queue)."""
    feed = InputFeed(core)
    dispatch = _Dispatch(core, facade, feed)
    d = facade.__dict__
    d["input_queue"] = feed
    d["output_queue"] = OutputSink(core, feed)
    d["engines_running"] = False
    d["process_input_queue_block"] = True
    d["reject_new_requests"] = False
    # vLLM calls each callback with the engine (finishes.reply_when_paused's take one)
    d["_idle_state_callbacks"] = core.idle_callbacks
    try:
        from vllm.v1.engine.core import EngineShutdownState  # 0.20+

        d["shutdown_state"] = EngineShutdownState.RUNNING
    except ImportError:
        pass
    d["_handle_client_request"] = dispatch.handle
    d[_UTILITY] = dispatch.utility
    if core.v.api.key < (0, 10):
        # 0.9.2's busy loop builds the Request in EngineCore.add_request (core.py:176-199:
        # Request.from_engine_core_request); racesim's input thread built it already, the
        # same way (_vllm.new_request), so the facade's add_request hands it to the Scheduler
        d["add_request"] = lambda request: core.sched.add_request(request)
    return feed


def abort_context(feed: InputFeed, request_ids: list[str]) -> tuple[AbortMessage, str]:
    """The ground truth of an ``abort_requests`` call ``_handle_client_request`` made: the
    ABORT being handled, or (an ADD with ``abort_immediately``, 0.33.0 core.py:558-562) a
    message for the request just added."""
    entry = feed.current
    if entry is not None and entry[0] == "abort" and list(entry[1].request_ids) == request_ids:
        return entry[1], "abort"
    return AbortMessage(tuple(request_ids), 0), "abort-immediately"
