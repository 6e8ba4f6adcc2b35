"""Streaming-input sessions in the scheduler (vLLM PR #28973, 0.33 v1/core/sched/scheduler.py).

A session is one engine request whose ID is re-used on purpose: each input chunk arrives as an
ADD with ``resumable=True`` and the same internal ID, and the final ADD (not resumable) ends it.
When a chunk stops (EOS or its max_tokens) the request does not finish: it waits for the next
chunk (WAITING_FOR_STREAMING_REQ), or takes one already queued, keeping its blocks and all but
the last sampled token as prompt (``_handle_stopped_request`` :2717-2742,
``_update_request_as_session`` :1879-1918). A non-resumable ADD for any other live ID still
fails the "duplicate request id" assert (:2931-2936).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from racesim.engine_model.events.engine import SchedSession
from racesim.engine_model.request import Request, RequestStatus
from racesim.sim.world import World

__all__ = ["add_to_session", "chunk_stopped", "kv_holding_end", "open_session"]


class Scheduler(Protocol):
    """What a session needs of the scheduler (a Protocol: the scheduler imports this module)."""

    @property
    def world(self) -> World: ...

    @property
    def component(self) -> str: ...

    @property
    def waiting(self) -> deque[Request]: ...

    num_waiting_for_streaming_input: int

    def finish_requests(self, request_ids: tuple[str, ...] | list[str], status: str, cause: str,
                        tag: int = 0) -> list[Request]: ...


def open_session(request: Request) -> None:
    """A new resumable request starts a session (scheduler.py:2946-2947)."""
    if request.resumable:
        request.streaming_queue = deque()


def add_to_session(sched: Scheduler, session: Request, update: Request) -> bool:
    """Scheduler.add_request for an ID already held (scheduler.py:2931-2945): False when the
    held request is no session, which is the caller's "duplicate request id" assert."""
    rid = session.request_id
    if session.status != RequestStatus.WAITING_FOR_STREAMING_REQ:
        if session.streaming_queue is None:
            return False
        session.streaming_queue.append(update if update.resumable else None)
        sched.world.emit(sched.component, rid, session.inc,
                         SchedSession("queue" if update.resumable else "queue-end"))
    elif update.resumable:
        sched.num_waiting_for_streaming_input -= 1
        _resume(sched, session, update)
        _enqueue(sched, session)
    else:
        sched.world.emit(sched.component, rid, session.inc, SchedSession("end"))
        sched.finish_requests([rid], RequestStatus.FINISHED_ABORTED, "session-end")
    return True


def chunk_stopped(sched: Scheduler, req: Request) -> bool:
    """A session's chunk stopped (its status is already a finished one): True when the
    session goes on, so the request stays (``_handle_stopped_request``)."""
    queue = req.streaming_queue
    if queue is None:
        return False
    # Drop the chunk's work still in flight and resume from the computed frontier. The in
    # flight count is the ID's, so a step of an earlier request under this ID counts too.
    req.num_computed_tokens -= req.num_output_placeholders
    req.num_stale_output_tokens = req.num_in_flight_tokens
    req.drop_stale_output = True
    req.num_output_placeholders = 0
    if queue:
        update = queue.popleft()
        if update is None:
            return False  # the session's final add came while this chunk ran
        _resume(sched, req, update)
        _enqueue(sched, req)
    else:
        req.status = RequestStatus.WAITING_FOR_STREAMING_REQ
        sched.num_waiting_for_streaming_input += 1
        sched.world.emit(sched.component, req.request_id, req.inc, SchedSession("wait"))
    return True


def _resume(sched: Scheduler, session: Request, update: Request) -> None:
    """_update_request_as_session: every output token but the last sampled one joins the
    prompt, then the new chunk; the chunk's own limits apply from here."""
    kept = max(len(session.output) - 1, 0)
    session.prompt_tokens += kept + update.prompt_tokens
    session.output = []
    session.max_tokens = update.max_tokens
    session.eos_at = update.eos_at
    session.status = RequestStatus.WAITING
    sched.world.emit(sched.component, session.request_id, session.inc,
                     SchedSession("resume", session.prompt_tokens))


def kv_holding_end(waiting: deque[Request]) -> int:
    """Where ``waiting`` stops holding KV blocks: the model's one deque keeps vLLM's
    ``kv_holding_waiting`` (resumed sessions, remote KV loads) ahead of ``waiting``, as the
    scheduler drains it first (scheduler.py:1062-1067, ``_holds_kv_blocks`` :2697-2715)."""
    i = 0
    for r in waiting:
        if r.num_computed_tokens <= 0 and r.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
            break
        i += 1
    return i


def _enqueue(sched: Scheduler, session: Request) -> None:
    """A resumed session keeps its blocks: it waits behind the other waiting requests that
    hold blocks, ahead of those that hold none (``_enqueue_waiting_request``)."""
    sched.waiting.insert(kv_holding_end(sched.waiting), session)
