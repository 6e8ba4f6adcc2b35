"""GPUModelRunner: per-ID request state, ``_update_states`` and sampling.

The runner keeps its own ``requests`` dict keyed by ID. ``_update_states`` removes the finished
IDs, adds the new requests, then looks up every cached one unchecked: a missing ID is the
KeyError that kills EngineCore (``_update_states``, vLLM #15326). Under async scheduling the
sampled tokens of step N are fed into step N+1 by ID match (``prev_req_id_to_index``), so a new
request that reuses an ID can be fed the old one's token.

The persistent batch (``InputBatch``) has one row per request it adds, found by ID through
``req_id_to_index``, whose size is ``num_reqs``. Before 0.20 (``runner-duplicate-row``) a second
request under an ID whose row stays in the batch gets a row of its own: ``_update_states`` keeps
the rows of every ID scheduled this step and adds each new request, and each cached one with no
row, by ``input_batch.add_request`` (0.11.0 gpu_model_runner.py:557-564, 609, 652-657,
694-695; gpu_input_batch.py:287, 828-829), so ``_prepare_inputs`` repeats ``num_reqs`` indices
by more token counts than that and raises ValueError (0.11.0 gpu_model_runner.py:952, as vLLM
0.11.0's own runner does on the vllm backend; the same code in 0.10.1.1 :457-459, 541, 582-587,
622-624, 718 and 0.9.2 :392-394, 466, 507-512, 547-549, 607, derived, not run).
"""

from __future__ import annotations

from racesim.engine_model.events.engine import RunnerSample
from racesim.engine_model.fatal import EngineFatal
from racesim.engine_model.messages import Token
from racesim.engine_model.scheduler import SchedulerOutput
from racesim.sim.world import World

__all__ = ["ModelRunner", "CachedRequestState", "carry_of"]

_new_tuple = tuple.__new__


class CachedRequestState:
    """The model runner's per-request state (``self.requests[id]`` in vLLM)."""

    __slots__ = ("req_id", "inc", "prompt_tokens", "eos_at", "num_computed_tokens", "num_output")

    def __init__(self, req_id: str, inc: int, prompt_tokens: int, eos_at: int | None,
                 num_computed_tokens: int) -> None:
        self.req_id = req_id
        self.inc = inc
        self.prompt_tokens = prompt_tokens
        self.eos_at = eos_at
        self.num_computed_tokens = num_computed_tokens
        self.num_output = 0


#: The token carry-over a release's runner has, by the profile feature that names it:
#: "by-id" (no feature: fed by ID match, replaced every step); "persists" (0.11: a step with no
#: tokens returns before the sampled tokens are kept, so the last ones stay for the next step
#: that computes, 0.11.0 gpu_model_runner.py:2241-2246 return early, :2163-2170 keep them,
#: :849-860 feed them by ID, to a prefill's last input too); "drops-finished" (0.14+, #29355's
#: fix: removing a finished request from the persistent batch drops its entry in
#: prev_req_id_to_index, 0.33.0 gpu_input_batch.py:569-570 called for finished_req_ids at
#: gpu_model_runner.py:1200-1201, 0.14.0 gpu_input_batch.py:513-514); "none" (before 0.11:
#: 0.10.1.1 has no prev_req_id_to_index or prev_sampled_token_ids, its batch queue waits for a
#: step's output before the scheduler sends the next token)
CARRIES = {"runner-carry-persists": "persists", "runner-carry-drops-finished": "drops-finished",
           "runner-no-carry": "none"}


def carry_of(features: frozenset[str]) -> str:
    """The carry-over a profile's features name ("by-id" when none does)."""
    for feature, carry in CARRIES.items():
        if feature in features:
            return carry
    return "by-id"


