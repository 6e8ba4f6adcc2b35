"""The deployment with vLLM's own frontend: N API servers (each vLLM's AsyncLLM on its own
deterministic loop) on one engine (the vllm backend's ``VllmEngineCore``), and the run entry.

Each API server is a process of ``vllm serve --api-server-count N``: its own event loop, its own
ROUTER/PULL pair to the engine (``client_index`` = its index). The engine side of each input
pipe decodes the frames with vLLM's own ``MsgpackDecoder`` as ``EngineCoreProc``'s input thread
does (core.py ``process_input_sockets``) and hands the engine ``(request_type, request)``
(``VllmEngineCore.deliver_vllm``).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterable
from typing import Any

from racesim.engine_model.config import Workload
from racesim.engine_model.events.api import ApiRouterAbort
from racesim.engine_model.events.frontend import FeUtility
from racesim.engine_model.policies import LifecyclePolicy
from racesim.engine_model.system import RunResult
from racesim.engine_model.system import run_workload as _run_model
from racesim.engine_model.versions import resolve_workload
from racesim.engine_vllm import _vllm
from racesim.engine_vllm.engine.views import Vocabulary
from racesim.engine_vllm.frontend import build
from racesim.engine_vllm.frontend.asyncllm import RealFrontend
from racesim.engine_vllm.frontend.clients import RealClient
from racesim.engine_vllm.frontend.loop import SimLoop
from racesim.engine_vllm.system import VllmSystem, on_runner
from racesim.sim.points import DelayPlan

__all__ = ["RealFrontendSystem", "run_workload", "unsupported"]

#: the lifecycles the real frontend runs: vLLM's code with or without ID randomization
LIFECYCLES = ("buggy", "internal-id")


def unsupported(workload: Workload) -> str | None:
    """Why ``workload`` cannot run on the real frontend yet (one phrase), or None."""
    if workload.topology != "single":
        return f"topology {workload.topology!r} (only 'single')"
    if workload.engine.dp_size > 1:
        return "data parallelism"
    for r in workload.requests:
        if r.endpoint is not None:
            from racesim.engine_vllm.frontend.serving import unsupported as serving_unsupported

            why = serving_unsupported(r)
            if why is not None:
                return why
        if r.kv_load_fails or r.unserializable:
            return f"request {r.id!r}: a scripted fault (kv_load_fails, unserializable)"
        if r.dp_rank is not None:
            return f"request {r.id!r}: dp_rank"
    return None


class RealFrontendSystem(VllmSystem):
    """``VllmSystem`` whose API servers are vLLM's own AsyncLLM."""

    def __init__(self, world: Any, workload: Workload, policy: Any, profile: Any) -> None:
        # the parts of System.__init__ the single-engine topology uses, with real frontends
        self.world = world
        self.workload = workload
        self.policy = policy
        self.profile = profile
        self._inc = 0
        #: exceptions racesim's own adapter raised inside vLLM's calls (a bug: the run fails)
        self.crashes: list[str] = []
        self._roles: dict[str, str] = {}
        self._channels: list[Any] = []
        self.vocab = Vocabulary()
        self.fabric = None
        build.vllm_names()
        build.bind_run(world)
        self.saved_env = build.set_lifecycle(policy.name, workload.frontend.output_chunk_size)
        engine = self.new_engine(0, "engine")
        self.engines = [engine]
        count = workload.frontends
        self.loops = [SimLoop(world, f"frontend{i}") for i in range(count)]
        self.frontends: list[Any] = []
        for i in range(count):
            name = f"frontend{i}"
            fe = RealFrontend(self, i, name, engine, self.loops[i], count)
            fe.input_channel = self._channel("ipc", name, engine.name, "ipc.input:transit",
                                             self._engine_input(engine))
            engine.output_channels[i] = self._channel("ipc", engine.name, name,
                                                      "ipc.output:transit", fe.deliver)
            self.frontends.append(fe)
        if workload.engine.connect_at is not None:
            # the engine's pipe drops what the ROUTER sends before it connects (the model's
            # gate, System._gate_inputs: no ROUTER_MANDATORY, core_client.py:1293-1300)
            self._gate_inputs(workload.engine.connect_at)
        for fe in self.frontends:  # each server is up before its first client connects
            fe.start_serving()
        self.api_servers: list[Any] = []
        from racesim.engine_vllm.frontend.serving import ServingClient

        self.clients: list[Any] = [
            (RealClient if spec.endpoint is None else ServingClient)(
                self.frontends[spec.frontend], i, self.next_inc(), spec, self.vocab)
            for i, spec in enumerate(workload.requests)]
        if workload.engine.pause_at is not None:
            self._pause_and_resume(self.frontends[0])
        if workload.engine.reset_prefix_cache_at is not None:
            self._reset_prefix_cache(self.frontends[0], workload.engine.reset_prefix_cache_at)
        if workload.frontend.abort_all_at is not None:
            self._abort_all_at(self.frontends[0], float(workload.frontend.abort_all_at))
        for loop in self.loops:
            loop.start()
        self.topology = self._topology([])
        _LAST.system = self

    def _pause_and_resume(self, fe: Any) -> None:
        """API server 0's caller (an RL trainer) awaits ``AsyncLLM.pause_generation(mode=)``
        at ``pause_at`` and ``resume_generation()`` at ``resume_at``, each a task of its own
        (0.33.0 async_llm.py pause_generation / resume_generation), as the model's frontend
        calls them (engine_model/system.py ``_pause_and_resume``)."""
        config = self.workload.engine
        loop = fe.loop

        async def at(when: float, method: str, call: Any) -> None:
            await asyncio.sleep(max(0.0, when - loop.time()))
            self.world.emit(fe.name, None, 0, FeUtility(method, config.pause_mode or "abort"
                                                        if method == "pause_generation" else ""))
            await self._operator(call)

        # clear_cache as the scenario says (its default, False, is not vLLM's: docs/scenarios.md)
        loop.create_task(at(float(config.pause_at), "pause_generation", lambda: fe.llm.
                            pause_generation(mode=config.pause_mode or "abort",
                                             clear_cache=bool(config.pause_clear_cache))),
                         name="trainer:pause_generation")
        if config.resume_at is not None:
            loop.create_task(at(float(config.resume_at), "resume_scheduler",
                                fe.llm.resume_generation), name="trainer:resume_generation")

    def _reset_prefix_cache(self, fe: Any, when: float) -> None:
        """A caller on API server 0 awaits vLLM's own ``AsyncLLM.reset_prefix_cache(
        reset_running_requests=True)`` at ``when`` (0.20.0 async_llm.py:887-892, the
        ``/reset_prefix_cache`` endpoint's call, entrypoints/serve/cache/api_router.py:21-44)."""
        loop = fe.loop

        async def at() -> None:
            await asyncio.sleep(max(0.0, float(when) - loop.time()))
            self.world.emit(fe.name, None, 0, FeUtility("reset_prefix_cache", ""))
            await self._operator(lambda: fe.llm.reset_prefix_cache(reset_running_requests=True))

        loop.create_task(at(), name="caller:reset_prefix_cache")

    async def _operator(self, call: Any) -> None:
        """An operator's call into vLLM: what vLLM raises is its answer (EngineDeadError once
        the engine died); an exception raised in racesim's adapter fails the run."""
        try:
            await call()
        except Exception as exc:
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            if tb is not None and "/engine_vllm/frontend/" in tb.tb_frame.f_code.co_filename:
                self.crashes.append(f"{type(exc).__name__}: {exc}")

    def _abort_all_at(self, fe: Any, when: float) -> None:
        """The RL router's ``POST /abort_requests`` with no IDs on API server 0: every
        ``request_states`` and ``parent_requests`` key of vLLM's OutputProcessor, aborted by
        internal ID in one ``AsyncLLM.abort`` call (0.33.0 entrypoints/rl/online/
        api_router.py:120-132), as the model's API server sends it."""
        loop = fe.loop

        async def abort_all() -> None:
            await asyncio.sleep(max(0.0, when - loop.time()))
            op = fe.llm.output_processor
            ids = [*op.request_states.keys(), *op.parent_requests.keys()]
            self.world.emit(fe.name, None, 0, ApiRouterAbort("rl", list(ids), True, 0))
            if ids:
                await self._operator(lambda: fe.llm.abort(ids, internal=True))

        loop.create_task(abort_all(), name="router:abort_all")

    def engine_shape(self) -> Any:
        wl = self.workload
        c = wl.engine
        return _vllm.VllmEngineShape(c.num_blocks, c.block_size, c.max_num_seqs,
                                     c.max_num_batched_tokens, self._max_model_len(),
                                     bool(c.async_scheduling), bool(c.prefix_caching))

    def _engine_input(self, engine: Any) -> Any:
        """The engine end of an API server's input pipe: vLLM's decoders, as
        ``process_input_sockets`` uses them (an ADD with the typed one, the rest generic)."""
        names = build.vllm_names()
        add = names.MsgpackDecoder(names.EngineCoreRequest)
        generic = names.MsgpackDecoder()
        kinds = names.RequestType

        def deliver(msg: Any) -> None:
            frames = msg.frames
            kind = kinds(frames[0])
            data = list(frames[1:])
            request = add.decode(data) if kind == kinds.ADD else generic.decode(data)
            truth = msg.truth[1] if kind == kinds.ADD else msg.truth
            engine.deliver_vllm(kind, request, truth)

        return deliver

    def finish(self) -> None:
        """After the run: silence every API server, then close what is still suspended."""
        for fe in self.frontends:
            fe.closed = True
        for loop in self.loops:
            loop.finish()
        for fe in self.frontends:
            fe.clients.clear()


