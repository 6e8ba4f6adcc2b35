"""The engine's executor: ``execute_model`` / ``sample_tokens`` on vLLM's own model runner.

From 0.10.1.1 on the runner is vLLM's own
(racesim.engine_vllm.runner.RealRunner: the release's ``CPUModelRunner``, stepped through its
real ``execute_model`` and, from 0.14, ``sample_tokens``, what ``UniProcExecutor`` calls,
v1/executor/uniproc_executor.py). 0.9.2 still steps the model's fake runner
(racesim.engine_model.runner), and so does every release when the user asked for the model's
runner (``RACESIM_VLLM_RUNNER=model``); ``runner_kind`` (racesim.engine_vllm.runner.kind) says
which ran. The model's runner keeps no books of vLLM's runner: runner-books and input-integrity
are not checked over it (as on 0.9.2).
"""

from __future__ import annotations

import copy
from typing import Any

from racesim.engine_model.events.runner import RunnerBooks, RunnerInput
from racesim.engine_model.fatal import EngineFatal
from racesim.engine_model.runner import ModelRunner, carry_of
from racesim.engine_model.scheduler import NewRequestData, SchedulerOutput

from racesim.engine_vllm.runner.books import input_errors, runner_books
from racesim.engine_vllm.runner.kind import runner_kind

__all__ = ["runner_kind", "Executor"]


class Executor:
    """One engine's executor over the real runner, or the model's fake one."""

    def __init__(self, core: Any, shape: Any, async_scheduling: bool,
                 duplicate_rows_die: bool = False, wanted: str | None = None,
                 features: frozenset[str] = frozenset()) -> None:
        self.core = core
        self._component = f"{core.name}.runner"
        self.real: Any = None
        self.fake: ModelRunner | None = None
        v = core.v
        if runner_kind(v.api.key, wanted).startswith("vllm"):
            from racesim.engine_vllm import _vllm
            from racesim.engine_vllm.runner import RealRunner

            vc = _vllm._config(shape)[0]
            from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

            self._empty = EMPTY_MODEL_RUNNER_OUTPUT
            accept = None
            if shape.num_speculative_tokens:
                # how many drafts the network accepts: drawn per verified row, in the run's
                # order, from the World's seeded stream (racesim.engine_vllm.runner.spec)
                rng = core.world.rng.stream("spec-accept")
                accept = lambda n: rng.randint(0, n)  # noqa: E731
            self.real = RealRunner(v, vc, core.sched.kv_cache_config, core.vocab, self._truth,
                                   accept)
        elif wanted == "model":
            # asked for: the release's runner as the model engine models it (its batch rows
            # and token carry-over, engine_model/engine_core.py)
            self.fake = ModelRunner(core.world, f"{core.name}.runner", async_scheduling,
                                    duplicate_rows_die, carry_of(features))
        else:
            # the model's runner where vLLM's is not run (before 0.10): its batch rows too
            self.fake = ModelRunner(core.world, f"{core.name}.runner", async_scheduling,
                                    duplicate_rows_die)

    def _truth(self, rid: str) -> tuple[int, int | None]:
        core = self.core
        req = core.sched.requests.get(rid)
        if req is None:
            return 0, None
        eos = core._eos.get(id(req.sampling_params))
        return core.inc_of(req), (eos[1] if eos is not None else None)

    def live_ids(self) -> list[tuple[str, int]]:
        """``(request ID, incarnation)`` of every request state the runner still holds."""
        if self.real is not None:
            real = self.real
            return [(rid, real.inc_of_state(s)) for rid, s in real.runner.requests.items()]
        assert self.fake is not None
        return self.fake.live_ids()

    def execute(self, so: Any, step: int) -> tuple[Any, bool]:
        """The step's ModelRunnerOutput (or the release's async output object), and whether
        the runner's ``execute_model`` deferred it to ``sample_tokens`` (0.14+)."""
        core = self.core
        if self.real is not None:
            out, deferred = core.call(self.real.execute, so)
            self._check(so, step)
            if out is self._empty:
                out = copy.copy(out)  # a P/D transport sets kv_connector_output on it
            return out, deferred
        assert self.fake is not None
        try:
            sampled = self.fake.execute_model(self._fake_input(so, step))
        except EngineFatal as exc:  # GPUModelRunner's own KeyError kills EngineCoreProc too
            raise core._fatal(str(exc)) from None
        vocab = core.vocab
        req_ids = list(so.num_scheduled_tokens)
        return core.v.api.model_runner_output(
            core.v.ModelRunnerOutput, req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[[vocab.encode(sampled[r])] if r in sampled else []
                               for r in req_ids]), False

    def _check(self, so: Any, step: int) -> None:
        """runner-books and input-integrity over this step's books (recorded when wrong)."""
        core = self.core
        trace = core.world.trace
        if not trace.reads(RunnerBooks.KIND):
            return
        component = self._component
        problems = runner_books(self.real, core.sched, so, core.inc_of)
        if problems:
            core.world.emit(component, None, 0, RunnerBooks(step, problems))
        if so.total_num_scheduled_tokens:
            requests = core.sched.requests
            for rid, bad in input_errors(self.real, core.sched, core.inc_of, so).items():
                core.world.emit(component, rid, core.inc_of(requests.get(rid)),
                                RunnerInput(step, bad))

    @staticmethod
    def result(out: Any) -> Any:
        """``future.result()``: an async output's ``get_output()`` (gpu_model_runner.py)."""
        get = getattr(out, "get_output", None)
        return get() if get is not None else out

    def _fake_input(self, so: Any, step: int) -> SchedulerOutput:
        """The vLLM SchedulerOutput as the model's runner reads it (IDs, counts, new requests
        with their incarnation, found through the scheduled Request object)."""
        core = self.core
        requests = core.sched.requests
        new = []
        for nr in so.scheduled_new_reqs:
            req = requests.get(nr.req_id)
            eos = core._eos.get(id(req.sampling_params))  # kept alive there: ids stay unique
            new.append(NewRequestData(nr.req_id, core.inc_of(req),
                                      len(nr.prompt_token_ids or ()),
                                      eos[1] if eos is not None else None,
                                      nr.num_computed_tokens))
        cached = so.scheduled_cached_reqs
        computed = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        return SchedulerOutput(step, scheduled_new_reqs=new,
                               scheduled_cached_reqs=list(cached.req_ids),
                               num_scheduled_tokens=dict(so.num_scheduled_tokens),
                               num_computed_tokens=computed,
                               finished_req_ids=sorted(so.finished_req_ids))
