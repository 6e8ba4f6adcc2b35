"""Trace event kinds of the frontend: AsyncLLM and its OutputProcessor (``fe.*``)."""

from __future__ import annotations

from racesim.sim.trace import EventRecord, TraceEvent

__all__ = ["FeAdd", "FeAddCancelled", "FeEncodeError", "FeReject", "FeAbortNoop",
           "FeAbortIssue", "FeError", "FeDrop", "FeStats", "FeOutput", "FePop", "FeUtility"]


def _ids(ids: list[str]) -> str:
    return ", ".join(repr(i) for i in ids)


class FeAdd(EventRecord):
    """fe.add: OutputProcessor registers a request state (``tracked`` is False, and only then
    present, for an ADD sent whose state the frontend never keeps; ``dp_engine``, present only
    under data parallelism, is the engine the load balancer chose)."""

    KIND = "fe.add"
    KEY = True
    OPTIONAL = frozenset({"tracked", "dp_engine"})
    __slots__ = ("uid", "external", "index", "tracked", "dp_engine")

    def __init__(self, uid: int, external: str, index: int, tracked: bool | None = None,
                 dp_engine: int | None = None) -> None:
        self.uid = uid
        self.external = external
        self.index = index
        self.tracked = tracked
        self.dp_engine = dp_engine

    def describe(self, ev: TraceEvent) -> str:
        if self.tracked is False:  # the ID was held: vLLM 0.33 took this add as an update of it
            return (f"OutputProcessor already holds request_states[{ev.request!r}]: this add "
                    f"is taken as its streaming update and never registered")
        return f"OutputProcessor registers request_states[{ev.request!r}]"


class FeEncodeError(EventRecord):
    """fe.encode_error: encoding the ADD raised TypeError (an object msgpack cannot encode,
    VLLM_ALLOW_INSECURE_SERIALIZATION off) after the request was registered; nothing is sent."""

    KIND = "fe.encode_error"
    KEY = True
    __slots__ = ("uid",)

    def __init__(self, uid: int) -> None:
        self.uid = uid

    def describe(self, ev: TraceEvent) -> str:
        return (f"encoding the ADD of {ev.request!r} raises TypeError: not sent, "
                f"generate() fails with no abort")


class FeAddCancelled(EventRecord):
    """fe.add_cancelled: add_request is cancelled before its ADD was sent; request_states keeps
    the state."""

    KIND = "fe.add_cancelled"
    KEY = True
    __slots__ = ("uid",)

    def __init__(self, uid: int) -> None:
        self.uid = uid

    def describe(self, ev: TraceEvent) -> str:
        return f"add_request({ev.request!r}) cancelled before its ADD was sent; " \
               f"request_states keeps it"


class FeReject(EventRecord):
    """fe.reject: AsyncLLM refuses a request (``external`` names the client's ID when the
    rejected one is internal)."""

    KIND = "fe.reject"
    KEY = True
    OPTIONAL = frozenset({"external"})
    __slots__ = ("uid", "reason", "external")

    def __init__(self, uid: int, reason: str, external: str | None = None) -> None:
        self.uid = uid
        self.reason = reason
        self.external = external

    def describe(self, ev: TraceEvent) -> str:
        return f"rejects {ev.request!r}: {self.reason}"


class FeAbortNoop(EventRecord):
    """fe.abort_noop: an abort of an ID the frontend does not know."""

    KIND = "fe.abort_noop"
    __slots__ = ()

    def describe(self, ev: TraceEvent) -> str:
        return f"abort of {ev.request!r}: nothing to abort"


class FeAbortIssue(EventRecord):
    """fe.abort_issue: the frontend decides to abort ``ids`` (``cause``: abort, stop-string;
    ``engines``, present only under data parallelism, is each ID's engine)."""

    KIND = "fe.abort_issue"
    KEY = True
    OPTIONAL = frozenset({"engines"})
    __slots__ = ("ids", "cause", "engines")

    def __init__(self, ids: list[str], cause: str, engines: list[int] | None = None) -> None:
        self.ids = ids
        self.cause = cause
        self.engines = engines

    def describe(self, ev: TraceEvent) -> str:
        return f"abort of {_ids(self.ids)} decided ({self.cause})"


class FeError(EventRecord):
    """fe.error: a request fails with EngineDeadError (``parent``: its top-level request)."""

    KIND = "fe.error"
    KEY = True
    __slots__ = ("uid", "parent")

    def __init__(self, uid: int, parent: str) -> None:
        self.uid = uid
        self.parent = parent

    def describe(self, ev: TraceEvent) -> str:
        return f"{ev.request!r} fails with EngineDeadError"


class FeDrop(EventRecord):
    """fe.drop: an engine output for an ID with no request state is dropped."""

    KIND = "fe.drop"
    KEY = True
    __slots__ = ("tokens", "finish")

    def __init__(self, tokens: int, finish: str | None) -> None:
        self.tokens = tokens
        self.finish = finish

    def describe(self, ev: TraceEvent) -> str:
        return f"drops output for unknown {ev.request!r}"


class FeStats(EventRecord):
    """fe.stats: a finished request is counted in the finished-request stats."""

    KIND = "fe.stats"
    __slots__ = ("reason", "uid")

    def __init__(self, reason: str, uid: int) -> None:
        self.reason = reason
        self.uid = uid

    def describe(self, ev: TraceEvent) -> str:
        return f"counts {ev.request!r} in finished stats ({self.reason})"


class FeOutput(EventRecord):
    """fe.output: the OutputProcessor routes tokens to a request's collector."""

    KIND = "fe.output"
    __slots__ = ("tokens", "finish")

    def __init__(self, tokens: int, finish: str | None) -> None:
        self.tokens = tokens
        self.finish = finish

    def describe(self, ev: TraceEvent) -> str:
        return (f"routes {self.tokens} token(s) to {ev.request!r}"
                + (f", finished: {self.finish}" if self.finish else ""))


class FePop(EventRecord):
    """fe.pop: a request state is dropped from request_states (``why``)."""

    KIND = "fe.pop"
    KEY = True
    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why

    def describe(self, ev: TraceEvent) -> str:
        return f"drops request_states[{ev.request!r}] ({self.why})"


class FeUtility(EventRecord):
    """fe.utility: the frontend calls ``method`` (pause_generation, resume_scheduler) with
    ``mode`` on every engine."""

    KIND = "fe.utility"
    __slots__ = ("method", "mode")

    def __init__(self, method: str, mode: str) -> None:
        self.method = method
        self.mode = mode

    def describe(self, ev: TraceEvent) -> str:
        return f"calls {self.method}({self.mode!r}) on every engine"