class ModelRunner:
    """The GPU model runner: its own per-ID state and, in async mode, the token carry-over."""

    __slots__ = ("world", "component", "requests", "async_scheduling", "_prev_sampled",
                 "duplicate_rows_die", "_rows", "carry")

    def __init__(self, world: World, component: str, async_scheduling: bool,
                 duplicate_rows_die: bool = False, carry: str = "by-id") -> None:
        self.world = world
        self.component = component
        self.requests: dict[str, CachedRequestState] = {}
        self.async_scheduling = async_scheduling
        # Async scheduling: the previous batch's sampled tokens, by request ID.
        self._prev_sampled: dict[str, Token] = {}
        self.duplicate_rows_die = duplicate_rows_die
        #: how the previous step's sampled tokens are fed on by ID under async scheduling
        #: (``prev_req_id_to_index``); one of :data:`CARRIES`
        self.carry = carry
        #: the IDs with a row in the persistent batch (``input_batch.req_id_to_index``)
        self._rows: dict[str, None] = {}

    def live_ids(self) -> list[tuple[str, int]]:
        """``(request ID, incarnation)`` for every cached request state still held."""
        return [(rid, state.inc) for rid, state in self.requests.items()]

    def execute_model(self, out: SchedulerOutput) -> dict[str, Token]:
        """_update_states, then one forward pass: the token sampled for each request ID."""
        self._update_states(out)
        requests = self.requests
        prev = self._prev_sampled
        sampled: dict[str, Token] = {}
        for rid, n in out.num_scheduled_tokens.items():
            state = requests.get(rid)
            if state is None:
                raise EngineFatal(f"KeyError: {rid!r} in GPUModelRunner.requests (execute)")
            state.num_computed_tokens += n
            if state.num_computed_tokens < state.prompt_tokens + state.num_output:
                continue  # partial prefill: the sampled token is discarded
            ctx = 0
            if self.async_scheduling and self.carry != "none":
                carried = prev.get(rid)
                if carried is not None and self.carry == "drops-finished" \
                        and rid in out.finished_req_ids:
                    carried = None
                if carried is not None and carried.inc != state.inc:
                    ctx = carried.inc  # the input token came from another incarnation
            state.num_output += 1
            # tuple.__new__: the same Token without the named tuple's Python-level __new__
            sampled[rid] = _new_tuple(Token, (state.inc, ctx, state.num_output == state.eos_at))
        if self.async_scheduling and (out.num_scheduled_tokens or self.carry != "persists"):
            self._prev_sampled = sampled
        if sampled:
            trace = self.world.trace
            if trace.reads(RunnerSample.KIND):
                trace.emit(self.component, None, 0, RunnerSample(
                    out.step, [[rid, t.inc, t.ctx, t.eos] for rid, t in sampled.items()]))
            else:
                trace.skip()
        return sampled

    def _update_states(self, out: SchedulerOutput) -> None:
        requests = self.requests
        for rid in out.finished_req_ids:
            requests.pop(rid, None)
        if self.duplicate_rows_die:
            self._add_rows(out)
        for new in out.scheduled_new_reqs:
            # A re-added ID replaces the state (woosuk's comment in _update_states allows it).
            requests[new.req_id] = CachedRequestState(new.req_id, new.inc, new.prompt_tokens,
                                                      new.eos_at, new.num_computed_tokens)
        for rid in out.scheduled_cached_reqs:
            state = requests.get(rid)
            if state is None:
                raise EngineFatal(f"KeyError: {rid!r} in GPUModelRunner.requests "
                                  f"(_update_states, cached request)")
            state.num_computed_tokens = out.num_computed_tokens[rid]

    def _add_rows(self, out: SchedulerOutput) -> None:
        """The persistent batch's rows after this step's ``_update_states``: the rows of
        finished and unscheduled IDs go, every new request and every cached one with no row is
        added; a second row under one ID is the ValueError ``_prepare_inputs`` raises."""
        scheduled = out.num_scheduled_tokens
        rows = {rid: None for rid in self._rows
                if rid in scheduled and rid not in out.finished_req_ids}
        added = [new.req_id for new in out.scheduled_new_reqs]
        added += [rid for rid in out.scheduled_cached_reqs if rid not in rows]
        for rid in added:
            if rid in rows:
                raise EngineFatal(
                    f"ValueError: operands could not be broadcast together (the persistent "
                    f"batch holds two rows for {rid!r}: gpu_model_runner.py _prepare_inputs, "
                    f"np.repeat over num_reqs)")
            rows[rid] = None
        self._rows = rows
