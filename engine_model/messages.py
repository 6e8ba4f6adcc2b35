"""What crosses the sockets: EngineCoreRequest, ABORT, EngineCoreOutputs, tokens, KV params.

Fields named ``inc`` (and ``Token``) are simulator ground truth riding along with a message; the
modelled code never reads them to make a decision. They let the checker tell incarnations apart
where the modelled system only sees request-ID strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NamedTuple

__all__ = ["FinishReason", "Token", "KVTransferParams", "EngineCoreRequest", "AbortMessage",
           "EngineCoreOutput", "EngineCoreOutputs", "EngineDead", "KVDoneNotice"]


class FinishReason:
    """vLLM's finish reasons as strings, plus the two outcomes that never reach the engine."""

    STOP: Final = "stop"
    LENGTH: Final = "length"
    ABORT: Final = "abort"
    ERROR: Final = "error"
    REJECTED: Final = "rejected"


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


@dataclass(frozen=True, slots=True)
class EngineCoreRequest:
    """An ADD: the request the frontend sends to an engine."""

    request_id: str
    external_req_id: str
    prompt_tokens: int
    max_tokens: int
    client_index: int
    eos_at: int | None
    kv_transfer_params: KVTransferParams | None
    inc: int  # ground truth


@dataclass(frozen=True, slots=True)
class AbortMessage:
    """An ABORT: a list of request IDs."""

    request_ids: tuple[str, ...]
    tag: int = 0  # ground truth: which abort this is, so the checker can judge its precision


@dataclass(frozen=True, slots=True)
class EngineCoreOutput:
    """One request's new tokens from one step, and its finish reason when it finished."""

    request_id: str
    new_tokens: tuple[Token, ...]
    finish_reason: str | None = None
    kv_transfer_params: KVTransferParams | None = None
    inc: int = 0  # ground truth: the engine request object this output was built from


@dataclass(frozen=True, slots=True)
class EngineCoreOutputs:
    """One step's outputs for one frontend (client_index)."""

    engine: int
    outputs: tuple[EngineCoreOutput, ...]


@dataclass(frozen=True, slots=True)
class EngineDead:
    """The engine process died (EngineDeadError for everything pending on it)."""

    engine: int
    reason: str


@dataclass(frozen=True, slots=True)
class KVDoneNotice:
    """Decode → prefill: the blocks of ``request_id`` were read ("<id>:<n>" in NIXL)."""

    request_id: str
    remote_inc: int  # ground truth: the prefill incarnation the reader meant
