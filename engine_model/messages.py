"""What crosses the sockets: EngineCoreRequest, ABORT, EngineCoreOutputs, tokens, KV params.

Fields named ``inc`` (and ``Token``) are simulator ground truth riding along with a message; the
modelled code never reads them to make a decision. They let the checker tell incarnations apart
where the modelled system only sees request-ID strings.

The messages made every step or every request are plain slotted classes rather than frozen
dataclasses: a dataclass ``__init__`` is generated Python even in a compiled build, and these
are made thousands of times a run. Nothing mutates a message after it is sent. The frozen
dataclasses left pickle (and copy) by constructor: a compiled frozen class cannot be restored
field by field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from racesim.sim.points import reduce_by_fields

__all__ = ["FinishReason", "Token", "KVTransferParams", "EngineCoreRequest", "AbortMessage",
           "EngineCoreOutput", "EngineCoreOutputs", "EngineDead", "KVHeartbeat", "KVDoneNotice",
           "KVPushRegistration", "KVPullRequest", "KVPullResult",
           "UtilityMessage"]


class FinishReason:
    """vLLM's finish reasons as strings, plus the two outcomes that never reach the engine."""

    STOP: Final = "stop"
    LENGTH: Final = "length"
    ABORT: Final = "abort"
    ERROR: Final = "error"
    REJECTED: Final = "rejected"
    #: vLLM 0.33: the stream ended by STREAM_FINISHED (a same-ID add), with no finish reason.
    STREAM_FINISHED: Final = "stream_finished"


class Token(NamedTuple):
    """A sampled token's provenance: the incarnation that generated it, and (async scheduling)
    the incarnation whose sampled token was fed back as its input (0 when its own)."""

    inc: int
    ctx: int
    eos: bool


@dataclass(frozen=True, slots=True)
class KVTransferParams:
    """P/D transfer parameters (NixlConnector's kv_transfer_params)."""

    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    remote_engine: int = -1
    remote_request_id: str = ""
    remote_block_ids: tuple[int, ...] = ()
    remote_inc: int = 0  # ground truth: the prefill incarnation that owns the blocks
    #: MooncakeConnector: the router-supplied key pairing P with D (mooncake_connector.py:1108)
    transfer_id: str = ""

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return reduce_by_fields(self)


class EngineCoreRequest:
    """An ADD: the request the frontend sends to an engine."""

    __slots__ = ("request_id", "external_req_id", "prompt_tokens", "max_tokens", "client_index",
                 "eos_at", "kv_transfer_params", "inc", "prompt", "fault", "resumable")

    def __init__(self, request_id: str, external_req_id: str, prompt_tokens: int,
                 max_tokens: int, client_index: int, eos_at: int | None,
                 kv_transfer_params: KVTransferParams | None, inc: int,
                 prompt: str = "", fault: str = "", resumable: bool = False) -> None:
        self.request_id = request_id
        self.external_req_id = external_req_id
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.client_index = client_index
        self.eos_at = eos_at
        self.kv_transfer_params = kv_transfer_params
        self.inc = inc  # ground truth
        #: the prompt's text, by name: equal names, equal tokens (prompt_token_ids in vLLM);
        #: "" is a text no other request has
        self.prompt = prompt
        #: a scripted fault this request meets: "preprocess" (the input thread fails on it) or
        #: "kv-load" (the decode side's remote KV read fails); "" for none.
        self.fault = fault
        #: a streaming-input chunk (vLLM #28973); the session's final add is not resumable.
        self.resumable = resumable


@dataclass(frozen=True, slots=True)
class AbortMessage:
    """An ABORT: a list of request IDs."""

    request_ids: tuple[str, ...]
    tag: int = 0  # ground truth: which abort this is, so the checker can judge its precision

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return reduce_by_fields(self)


