"""Finishes on the vllm backend through vLLM's own Scheduler: a client's ABORT, and the
engine-initiated ones.

An ABORT goes to ``finish_requests`` for any request the Scheduler knows, and vLLM decides what
it finishes: before 0.14 a finished request still held for the decode side is finished again
and its blocks freed (#25067; 0.10.1.1 v1/core/sched/scheduler.py:997-1018), since then it is
skipped (0.14.0 scheduler.py:1473).

``EngineCoreProc`` sends these outputs itself, outside ``update_from_output``: an ERROR output
for a request whose preprocessing raised (``_handle_request_preproc_error``, core.py:2161-2168,
from the input thread) or that arrived while generation was paused in "abort" or "wait" mode
(``_reject_add_while_paused``, core.py:1796-1813), and ABORT outputs for the requests
``pause_generation(mode="abort")`` finished (``pause_scheduler``, core.py:2181-2237, with
``finish_requests(None, FINISHED_ABORTED)`` and ``_send_abort_outputs``). Each is vLLM's own
``EngineCoreOutput`` with no tokens (``_send_finish_outputs_to_client``, core.py:2246-2258).
The pause state is the real Scheduler's (``set_pause_state``): what it keeps from being
scheduled is vLLM's decision. A pause with ``clear_cache`` (``[engine] pause_clear_cache``)
completes, at once or when the engine is next idle, with the real Scheduler's
``reset_prefix_cache(reset_running_requests=True)``: every running request preempted, the
prefix cache emptied (:func:`clear_caches`); so does a ``reset_prefix_cache`` call with
``reset_running_requests=True`` (``[engine] reset_prefix_cache_at``), between two steps. Not
driven there: the multimodal and encoder caches (no multimodal inputs here: nothing is in them)
and 0.33's ``synchronize_device``.
"""

from __future__ import annotations

from typing import Any, Protocol

from racesim.engine_model.events.engine import (
    EngineReject,
    EngineUtility,
    SchedAbortMiss,
    SchedFinish,
    SchedPreempt,
)
from racesim.engine_model.events.pd import PdRelease
from racesim.engine_model.messages import AbortMessage, UtilityMessage
from racesim.engine_vllm.frontend import EngineCoreOutputs, Envelope

__all__ = ["abort", "abort_all", "send_finish_outputs", "send_outputs", "reject", "utility",
           "reply_when_paused", "clear_caches", "when_idle"]


class VllmEngineCore(Protocol):
    """What these finishes use of :class:`racesim.engine_vllm.engine.core.VllmEngineCore`."""

    world: Any
    index: int
    v: Any
    sched: Any
    kv: Any
    output_channels: dict[int, Any]
    reject_new_requests: bool
    c_core: str
    c_sched: str

    def inc_of(self, req: Any) -> int: ...

    def call(self, fn: Any, *args: Any) -> Any: ...


def send_finish_outputs(core: VllmEngineCore, finished: list[tuple[str, int]], client: int,
                        reason: Any) -> None:
    """``_send_finish_outputs_to_client``: one empty final output per (ID, incarnation)."""
    channel = core.output_channels.get(client)
    if channel is None or not finished:
        return
    v = core.v
    outs = [v.EngineCoreOutput(rid, [], finish_reason=reason) for rid, _inc in finished]
    real = v.EngineCoreOutputs(finished_requests=[rid for rid, _inc in finished], outputs=outs)
    send_outputs(core, client, real, [inc for _rid, inc in finished])


def send_outputs(core: VllmEngineCore, client: int, real: Any, incs: list[int]) -> None:
    """vLLM's ``EngineCoreOutputs`` of final outputs with no tokens, to ``client``, each
    output's incarnation beside it."""
    channel = core.output_channels.get(client)
    if channel is None or not real.outputs:
        return
    envelopes = tuple(Envelope(o, inc) for o, inc in zip(real.outputs, incs, strict=True))
    channel.send(EngineCoreOutputs(core.index, envelopes, real),
                 [e.output.request_id for e in envelopes],
                 outputs=[[e.output.request_id, e.inc, 0, str(e.output.finish_reason)]
                          for e in envelopes])


