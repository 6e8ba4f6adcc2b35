"""What one schedule() call ships to the model runner (vllm/v1/core/sched/output.py): the new
requests and the batch, with dicts keyed by request ID as vLLM's are."""

from __future__ import annotations

from racesim.engine_model.request import Request

__all__ = ["NewRequestData", "SchedulerOutput"]


class NewRequestData:
    """A newly scheduled request, as SchedulerOutput ships it to the runner."""

    __slots__ = ("req_id", "inc", "prompt_tokens", "eos_at", "num_computed_tokens")

    def __init__(self, req_id: str, inc: int, prompt_tokens: int, eos_at: int | None,
                 num_computed_tokens: int) -> None:
        self.req_id = req_id
        self.inc = inc
        self.prompt_tokens = prompt_tokens
        self.eos_at = eos_at
        self.num_computed_tokens = num_computed_tokens


class SchedulerOutput:
    """One step's batch. Its dicts are keyed by request ID, as vLLM's are."""

    __slots__ = ("step", "scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
                 "num_computed_tokens", "finished_req_ids", "scheduled_objects")

    def __init__(self, step: int, *, scheduled_new_reqs: list[NewRequestData] | None = None,
                 scheduled_cached_reqs: list[str] | None = None,
                 num_scheduled_tokens: dict[str, int] | None = None,
                 num_computed_tokens: dict[str, int] | None = None,
                 finished_req_ids: list[str] | None = None,
                 scheduled_objects: list[Request] | None = None) -> None:
        self.step = step
        self.scheduled_new_reqs: list[NewRequestData] = (
            [] if scheduled_new_reqs is None else scheduled_new_reqs)
        self.scheduled_cached_reqs: list[str] = (
            [] if scheduled_cached_reqs is None else scheduled_cached_reqs)
        self.num_scheduled_tokens: dict[str, int] = (
            {} if num_scheduled_tokens is None else num_scheduled_tokens)
        self.num_computed_tokens: dict[str, int] = (
            {} if num_computed_tokens is None else num_computed_tokens)
        self.finished_req_ids: list[str] = (
            [] if finished_req_ids is None else finished_req_ids)
        #: ground truth for the checker: the Request objects scheduled (identity, not ID).
        self.scheduled_objects: list[Request] = (
            [] if scheduled_objects is None else scheduled_objects)

    @property
    def total_num_scheduled_tokens(self) -> int:
        total = 0
        for n in self.num_scheduled_tokens.values():
            total += n
        return total
