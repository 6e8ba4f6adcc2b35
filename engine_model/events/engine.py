"""Trace event kinds of the engine core and its sockets: ``ipc.send``, ``sched.*``, ``kv.*``,
``runner.sample`` and ``engine.fatal``."""

from __future__ import annotations

from typing import Any

from racesim.sim.trace import EventRecord, TraceEvent

__all__ = ["MESSAGE_NAMES", "IpcSend", "SchedAdd", "SchedDuplicate", "SchedAbortMiss",
           "SchedFinish", "SchedPreempt", "SchedStep", "SchedUpdate", "RunnerSample", "KvAlloc",
           "KvFree", "EngineFatalEvent"]

#: Message types by their vLLM names (the ``type`` of an ipc.send event).
MESSAGE_NAMES = {"EngineCoreRequest": "ADD", "AbortMessage": "ABORT",
                 "EngineCoreOutputs": "outputs", "KVDoneNotice": "KV done",
                 "EngineDead": "ENGINE DEAD"}


class IpcSend(EventRecord):
    """ipc.send: a message goes on a socket (``msg`` names it, ``type`` is its class, ``arrive``
    its arrival time). What else is known depends on the message: the engine it goes ``to``
    and the ``incs`` of an ADD, the ``tag`` of an ABORT, the ``outputs`` of EngineCoreOutputs
    (``[id, inc, tokens, finish]`` each), the ``remote_inc`` of a KV-done notice."""

    KIND = "ipc.send"
    KEY = True
    OPTIONAL = frozenset({"to", "incs", "tag", "outputs", "remote_inc"})
    __slots__ = ("msg", "type", "ids", "arrive", "to", "incs", "tag", "outputs", "remote_inc")

    def __init__(self, msg: str, type: str, ids: list[str], arrive: float | int,
                 to: int | None = None, incs: list[int] | None = None, tag: int | None = None,
                 outputs: list[list[Any]] | None = None, remote_inc: int | None = None) -> None:
        self.msg = msg
        self.type = type
        self.ids = ids
        self.arrive = arrive
        self.to = to
        self.incs = incs
        self.tag = tag
        self.outputs = outputs
        self.remote_inc = remote_inc

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
    """sched.preempt: a running request is preempted (its blocks freed, back to waiting)."""

    KIND = "sched.preempt"
    KEY = True
    __slots__ = ()

    def describe(self, ev: TraceEvent) -> str:
        return f"preempts {ev.request!r}"


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
    """kv.alloc: ``blocks`` join req_to_blocks[id], whose whole list is then ``table``."""

    KIND = "kv.alloc"
    __slots__ = ("blocks", "table")

    def __init__(self, blocks: list[int], table: list[int]) -> None:
        self.blocks = blocks
        self.table = table

    def describe(self, ev: TraceEvent) -> str:
        return f"allocates blocks {self.blocks} to req_to_blocks[{ev.request!r}]"


class KvFree(EventRecord):
    """kv.free: req_to_blocks[id] returns to the free queue (``owners``: each block's owner)."""

    KIND = "kv.free"
    KEY = True
    __slots__ = ("blocks", "owners")

    def __init__(self, blocks: list[int], owners: list[int]) -> None:
        self.blocks = blocks
        self.owners = owners

    def describe(self, ev: TraceEvent) -> str:
        return f"frees req_to_blocks[{ev.request!r}] = {self.blocks}"


class EngineFatalEvent(EventRecord):
    """engine.fatal: the engine core dies (EngineDeadError for every request on it)."""

    KIND = "engine.fatal"
    KEY = True
    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error

    def describe(self, ev: TraceEvent) -> str:
        return f"ENGINE DEAD: {self.error}"
