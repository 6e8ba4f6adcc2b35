"""The modelled deployment with vLLM's own engine-side classes, and the run entry point.

Everything asynchronous is the model's (clients, AsyncLLM tasks, sockets, timing); the engine is
:class:`racesim.engine_vllm.engine.core.VllmEngineCore`, and ID assignment is vLLM's own
``InputProcessor.assign_request_id`` for the ``internal-id`` policy; each frontend's request
state is vLLM's own ``OutputProcessor`` (:mod:`racesim.engine_vllm.frontend`).

Under data parallelism each rank is its own ``VllmEngineCore``: a dense model's DP ranks are
independent EngineCoreProcs (vllm/v1/engine/core.py:1546-1555, ``engine_index`` = the rank), so
the per-rank state is that engine's Scheduler, built with ``include_finished_set`` as the DP
coordinator's internal load balancing has it (core.py:1219-1238). Request waves
(``current_wave``, START_DP_WAVE) live in ``DPEngineCoreProc``, which only MoE models run
(core.py:2281-2297, 2372-2436); a dense rank's ``add_request`` ignores the wave that
``preprocess_add_request`` returns (core.py:518, 1126-1148). The DP client (load balancer,
``reqs_in_flight``) and the coordinator's stats stay the model's.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from typing import Any

import simpy

from racesim.engine_model.config import Workload
from racesim.engine_model.data_parallel import DPCoordinator
from racesim.engine_model.policies import LifecyclePolicy
from racesim.engine_model.system import RunResult, System
from racesim.engine_model.system import run_workload as _run_model
from racesim.engine_vllm import _vllm
from racesim.engine_vllm.engine.core import VllmEngineCore
from racesim.engine_vllm.frontend import VllmOutputProcessor
from racesim.engine_vllm.connectors.nixl import NixlFabric, install_clock
from racesim.engine_vllm.engine.views import PromptTokens, Vocabulary
from racesim.sim.points import DelayPlan

__all__ = ["VllmSystem", "run_workload", "on_runner"]


class _RealIds:
    """A policy whose ``assign_request_id`` is vLLM's own (the rest is the policy's)."""

    def __init__(self, policy: LifecyclePolicy) -> None:
        self._policy = policy
        self.name = policy.name
        self.engine_final_abort = policy.engine_final_abort
        self.pop_stop_string_finishes = policy.pop_stop_string_finishes

    def assign_request_id(self, llm: Any, request_id: str) -> str:
        rng = llm.world.rng.stream(f"request-id/{llm.name}")
        # random_uuid's first 8 hex characters are all assign_request_id keeps (:.8)
        return _vllm.assign_request_id(request_id, lambda: f"{rng.getrandbits(32):08x}")

    def abort(self, llm: Any, request_ids: list[str]) -> Generator[simpy.Event, Any, None]:
        return self._policy.abort(llm, request_ids)

    def abort_stop_strings(self, llm: Any,
                           request_ids: list[str]) -> Generator[simpy.Event, Any, None]:
        return self._policy.abort_stop_strings(llm, request_ids)


class VllmSystem(System):
    """``System`` with a ``VllmEngineCore``: vLLM's Scheduler and KV cache manager."""

    #: the runner the user asked for (``RACESIM_VLLM_RUNNER``): None, or "model"
    #: (:func:`on_runner`'s subclass)
    runner: str | None = None

    def __init__(self, world: Any, workload: Workload, policy: Any, profile: Any) -> None:
        if getattr(policy, "suffix_hex", 0) == 8:
            policy = _RealIds(policy)
        #: one fake vocabulary for every engine: a frontend decodes the tokens of any DP rank
        self.vocab = Vocabulary()
        self.prompts = PromptTokens()
        #: P/D: the engines' NIXL IDs and the params the proxy forwards (None otherwise)
        pd = workload.pd
        self.fabric = NixlFabric(pd.connector, pd.decoder_kv_blocks_ttl
                                 if pd.bidirectional_kv_xfer else None) \
            if workload.topology == "pd" else None
        if self.fabric is not None:
            install_clock(lambda: float(world.now))
        super().__init__(world, workload, policy, profile)

    def new_output_processor(self, index: int, name: str, engine: Any) -> Any:
        """vLLM's own OutputProcessor, behind the adapter AsyncLLM calls."""
        op = VllmOutputProcessor(self.world, name, engine.index, self.vocab, index)
        op.fabric = self.fabric
        return op

    def _max_model_len(self) -> int:
        wl = self.workload
        # a streaming-input session's prompt grows by each chunk and all but one of its tokens
        longest = max((r.prompt_tokens + r.max_tokens
                       + ((r.prompt_tokens if r.chunk_tokens is None else r.chunk_tokens)
                          + r.max_tokens) * r.input_chunks
                       for r in wl.requests), default=1)
        # the model has no length cap: a length that never binds, in whole 256-token steps
        return max(256, -(-(longest + 1) // 256) * 256)

    def new_engine(self, index: int, name: str) -> Any:
        wl = self.workload
        return VllmEngineCore(self.world, index, name, wl.engine, self.policy, self.profile,
                              max_model_len=self._max_model_len(), vocab=self.vocab,
                              dp=wl.topology != "pd" and wl.engine.dp_size > 1,
                              runner=self.runner)

    def new_pd_engine(self, index: int, role: str) -> Any:
        """A P/D engine whose Scheduler runs vLLM's own NixlConnector (kv_producer on the
        prefill side, kv_consumer on the decode side), its worker simulated
        (:mod:`racesim.engine_vllm.connectors.nixl`)."""
        wl = self.workload
        assert self.fabric is not None
        self.fabric.engine_ids[role] = index
        pd = wl.pd
        engine = VllmEngineCore(self.world, index, role, wl.engine, self.policy, self.profile,
                                max_model_len=self._max_model_len(), vocab=self.vocab,
                                pd=(role, self.fabric, int(pd.hold_timeout),
                                    pd.transfer_time if role == "decode" or
                                    pd.connector in ("nixl-push", "mooncake") else 0.0),
                                runner=self.runner)
        # one prompt is the same tokens on P and D, as a real client's prompt is on both legs
        # (a reproducer tells the legs of one client apart by them)
        engine._prompts = self.prompts
        return engine

    def dp_rank(self, engine: Any, coordinator: DPCoordinator) -> None:
        """The rank's Scheduler already lists finished IDs per client; its steps tell the
        coordinator."""
        engine.coordinator = coordinator

    def dp_load(self, engine: Any) -> tuple[int, int, float]:
        """vLLM's own counts: ``get_request_counts`` is (running, waiting) and
        ``get_kv_cache_usage`` the block pool's usage (scheduler.py:2920-2926)."""
        sched = engine.sched
        running, waiting = sched.get_request_counts()
        return waiting, running, float(sched.get_kv_cache_usage())


_ON_MODEL_RUNNER: dict[type, type] = {}


def on_runner(cls: type[VllmSystem], runner: str | None) -> type[VllmSystem]:
    """``cls``, or its subclass whose engines step the model's runner (``runner`` "model")."""
    if runner is None:
        return cls
    sub = _ON_MODEL_RUNNER.get(cls)
    if sub is None:
        sub = _ON_MODEL_RUNNER[cls] = type(f"{cls.__name__}OnModelRunner", (cls,),
                                           {"runner": runner, "__module__": cls.__module__})
    return sub


def run_workload(workload: Workload, policy: LifecyclePolicy, *, seed: int = 0,
                 plan: DelayPlan | None = None, skip: Iterable[str] = (),
                 retain_trace: bool = True, hash_trace: bool = True,
                 runner: str | None = None) -> RunResult:
    """``racesim.engine_model.run_workload`` on vLLM's own engine classes (``runner`` "model":
    on the model's runner, RACESIM_VLLM_RUNNER)."""
    from racesim.engine_vllm.connectors.mooncake_loop import finish_loops

    try:
        with _vllm.run_caches():
            return _run_model(workload, policy, seed=seed, plan=plan, skip=skip,
                              retain_trace=retain_trace, hash_trace=hash_trace,
                              system_cls=on_runner(VllmSystem, runner), engine="vllm")
    finally:
        finish_loops()  # MooncakeConnector's listener and sender tasks wait for ever
