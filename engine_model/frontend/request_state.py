"""The OutputProcessor's records: one request's frontend state (``RequestState``,
vllm/v1/engine/output_processor.py) and the parent of n > 1 children (``ParentRequest``,
vllm/v1/engine/parallel_sampling.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from racesim.engine_model.frontend.outputs import RequestOutputCollector

__all__ = ["ParentRequest", "RequestState"]


@dataclass(slots=True)
class ParentRequest:
    """n > 1: the parent of the child requests ``<index>_<parent id>``."""

    request_id: str
    external_req_id: str
    collector: RequestOutputCollector
    child_requests: list[str] = field(default_factory=list)
    finished_children: int = 0
    n: int = 1
    #: an abort by external ID resolved to this parent: its entry outlives its children.
    aborted_by_external: bool = False
    #: ground truth, for the leak audit only: the incarnation of each registered child.
    incs: list[int] = field(default_factory=list)


@dataclass(slots=True)
class RequestState:
    """One request's frontend state (ground-truth fields are for the checker only)."""

    request_id: str
    external_req_id: str
    index: int
    parent: ParentRequest | None
    collector: RequestOutputCollector
    inc: int        # ground truth, for the checker only
    client_uid: int  # ground truth, for the checker only
    engine: int
    stop_string_at: int | None
    num_generated: int = 0
    #: finished in the frontend (stop string or abort) but kept until the policy drops it.
    finished: bool = False
    #: a streaming-input session expecting more input (output_processor.py:249-252).
    streaming_input: bool = False
    #: its input chunks not yet applied, each True when it is the last (None: the engine
    #: finished the last chunk applied).
    input_chunk_queue: deque[bool] | None = None