def reject(core: VllmEngineCore, rid: str, inc: int, client: int, why: str) -> None:
    """An ADD answered with an ERROR output and never scheduled."""
    core.world.emit(core.c_core, rid, inc, EngineReject(why))
    send_finish_outputs(core, [(rid, inc)], client, core.v.FinishReason.ERROR)


def abort(core: VllmEngineCore, msg: AbortMessage, cause: str) -> None:
    """One ABORT: one ID per call, as finish_requests iterates a set of the IDs it is given
    (scheduler.py:2983), whose order would depend on PYTHONHASHSEED."""
    for rid in msg.request_ids:
        req = core.sched.requests.get(rid)
        before, inc = (None, 0) if req is None else (req.status, core.inc_of(req))
        if req is not None:
            core.call(core.sched.finish_requests, rid, core.v.RequestStatus.FINISHED_ABORTED)
        if req is None or req.status == before:
            core.world.emit(core.c_sched, rid, inc, SchedAbortMiss(cause, msg.tag))
            continue
        if before is not None and core.v.RequestStatus.is_finished(before):
            # a held request finished again: its hold ends here (the model's pd.release)
            core.world.emit(core.c_sched, rid, inc, PdRelease("abort", before.name))
        core.world.emit(core.c_sched, rid, inc, SchedFinish("FINISHED_ABORTED", cause, msg.tag))
        core.kv.sync({rid: inc})


def abort_all(core: VllmEngineCore, cause: str) -> None:
    """``finish_requests(None, FINISHED_ABORTED)`` and ``_send_abort_outputs`` on the real
    Scheduler: pause_generation(mode="abort") (core.py:2202-2206) and fault tolerance's
    ``on_fault`` (v1/fault_tolerance/engine_core_sentinel.py:89-90)."""
    v = core.v
    sched = core.sched
    held = [(rid, core.inc_of(req)) for rid, req in sched.requests.items()
            if not req.is_finished()]
    aborted = core.call(sched.finish_requests, None, v.RequestStatus.FINISHED_ABORTED)
    incs = dict(held)
    by_client: dict[int, list[tuple[str, int]]] = {}
    for item in aborted:
        # 0.33 returns the Requests (scheduler.py:2964-2966), 0.20 (ID, client index) pairs
        # (scheduler.py:1763-1776); _send_abort_outputs groups them by client either way
        rid, client = item if isinstance(item, tuple) else (item.request_id, item.client_index)
        inc = incs.get(rid, 0)
        core.world.emit(core.c_sched, rid, inc, SchedFinish("FINISHED_ABORTED", cause, 0))
        by_client.setdefault(client, []).append((rid, inc))
    core.kv.sync(incs)
    for client in sorted(by_client):
        send_finish_outputs(core, by_client[client], client, v.FinishReason.ABORT)


def utility(core: VllmEngineCore, msg: UtilityMessage) -> None:
    """pause_generation (0.33) / pause_scheduler (0.20) and resume_scheduler on the real
    Scheduler, then the call's reply when vLLM's own frontend awaits one.

    0.33 ``pause_scheduler`` (core.py:2181-2223) and 0.20's (core.py:1542-1581): abort mode
    finishes everything, the pause state is set, and the pause completes at once when the
    engine has no work, else from an idle-state callback; completing it clears the caches when
    asked (``_finish_pause``, 0.33 core.py:948-953; 0.20 :1560-1577) and then replies. Only
    0.33's ``pause_generation`` rejects new requests in "abort" mode (core.py:2225-2233); 0.20
    queues them. A ``reset_prefix_cache`` call (``[engine] reset_prefix_cache_at``) is applied
    where the busy loop finds it, between two steps, a batch possibly in flight, and answered
    with its result."""
    v = core.v
    sched = core.sched
    core.world.emit(core.c_core, None, 0, EngineUtility(msg.method, msg.mode))
    if msg.method == "reset_prefix_cache":
        result = _reset(core, msg.clear_cache, False)
        if (reply := _take_reply(core)) is not None:
            reply(result)  # the call's answer is the reset's result
        return
    if msg.method == "resume_scheduler":
        core.reject_new_requests = False
        sched.set_pause_state(v.PauseState.UNPAUSED)
        reply_when_paused(core, False)
        return
    if msg.mode == "abort":
        abort_all(core, "pause")
    sched.set_pause_state(v.PauseState.PAUSED_ALL if msg.mode == "keep"
                          else v.PauseState.PAUSED_NEW)
    core.reject_new_requests = msg.mode != "keep" and _rejects_while_paused(core)
    reply_when_paused(core, True, bool(msg.clear_cache))


