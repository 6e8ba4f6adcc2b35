"""Trace event kinds of the engine core and its sockets: ``ipc.send``, ``sched.*``, ``kv.*``,
``runner.sample`` and ``engine.*``."""

from __future__ import annotations

from typing import Any

from racesim.sim.trace import EventRecord, TraceEvent

__all__ = ["EngineFault", "EngineResume", "IpcDropped", "MESSAGE_NAMES", "IpcSend", "SchedAdd",
           "SchedDuplicate", "SchedAbortMiss",
           "SchedFinish", "SchedPreempt", "SchedSession", "SchedStep", "SchedUpdate",
           "RunnerSample", "KvAlloc", "KvFree", "KvHitAssert", "EngineFatalEvent",
           "EngineReject", "EngineUtility"]

#: Message types by their vLLM names (the ``type`` of an ipc.send event).
MESSAGE_NAMES = {"EngineCoreRequest": "ADD", "AbortMessage": "ABORT",
                 "EngineCoreOutputs": "outputs", "KVDoneNotice": "KV done",
                 "KVPullRequest": "KV pull", "KVPullResult": "KV pulled",
                 "EngineDead": "ENGINE DEAD", "UtilityMessage": "UTILITY"}


class IpcSend(EventRecord):
    """ipc.send: a message goes on a socket (``msg`` names it, ``type`` is its class, ``arrive``
    its arrival time). What else is known depends on the message: the engine it goes ``to``
    and the ``incs`` of an ADD, the ``tag`` of an ABORT, the ``outputs`` of EngineCoreOutputs
    (``[id, inc, tokens, finish]`` each) and, under data parallelism, the IDs it reports
    ``finished``, the ``remote_inc`` of a KV-done notice, whether a streaming-input ADD is
    ``resumable``."""

    KIND = "ipc.send"
    KEY = True
    OPTIONAL = frozenset({"to", "incs", "tag", "outputs", "remote_inc", "finished", "resumable"})
    __slots__ = ("msg", "type", "ids", "arrive", "to", "incs", "tag", "outputs", "remote_inc",
                 "finished", "resumable")

    def __init__(self, msg: str, type: str, ids: list[str], arrive: float | int,
                 to: int | None = None, incs: list[int] | None = None, tag: int | None = None,
                 outputs: list[list[Any]] | None = None, remote_inc: int | None = None,
                 finished: list[str] | None = None, resumable: bool | None = None) -> None:
        self.msg = msg
        self.type = type
        self.ids = ids
        self.arrive = arrive
        self.to = to
        self.incs = incs
        self.tag = tag
        self.outputs = outputs
        self.remote_inc = remote_inc
        self.finished = finished
        self.resumable = resumable

    def describe(self, ev: TraceEvent) -> str:
        ids = ", ".join(repr(i) for i in self.ids)
        return f"{MESSAGE_NAMES.get(self.type, self.type)} {ids} (arrives t={self.arrive:.4f})"


class SchedAdd(EventRecord):
    """sched.add: Scheduler.add_request (``prev``: the incarnation it overwrote, 0 if none)."""

    KIND = "sched.add"
    KEY = True
    __slots__ = ("prev",)

    def __init__(self, prev: int) -> None:
        self.prev = prev

    def describe(self, ev: TraceEvent) -> str:
        over = f" OVERWRITES requests[{ev.request!r}] (inc {self.prev})" if self.prev else ""
        return f"Scheduler.add_request({ev.request!r}){over}"


class SchedDuplicate(EventRecord):
    """sched.duplicate: add_request's duplicate-ID assertion fails (the engine dies)."""

    KIND = "sched.duplicate"
    __slots__ = ("prev",)

    def __init__(self, prev: int) -> None:
        self.prev = prev


class SchedAbortMiss(EventRecord):
    """sched.abort_miss: an ABORT (``abort``: its tag) finds no live request under the ID."""

    KIND = "sched.abort_miss"
    KEY = True
    __slots__ = ("cause", "abort")

    def __init__(self, cause: str, abort: int) -> None:
        self.cause = cause
        self.abort = abort

    def describe(self, ev: TraceEvent) -> str:
        return f"ABORT {ev.request!r}: no live request (ignored)"


