"""Trace event kinds of P/D disaggregation's KV connector (``pd.*`` on the engines)."""

from __future__ import annotations

from racesim.sim.trace import EventRecord, TraceEvent

__all__ = ["PdHold", "PdRelease", "PdRead", "PdReadFailed", "PdLoadFailed", "PdNotice",
           "PdNoticeUnknown", "PdHeartbeat", "PdRecvStart", "PdPushRegister", "PdPushWrite",
           "PdPushFailed", "PdPushNotPosted", "PdHoldLost", "PdPull"]


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


class PdPushRegister(EventRecord):
    """pd.push_register: NIXL push mode, the decode side registers ``blocks`` of its request
    with prefill engine ``remote_engine`` (a PUSH_REG notification keyed by D's own ID)."""

    KIND = "pd.push_register"
    KEY = True
    __slots__ = ("remote_engine", "blocks")

    def __init__(self, remote_engine: int, blocks: list[int]) -> None:
        self.remote_engine = remote_engine
        self.blocks = blocks

    def describe(self, ev: TraceEvent) -> str:
        return f"registers {ev.request!r}'s blocks {self.blocks} for a push"


class PdPushWrite(EventRecord):
    """pd.push_write: NIXL push mode (or MooncakeConnector, ``matched`` "transfer_id"), the
    prefill side has written its request's ``blocks``
    into ``dest_blocks`` of decode request ``dest_request`` (incarnation ``dest_inc`` there, by
    its ground truth); ``matched`` says how the pairing was found: "exact" or "base" (the IDs
    equal once the random suffix is stripped)."""

    KIND = "pd.push_write"
    KEY = True
    __slots__ = ("blocks", "dest_engine", "dest_request", "dest_blocks", "dest_inc", "matched")

    def __init__(self, blocks: list[int], dest_engine: int, dest_request: str,
                 dest_blocks: list[int], dest_inc: int, matched: str) -> None:
        self.blocks = blocks
        self.dest_engine = dest_engine
        self.dest_request = dest_request
        self.dest_blocks = dest_blocks
        self.dest_inc = dest_inc
        self.matched = matched

    def describe(self, ev: TraceEvent) -> str:
        return (f"writes {ev.request!r}'s blocks {self.blocks} into {self.dest_request!r}'s "
                f"blocks {self.dest_blocks} ({self.matched} match)")


class PdPushFailed(EventRecord):
    """pd.push_failed: NIXL push mode, the pairing of the prefill side's request with decode
    request ``dest_request`` could not be written: D registered more blocks (``dest_blocks``)
    than P holds (``blocks``), an assert the writer thread logs and swallows; nothing is
    written and neither side hears of it."""

    KIND = "pd.push_failed"
    KEY = True
    __slots__ = ("blocks", "dest_request", "dest_blocks", "dest_inc")

    def __init__(self, blocks: int, dest_request: str, dest_blocks: int, dest_inc: int) -> None:
        self.blocks = blocks
        self.dest_request = dest_request
        self.dest_blocks = dest_blocks
        self.dest_inc = dest_inc

    def describe(self, ev: TraceEvent) -> str:
        return (f"cannot write {ev.request!r} ({self.blocks} blocks) into {self.dest_request!r}"
                f" ({self.dest_blocks} blocks): the writer logs the assert and goes on")


class PdPushNotPosted(EventRecord):
    """pd.push_not_posted: NIXL push mode, the prefill side could not post its WRITE into
    decode request ``dest_request``'s blocks (a scripted transport fault: ``kv_load_fails``
    on the decode request). vLLM 0.33 logs ``transfer_setup_failed`` and records the request
    in ``_send_failures`` (nixl/push_worker.py:732-765); no notification reaches D."""

    KIND = "pd.push_not_posted"
    KEY = True
    __slots__ = ("dest_request", "dest_inc")

    def __init__(self, dest_request: str, dest_inc: int) -> None:
        self.dest_request = dest_request
        self.dest_inc = dest_inc

    def describe(self, ev: TraceEvent) -> str:
        return (f"cannot post the WRITE of {ev.request!r} into {self.dest_request!r}: P logs "
                f"it, D is never notified")


class PdHoldLost(EventRecord):
    """pd.hold_lost: MooncakeConnector, the prefill side's sender loop raised (``error``) before
    it recorded this finished request under ``transfer_id``: its blocks stay held with no
    expiry, and no transfer will ever name it (vLLM 0.33 mooncake_connector.py:2690-2729)."""

    KIND = "pd.hold_lost"
    KEY = True
    __slots__ = ("transfer_id", "error")

    def __init__(self, transfer_id: str, error: str) -> None:
        self.transfer_id = transfer_id
        self.error = error

    def describe(self, ev: TraceEvent) -> str:
        return (f"loses {ev.request!r}'s hold under {self.transfer_id!r} ({self.error}): its "
                f"blocks are never freed")


class PdPull(EventRecord):
    """pd.pull: MooncakeConnector, the decode side asks prefill engine ``remote_engine`` for
    ``transfer_id``'s KV, to be written into its request's ``blocks``."""

    KIND = "pd.pull"
    KEY = True
    __slots__ = ("remote_engine", "transfer_id", "blocks")

    def __init__(self, remote_engine: int, transfer_id: str, blocks: list[int]) -> None:
        self.remote_engine = remote_engine
        self.transfer_id = transfer_id
        self.blocks = blocks

    def describe(self, ev: TraceEvent) -> str:
        return f"asks for {self.transfer_id!r}'s KV into {ev.request!r}'s blocks {self.blocks}"
