"""The engine-side Request object (vllm/v1/request.py), keyed everywhere by its ID string."""

from __future__ import annotations

from collections import deque
from typing import ClassVar, Final

from racesim.engine_model.messages import EngineCoreRequest, KVTransferParams, Token

__all__ = ["Request", "RequestStatus"]


class RequestStatus:
    """vLLM's RequestStatus values, and the finish reason each finished one reports."""

    WAITING: Final = "WAITING"
    WAITING_FOR_REMOTE_KVS: Final = "WAITING_FOR_REMOTE_KVS"
    WAITING_FOR_STREAMING_REQ: Final = "WAITING_FOR_STREAMING_REQ"
    RUNNING: Final = "RUNNING"
    PREEMPTED: Final = "PREEMPTED"
    FINISHED_STOPPED: Final = "FINISHED_STOPPED"
    FINISHED_LENGTH_CAPPED: Final = "FINISHED_LENGTH_CAPPED"
    FINISHED_ABORTED: Final = "FINISHED_ABORTED"
    FINISHED_ERROR: Final = "FINISHED_ERROR"

    FINISH_REASON: ClassVar[dict[str, str]] = {
        FINISHED_STOPPED: "stop",
        FINISHED_LENGTH_CAPPED: "length",
        FINISHED_ABORTED: "abort",
        FINISHED_ERROR: "error",
    }


class Request:
    """One engine request. Compared by identity, as vLLM's Request objects are."""

    __slots__ = ("request_id", "inc", "prompt_tokens", "max_tokens", "client_index", "eos_at",
                 "kv_transfer_params", "status", "num_computed_tokens", "output",
                 "num_output_placeholders", "remote_kv_ready", "fault", "resumable",
                 "streaming_queue", "stale_tokens")

    def __init__(self, msg: EngineCoreRequest) -> None:
        self.request_id = msg.request_id
        self.inc = msg.inc
        self.prompt_tokens = msg.prompt_tokens
        self.max_tokens = msg.max_tokens
        self.client_index = msg.client_index
        self.eos_at = msg.eos_at
        self.kv_transfer_params: KVTransferParams | None = msg.kv_transfer_params
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.output: list[Token] = []
        self.num_output_placeholders = 0
        self.remote_kv_ready = False
        self.fault = msg.fault
        self.resumable = msg.resumable
        #: a session's input chunks queued while a chunk runs (None: the session's end; the
        #: attribute is None for a request that is not a session).
        self.streaming_queue: deque[Request | None] | None = None
        #: sampled tokens still in flight from a session's finished chunk, to be dropped.
        self.stale_tokens = 0

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + len(self.output)

    def is_finished(self) -> bool:
        return self.status.startswith("FINISHED")

    @property
    def do_remote_prefill(self) -> bool:
        p = self.kv_transfer_params
        return p is not None and p.do_remote_prefill

    @property
    def do_remote_decode(self) -> bool:
        p = self.kv_transfer_params
        return p is not None and p.do_remote_decode

    def __repr__(self) -> str:
        return f"Request({self.request_id!r}, inc={self.inc}, {self.status})"