def _rejects_while_paused(core: Any) -> bool:
    """Whether the release's EngineCoreProc rejects an ADD while paused in "abort"/"wait"
    mode (0.33 ``_reject_add_while_paused``, core.py:1796-1813; 0.20.0 has no such check)."""
    from vllm.v1.engine.core import EngineCoreProc

    return hasattr(EngineCoreProc, "_reject_add_while_paused")


def clear_caches(core: Any) -> None:
    """``_reset_caches``: ``reset_prefix_cache(reset_running_requests=True)`` on the real
    Scheduler, which preempts the running requests, last first (0.33 scheduler.py:3194-3210,
    0.20 :1881-1902), then empties the prefix cache. 0.33 also resets the KV connector's cache
    and raises when a reset fails (core.py:930-946); 0.20 resets the prefix cache only
    (core.py:629-632)."""
    if hasattr(core.stepper.facade, "_finish_pause"):  # 0.33: _reset_caches(True, True)
        if not _reset(core, True, True):
            # core.py:940-945: the engine dies of it (only a connector answering False to
            # reset_cache gets here; racesim's answer None, the base class's)
            raise core._fatal("RuntimeError: Failed to reset the KV connector cache.")
    else:
        _reset(core, True, None)


def _reset(core: Any, running_too: bool, connector: bool | None) -> Any:
    """The real Scheduler's ``reset_prefix_cache`` (what ``EngineCore.reset_prefix_cache``
    calls, 0.33 core.py:883-888, 0.20 :602-607; ``connector`` None: not passed), its freed
    blocks synced and its preemptions traced."""
    sched = core.sched
    running = list(sched.running) if running_too else []
    incs = {req.request_id: core.inc_of(req) for req in running}
    args = (running_too,) if connector is None else (running_too, connector)
    result = core.call(sched.reset_prefix_cache, *args)
    if not hasattr(sched, "reset_preempted_req_ids"):
        # 0.20's next schedule() lists only its own preemptions (scheduler.py:931); 0.33's
        # lists these too (reset_preempted_req_ids, scheduler.py:1733, 1843), and the engine's
        # _synced_schedule records them from that list, as it does every preemption
        for req in reversed(running):
            core.world.emit(core.c_sched, req.request_id, incs[req.request_id],
                            SchedPreempt(None))
    core.kv.sync(incs)
    return result


def _take_reply(core: Any) -> Any:
    """The reply of the oldest utility call vLLM's frontend awaits, queued by
    engine_side.to_shell for its calls only (the model's frontend awaits none), or None."""
    calls = core.__dict__.get("utility_replies")
    return calls.popleft() if calls else None


def reply_when_paused(core: Any, pausing: bool, clear_cache: bool = False) -> None:
    """The UTILITY reply vLLM's frontend awaits (``call_utility_async``). A pause completes at
    once when the engine has no work left, else once it is idle: ``pause_scheduler`` returns a
    Future completed by an idle-state callback (core.py:2208-2223, 2239-2244); completing it
    clears the caches first when asked (``_finish_pause``). Its abort outputs were sent first,
    on the same pipe."""
    reply = _take_reply(core)
    if not pausing:
        if reply is not None:
            reply()
        return
    if reply is None and not clear_cache:
        return

    def finish_pause() -> None:
        if clear_cache:
            clear_caches(core)
        if reply is not None:
            reply()

    when_idle(core, finish_pause)


def when_idle(core: Any, fn: Any) -> None:
    """Run ``fn`` now if the engine has no work, else from vLLM's busy loop once it has none
    (``pause_scheduler``'s idle-state callback, 0.33.0 core.py:2208-2223, 2239-2244, with vLLM's
    own ``has_work()``; ``_notify_idle_state_callbacks`` passes the engine, :1698-1701)."""
    facade = core.stepper.facade
    busy = facade.has_work() if hasattr(type(facade), "has_work") else core._has_work()
    if busy:
        core.idle_callbacks.append(lambda _engine: fn())
    else:
        fn()
