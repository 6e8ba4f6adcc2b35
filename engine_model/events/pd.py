"""Trace event kinds of P/D disaggregation's KV connector (``pd.*`` on the engines)."""

from __future__ import annotations

from racesim.sim.trace import EventRecord, TraceEvent

__all__ = ["PdHold", "PdRelease", "PdRead", "PdReadFailed", "PdLoadFailed", "PdNotice",
           "PdNoticeUnknown", "PdHeartbeat", "PdRecvStart"]


class PdHold(EventRecord):
    """pd.hold: the prefill side holds a finished request's blocks until ``expiry``."""

    KIND = "pd.hold"
    KEY = True
    __slots__ = ("blocks", "expiry")

    def __init__(self, blocks: list[int], expiry: float | int) -> None:
        self.blocks = blocks
        self.expiry = expiry

    def describe(self, ev: TraceEvent) -> str:
        return f"holds {ev.request!r}'s blocks {self.blocks} for the decode side"


class PdRelease(EventRecord):
    """pd.release: held blocks go (``cause``: notify, or the hold's expiry)."""

    KIND = "pd.release"
    KEY = True
    __slots__ = ("cause", "status")

    def __init__(self, cause: str, status: str) -> None:
        self.cause = cause
        self.status = status

    def describe(self, ev: TraceEvent) -> str:
        return f"releases {ev.request!r} ({self.cause})"


class PdRead(EventRecord):
    """pd.read: the decode side reads ``remote_blocks`` of prefill engine ``remote_engine``
    (the blocks of incarnation ``remote_inc`` there, by its ground truth)."""

    KIND = "pd.read"
    KEY = True
    __slots__ = ("remote_engine", "remote_request", "remote_blocks", "remote_inc")

    def __init__(self, remote_engine: int, remote_request: str, remote_blocks: list[int],
                 remote_inc: int) -> None:
        self.remote_engine = remote_engine
        self.remote_request = remote_request
        self.remote_blocks = remote_blocks
        self.remote_inc = remote_inc

    def describe(self, ev: TraceEvent) -> str:
        return f"reads blocks {self.remote_blocks} of {self.remote_request!r}"


class PdReadFailed(EventRecord):
    """pd.read_failed: the decode side's read of ``remote_request``'s blocks ends without them
    (failed_recving)."""

    KIND = "pd.read_failed"
    __slots__ = ("remote_request",)

    def __init__(self, remote_request: str) -> None:
        self.remote_request = remote_request


class PdLoadFailed(EventRecord):
    """pd.load_failed: the engine handles a failed KV load by ``policy`` (fail: an ERROR
    output; recompute: prefill the whole prompt locally)."""

    KIND = "pd.load_failed"
    __slots__ = ("policy",)

    def __init__(self, policy: str) -> None:
        self.policy = policy


class PdNotice(EventRecord):
    """pd.notice: a transfer-done notice arrives for a held request."""

    KIND = "pd.notice"
    KEY = True
    __slots__ = ()

    def describe(self, ev: TraceEvent) -> str:
        return f"transfer-done notice for {ev.request!r}"


class PdNoticeUnknown(EventRecord):
    """pd.notice_unknown: a transfer-done notice for an ID the prefill side does not hold."""

    KIND = "pd.notice_unknown"
    __slots__ = ()

    def describe(self, ev: TraceEvent) -> str:
        return (f"ignores a transfer-done notice for unknown {ev.request!r} "
                f"(its blocks may be freed already)")


class PdHeartbeat(EventRecord):
    """pd.heartbeat: the decode side extends the lease on held requests ``ids``."""

    KIND = "pd.heartbeat"
    __slots__ = ("ids",)

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids


class PdRecvStart(EventRecord):
    """pd.recv_start: the decode side starts waiting for a request's remote KV."""

    KIND = "pd.recv_start"
    __slots__ = ()

    def describe(self, ev: TraceEvent) -> str:
        return f"waits for remote KV of {ev.request!r}"
