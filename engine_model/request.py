"""The engine-side Request object (vllm/v1/request.py), keyed everywhere by its ID string."""

from __future__ import annotations

from collections import deque
from typing import ClassVar, Final

from racesim.engine_model.messages import EngineCoreRequest, KVTransferParams, Token

__all__ = ["Request", "RequestStatus", "BlockHash"]

#: A full block's hash: the text it continues (a prompt name, or a prompt and the output it was
#: extended with) and the block's index. Chaining is implied: equal text, equal earlier blocks.
BlockHash = tuple[str, int]


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
                 "num_output_placeholders", "remote_kv_ready", "prompt",
                 "num_in_flight_tokens", "num_stale_output_tokens", "fault", "resumable",
                 "streaming_queue", "drop_stale_output")

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
        # an ADD that names no prompt text (built directly, not by a client) has one of its own
        self.prompt = msg.prompt or f"#inc{msg.inc}"
        #: tokens of steps whose output is not yet applied (vLLM request.py:172)
        self.num_in_flight_tokens = 0
        #: output in flight when the request was preempted: delivered on return, but it must
        #: not touch the reset counters (vLLM request.py:163-165, scheduler.py:1824-1835)
        self.num_stale_output_tokens = 0
        self.fault = msg.fault
        self.resumable = msg.resumable
        #: a session's input chunks queued while a chunk runs (None: the session's end; the
        #: attribute is None for a request that is not a session).
        self.streaming_queue: deque[Request | None] | None = None
        #: the stale output is dropped, not delivered: a session's finished chunk (vLLM
        #: request.py:168, scheduler.py:2728, 2337-2339).
        self.drop_stale_output = False

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

    def block_hash(self, index: int, block_size: int) -> BlockHash:
        """The hash of full block ``index`` (vLLM kv_cache_utils.py:707-736, 953-1000: chained
        over the tokens, full blocks only). A block inside the prompt is the prompt's; one that
        holds output is this request's own, since its generated tokens are (a token's value is
        the incarnation that sampled it, so the first one stands for the whole output)."""
        if (index + 1) * block_size <= self.prompt_tokens or not self.output:
            return (self.prompt, index)
        return (f"{self.prompt}/{self.prompt_tokens}/{self.output[0].inc}", index)

    def __repr__(self) -> str:
        return f"Request({self.request_id!r}, inc={self.inc}, {self.status})"