class SchedFinish(EventRecord):
    """sched.finish: the scheduler finishes a request (``abort``: the ABORT's tag, present
    when finish_requests ended it)."""

    KIND = "sched.finish"
    KEY = True
    OPTIONAL = frozenset({"abort"})
    __slots__ = ("status", "cause", "abort")

    def __init__(self, status: str, cause: str | None, abort: int | None = None) -> None:
        self.status = status
        self.cause = cause
        self.abort = abort

    def describe(self, ev: TraceEvent) -> str:
        return f"finishes {ev.request!r} (inc {ev.inc}): {self.status}"


class SchedPreempt(EventRecord):
    """sched.preempt: a running request is preempted (its blocks freed, back to waiting;
    ``stale``, present only when nonzero, counts its tokens still in flight)."""

    KIND = "sched.preempt"
    KEY = True
    OPTIONAL = frozenset({"stale"})
    __slots__ = ("stale",)

    def __init__(self, stale: int | None = None) -> None:
        self.stale = stale

    def describe(self, ev: TraceEvent) -> str:
        stale = f" ({self.stale} token(s) still in flight go stale)" if self.stale else ""
        return f"preempts {ev.request!r}{stale}"


class SchedSession(EventRecord):
    """sched.session: a streaming-input session's step (``action``: queue, queue-end, end,
    wait, resume; ``prompt_tokens``, present only on resume, is the grown prompt)."""

    KIND = "sched.session"
    OPTIONAL = frozenset({"prompt_tokens"})
    __slots__ = ("action", "prompt_tokens")

    def __init__(self, action: str, prompt_tokens: int | None = None) -> None:
        self.action = action
        self.prompt_tokens = prompt_tokens


class SchedStep(EventRecord):
    """sched.step: one schedule() call; ``batch`` holds ``[id, inc, tokens]`` per scheduled
    request, ``finished`` the finished_req_ids it hands the runner."""

    KIND = "sched.step"
    __slots__ = ("step", "batch", "finished")

    def __init__(self, step: int, batch: list[list[Any]], finished: list[str]) -> None:
        self.step = step
        self.batch = batch
        self.finished = finished

    def describe(self, ev: TraceEvent) -> str:
        batch = ", ".join(f"{r}({n})" for r, _i, n in self.batch) or "nothing"
        done = f"; finished_req_ids={self.finished}" if self.finished else ""
        return f"step {self.step}: schedules {batch}{done}"


class SchedUpdate(EventRecord):
    """sched.update: update_from_output for a step; ``applied`` holds ``[id, inc, token inc,
    token ctx]`` per token taken."""

    KIND = "sched.update"
    __slots__ = ("step", "applied")

    def __init__(self, step: int, applied: list[list[Any]]) -> None:
        self.step = step
        self.applied = applied

    def describe(self, ev: TraceEvent) -> str:
        return f"update_from_output(step {self.step}): {len(self.applied)} token(s) applied"


class RunnerSample(EventRecord):
    """runner.sample: the model runner samples a step's tokens (``[id, inc, ctx, eos]`` each)."""

    KIND = "runner.sample"
    __slots__ = ("step", "sampled")

    def __init__(self, step: int, sampled: list[list[Any]]) -> None:
        self.step = step
        self.sampled = sampled

    def describe(self, ev: TraceEvent) -> str:
        return f"step {self.step} samples {len(self.sampled)} token(s)"


class KvAlloc(EventRecord):
    """kv.alloc: ``blocks`` join req_to_blocks[id], whose whole list is then ``table``
    (``hit``, present only on a prefix-cache hit, holds the cached blocks it shares)."""

    KIND = "kv.alloc"
    OPTIONAL = frozenset({"hit"})
    __slots__ = ("blocks", "table", "hit")

    def __init__(self, blocks: list[int], table: list[int], hit: list[int] | None = None) -> None:
        self.blocks = blocks
        self.table = table
        self.hit = hit

    def describe(self, ev: TraceEvent) -> str:
        hit = f"prefix hit on blocks {self.hit}, " if self.hit else ""
        return f"{hit}allocates blocks {self.blocks} to req_to_blocks[{ev.request!r}]"


