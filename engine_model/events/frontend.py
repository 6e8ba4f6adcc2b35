"""Trace event kinds of the frontend: AsyncLLM and its OutputProcessor (``fe.*``)."""

from __future__ import annotations

from racesim.sim.trace import EventRecord, TraceEvent

__all__ = ["FeAdd", "FeReject", "FeAbortNoop", "FeAbortIssue", "FeError", "FeDrop", "FeStats",
           "FeOutput", "FePop"]


def _ids(ids: list[str]) -> str:
    return ", ".join(repr(i) for i in ids)


class FeAdd(EventRecord):
    """fe.add: OutputProcessor registers a request state (``tracked`` is False, and only then
    present, for an ADD sent whose state the frontend never keeps)."""

    KIND = "fe.add"
    KEY = True
    OPTIONAL = frozenset({"tracked"})
    __slots__ = ("uid", "external", "index", "tracked")

    def __init__(self, uid: int, external: str, index: int, tracked: bool | None = None) -> None:
        self.uid = uid
        self.external = external
        self.index = index
        self.tracked = tracked

    def describe(self, ev: TraceEvent) -> str:
        return f"OutputProcessor registers request_states[{ev.request!r}]"


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
    """fe.abort_issue: the frontend decides to abort ``ids`` (``cause``: abort, stop-string)."""

    KIND = "fe.abort_issue"
    KEY = True
    __slots__ = ("ids", "cause")

    def __init__(self, ids: list[str], cause: str) -> None:
        self.ids = ids
        self.cause = cause

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
