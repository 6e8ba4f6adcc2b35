"""Streaming-input sessions (vLLM PR #28973) on vLLM's own Scheduler, with the model's events.

vLLM's ``Scheduler`` does all of it: ``add_request`` of an ID it holds queues a session's next
chunk (or its end) while a chunk runs, resumes a session waiting for input, ends it on the
final non-resumable add, and asserts "duplicate request id" for any other held ID
(v1/core/sched/scheduler.py:2931-2947); ``update_from_output`` keeps a stopped session
(``_handle_stopped_request``, :2717-2742, ``_update_request_as_session``, :1879-1918). The
engine calls it as for any ADD; this module records what the model's sessions record
(``sched.session``, and ``sched.finish`` / ``kv.free`` when the add ended the session), read
off the real ``Request``, whose incarnation stays the session's first add's.
"""

from __future__ import annotations

from typing import Any, Protocol

from racesim.engine_model.events.engine import SchedDuplicate, SchedFinish, SchedSession

__all__ = ["add_held", "session_outputs", "chunk_stopped"]


class _Core(Protocol):
    """What this module needs of ``VllmEngineCore``."""

    v: Any
    sched: Any
    world: Any
    kv: Any
    c_sched: str

    def inc_of(self, req: Any) -> int: ...

    def call(self, fn: Any, *args: Any) -> Any: ...


def add_held(core: _Core, held: Any, req: Any, add: Any) -> None:
    """``Scheduler.add_request`` of an ID the scheduler holds (scheduler.py:2931-2945): a
    streaming update of a session, or, for any other request, the "duplicate request id"
    assert (:2935-2936), which kills the engine. ``add`` is the real ``add_request``."""
    rid = held.request_id
    inc = core.inc_of(held)
    waiting = held.status == core.v.RequestStatus.WAITING_FOR_STREAMING_REQ
    emit = core.world.emit
    if not waiting and held.streaming_queue is None:
        emit(core.c_sched, rid, core.inc_of(req), SchedDuplicate(inc))
    core.call(add, req)
    if not waiting:
        emit(core.c_sched, rid, inc, SchedSession("queue" if req.resumable else "queue-end"))
    elif req.resumable:
        emit(core.c_sched, rid, inc, SchedSession("resume", held.num_prompt_tokens))
    else:
        # the final add of a session waiting for input: finish_requests(FINISHED_ABORTED)
        emit(core.c_sched, rid, inc, SchedSession("end"))
        emit(core.c_sched, rid, inc, SchedFinish("FINISHED_ABORTED", "session-end"))
        core.kv.sync({rid: inc})


def session_outputs(objects: dict[str, Any], outs: Any) -> dict[str, Any]:
    """The step's ``EngineCoreOutput`` of each session it ran, by ID (empty when it ran none).
    A session that resumed inside ``update_from_output`` has cleared its output token list, so
    its new tokens are read from its output instead."""
    if not any(r is not None and r.streaming_queue is not None for r in objects.values()):
        return {}
    found = {}
    for client in sorted(outs or {}):
        for o in outs[client].outputs:
            req = objects.get(o.request_id)
            if req is not None and req.streaming_queue is not None:
                found[o.request_id] = o
    return found


def chunk_stopped(core: _Core, req: Any, inc: int) -> None:
    """A session's chunk stopped and the session went on: it waits for input, or resumed with
    a chunk queued while this one ran (``_handle_stopped_request``)."""
    if req.status == core.v.RequestStatus.WAITING_FOR_STREAMING_REQ:
        core.world.emit(core.c_sched, req.request_id, inc, SchedSession("wait"))
    else:
        core.world.emit(core.c_sched, req.request_id, inc,
                        SchedSession("resume", req.num_prompt_tokens))