class KvFree(EventRecord):
    """kv.free: req_to_blocks[id] returns to the free queue (``owners``: each block's owner;
    ``kept``, present only when some stay shared, the blocks other requests still hold)."""

    KIND = "kv.free"
    KEY = True
    OPTIONAL = frozenset({"kept"})
    __slots__ = ("blocks", "owners", "kept")

    def __init__(self, blocks: list[int], owners: list[int],
                 kept: list[int] | None = None) -> None:
        self.blocks = blocks
        self.owners = owners
        self.kept = kept

    def describe(self, ev: TraceEvent) -> str:
        kept = f" (blocks {self.kept} stay shared)" if self.kept else ""
        return f"frees req_to_blocks[{ev.request!r}] = {self.blocks}{kept}"


class KvHitAssert(EventRecord):
    """kv.hit_assert: a prefix hit for an ID that already has a block table (vLLM asserts)."""

    KIND = "kv.hit_assert"
    KEY = True
    __slots__ = ("blocks",)

    def __init__(self, blocks: list[int]) -> None:
        self.blocks = blocks

    def describe(self, ev: TraceEvent) -> str:
        return f"prefix hit on blocks {self.blocks} for {ev.request!r}, " \
               f"which already has a block table: assert"


class EngineFatalEvent(EventRecord):
    """engine.fatal: the engine core dies (EngineDeadError for every request on it). ``where``
    is vLLM's ``file:line`` (relative to the vllm package) when vLLM's own code raised."""

    KIND = "engine.fatal"
    KEY = True
    OPTIONAL = frozenset({"where"})
    __slots__ = ("error", "where")

    def __init__(self, error: str, where: str | None = None) -> None:
        self.error = error
        self.where = where

    def describe(self, ev: TraceEvent) -> str:
        at = f" (raised at vllm/{self.where})" if self.where else ""
        return f"ENGINE DEAD: {self.error}{at}"


class EngineReject(EventRecord):
    """engine.reject: the engine answers an ADD with an ERROR output and never schedules it."""

    KIND = "engine.reject"
    KEY = True
    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why

    def describe(self, ev: TraceEvent) -> str:
        return f"answers {ev.request!r} with an ERROR output ({self.why})"


class EngineUtility(EventRecord):
    """engine.utility: the engine runs a UTILITY call (pause_generation, resume_scheduler)."""

    KIND = "engine.utility"
    KEY = True
    __slots__ = ("method", "mode")

    def __init__(self, method: str, mode: str) -> None:
        self.method = method
        self.mode = mode

    def describe(self, ev: TraceEvent) -> str:
        return f"{self.method}({self.mode!r})"


class EngineFault(EventRecord):
    """engine.fault: with ``enable_fault_tolerance`` the busy loop's exception is caught: every
    request is aborted, and the engine waits for a retry instruction (``retry_after`` seconds
    from now; None: none comes, and the engine dies when its recovery timeout ends)."""

    KIND = "engine.fault"
    KEY = True
    OPTIONAL = frozenset({"retry_after"})
    __slots__ = ("error", "retry_after")

    def __init__(self, error: str, retry_after: float | None) -> None:
        self.error = error
        self.retry_after = retry_after

    def describe(self, ev: TraceEvent) -> str:
        then = ("no retry comes" if self.retry_after is None
                else f"retry in {self.retry_after:g}s")
        return f"FAULT (fault tolerance on): {self.error}; every request aborted, {then}"


class EngineResume(EventRecord):
    """engine.resume: the retry instruction arrived; the batches still in flight (``dropped``,
    by step) are discarded and the busy loop resumes with what its queues hold."""

    KIND = "engine.resume"
    KEY = True
    __slots__ = ("dropped",)

    def __init__(self, dropped: list[int]) -> None:
        self.dropped = dropped

    def describe(self, ev: TraceEvent) -> str:
        return f"resumes (HEALTHY); {len(self.dropped)} batch(es) in flight discarded"


class IpcDropped(EventRecord):
    """ipc.dropped: a message sent to an engine that is not connected (starting, restarting)
    is dropped by the sender's ROUTER socket, which has no ROUTER_MANDATORY (vLLM 0.33
    utils/network_utils.py:355-380): no error, nothing arrives."""

    KIND = "ipc.dropped"
    KEY = True
    __slots__ = ("msg", "type", "ids")

    def __init__(self, msg: str, type: str, ids: list[str]) -> None:
        self.msg = msg
        self.type = type
        self.ids = ids

    def describe(self, ev: TraceEvent) -> str:
        return f"{self.type} for {self.ids!r} dropped: the engine is not connected"