class _Last:
    """The system of the run in progress (the model's run_workload builds it)."""

    system: RealFrontendSystem | None = None


_LAST = _Last()


def run_workload(workload: Workload, policy: LifecyclePolicy, *, seed: int = 0,
                 plan: DelayPlan | None = None, skip: Iterable[str] = (),
                 retain_trace: bool = True, hash_trace: bool = True,
                 runner: str | None = None) -> RunResult:
    """``racesim.engine_model.run_workload`` with vLLM's own frontend and engine classes.
    The cyclic garbage collector is off during the run, so a collection cannot move an
    abort (an abandoned ``generate()`` aborts when it is finalized)."""
    workload, _profile = resolve_workload(workload)
    enabled = gc.isenabled()
    gc.disable()
    try:
        with _vllm.run_caches():
            return _run_model(workload, policy, seed=seed, plan=plan, skip=skip,
                              retain_trace=retain_trace, hash_trace=hash_trace,
                              system_cls=on_runner(RealFrontendSystem, runner),
                              engine="vllm")
    finally:
        system, _LAST.system = _LAST.system, None
        if system is not None:
            system.finish()
            build.restore_env(system.saved_env)
            if system.crashes:
                raise RuntimeError(f"racesim's frontend adapter failed: {system.crashes[0]}")
        if enabled:
            gc.enable()