class EngineCoreOutput:
    """One request's new tokens from one step, and its finish reason when it finished."""

    __slots__ = ("request_id", "new_tokens", "finish_reason", "kv_transfer_params", "inc",
                 "chunk_end")

    def __init__(self, request_id: str, new_tokens: tuple[Token, ...],
                 finish_reason: str | None = None,
                 kv_transfer_params: KVTransferParams | None = None, inc: int = 0,
                 chunk_end: bool = False) -> None:
        self.request_id = request_id
        self.new_tokens = new_tokens
        self.finish_reason = finish_reason
        self.kv_transfer_params = kv_transfer_params
        self.inc = inc  # ground truth: the engine request object this output was built from
        #: a streaming-input session's chunk ended; the request stays in the engine (its ID
        #: is not among the finished ones).
        self.chunk_end = chunk_end


class EngineCoreOutputs:
    """One step's outputs for one frontend (client_index). ``finished_requests``: the IDs
    this frontend's requests finished with since the last outputs, sent only under data
    parallelism for the load balancer (vLLM 0.33 scheduler.py:2646-2658)."""

    __slots__ = ("engine", "outputs", "finished_requests")

    def __init__(self, engine: int, outputs: tuple[EngineCoreOutput, ...],
                 finished_requests: tuple[str, ...] | None = None) -> None:
        self.engine = engine
        self.outputs = outputs
        self.finished_requests = finished_requests


@dataclass(frozen=True, slots=True)
class UtilityMessage:
    """A UTILITY call from an API server to an engine (pause_generation, resume_scheduler)."""

    method: str
    mode: str = ""
    #: pause_generation's ``clear_cache`` (the vllm backend only: the model refuses it)
    clear_cache: bool = False

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return reduce_by_fields(self)


@dataclass(frozen=True, slots=True)
class EngineDead:
    """The engine process died (EngineDeadError for everything pending on it)."""

    engine: int
    reason: str

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return reduce_by_fields(self)


@dataclass(frozen=True, slots=True)
class KVDoneNotice:
    """Decode → prefill: the blocks of ``request_id`` were read ("<id>:<n>" in NIXL)."""

    request_id: str
    remote_inc: int  # ground truth: the prefill incarnation the reader meant

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return reduce_by_fields(self)


@dataclass(frozen=True, slots=True)
class KVPushRegistration:
    """Decode -> prefill, NIXL push mode: a PUSH_REG notification naming D's request and the
    blocks it allocated for the prompt (vLLM 0.33 nixl/push_scheduler.py:177-189, sent by
    push_worker.py:384-414)."""

    request_id: str  # D's own (internal) request ID
    engine: int
    blocks: tuple[int, ...]
    inc: int  # ground truth: the decode incarnation that registered
    #: a scripted transport fault (``kv_load_fails`` on D's request): P's WRITE into these
    #: blocks cannot be posted
    write_fails: bool = False

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return reduce_by_fields(self)


@dataclass(frozen=True, slots=True)
class KVPullRequest:
    """Decode -> prefill, MooncakeConnector: D asks P's sender for ``transfer_id``'s KV, naming
    its own request and the blocks to write (``req_blocks`` of a MooncakeXferMetadata, vLLM
    0.33 mooncake_connector.py:2892-2900)."""

    request_id: str  # D's own (internal) request ID
    transfer_id: str
    engine: int
    blocks: tuple[int, ...]
    inc: int  # ground truth: the decode incarnation that asks

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return reduce_by_fields(self)


@dataclass(frozen=True, slots=True)
class KVPullResult:
    """Prefill -> decode, MooncakeConnector: P's answer for one of D's requests, ``ok`` (its
    blocks were written) or not (``err_reqs``, or left out of a FINISH; :1673-1690, 1771-1778,
    2478-2485)."""

    request_id: str
    ok: bool
    inc: int

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return reduce_by_fields(self)


@dataclass(frozen=True, slots=True)
class KVHeartbeat:
    """Decode → prefill: "HB:<id>,<id>" renews the lease on the named prefill requests' blocks
    (vLLM 0.33 nixl/base_worker.py:3380-3399, 3517-3545)."""

    request_ids: tuple[str, ...]

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return reduce_by_fields(self)
