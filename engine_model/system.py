"""Build the modelled system from a workload and a policy, run it, and collect the result."""

from __future__ import annotations

import gc
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

import simpy

from racesim.engine_model.api_server import ApiServer
from racesim.engine_model.checker import Checker, Violation
from racesim.engine_model.client import Client, Gateway
from racesim.engine_model.config import Workload
from racesim.engine_model.data_parallel import DPCoordinator, DPLoadBalancer
from racesim.engine_model.engine_core import EngineCore
from racesim.engine_model.frontend.async_llm import AsyncLLM
from racesim.engine_model.frontend.state import FrontendState
from racesim.engine_model.ipc import Channel
from racesim.engine_model.pd_proxy import Proxy
from racesim.engine_model.points import POINTS
from racesim.engine_model.policies import LifecyclePolicy
from racesim.engine_model.topology import ChannelNode, EngineNode, FrontendNode, Topology
from racesim.engine_model.versions import (
    Reach,
    VllmProfile,
    get_profile,
    model_gap,
    reach_of,
    resolve_workload,
    unverified_note,
)
from racesim.sim.errors import InputError
from racesim.sim.points import Decision, DelayPlan
from racesim.sim.trace import TraceEvent
from racesim.sim.world import World

__all__ = ["System", "RunResult", "RequestOutcome", "run_workload"]

_YIELDING = frozenset(p.name for p in POINTS if p.always_yields)
_GC_GEN0 = 20_000


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What one scripted client saw, in scenario order (the ``requests`` JSON field)."""

    id: str
    frontend: int
    tokens: int
    finish_reason: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "frontend": self.frontend, "tokens": self.tokens,
                "finish_reason": self.finish_reason}


@dataclass(frozen=True, slots=True)
class RunResult:
    """One run's verdict and evidence. ``trace`` is empty when the run did not retain it."""

    seed: int
    policy: str
    trace_hash: str
    events: int
    sim_time: float
    schedule: tuple[Decision, ...]
    violations: tuple[Violation, ...]
    requests: tuple[RequestOutcome, ...]
    occurrences: dict[str, int]
    trace: tuple[TraceEvent, ...]
    #: simpy events the run processed (``env.step`` calls): the kernel's work, for the bench.
    steps: int = 0
    #: the vLLM profile the run followed.
    vllm: str = ""
    #: the simulated time at which each schedule decision was taken (parallel to ``schedule``).
    decision_times: tuple[float, ...] = ()
    #: the positive fixed delays of the scenario's environment (``[delays]``), as (point, s).
    fixed_delays: tuple[tuple[str, float], ...] = ()
    #: what each component of the run was (engines, frontends, channels, clients).
    topology: Topology | None = None
    #: the backend that ran: "model" (this package) or "vllm" (vLLM's own engine classes).
    engine: str = "model"
    #: the ``(point, occurrence)`` passes whose width was "yield" in this run although their
    #: point's is not (a stop-string ABORT after the sleep(0) between output chunks).
    widened: tuple[tuple[str, int], ...] = ()
    #: the invariants the run evaluated with a live incarnation (``Checker.evaluated``).
    evaluated: tuple[str, ...] = ()
    #: whose frontend ran: "model" (racesim's AsyncLLM) or "vllm" (the release's own AsyncLLM,
    #: on the vllm backend); ``frontend_note`` says why the model's ran on the vllm backend
    #: ("" when vLLM's ran, or the user asked for the model's).
    frontend: str = "model"
    frontend_note: str = ""
    #: "model" when the vllm backend stepped racesim's model of the runner because the user
    #: asked for it (``RACESIM_VLLM_RUNNER=model``); "" otherwise
    runner: str = ""

    def reach(self, violation: Violation | None = None) -> Reach:
        """Live or latent: judged from the delays taken up to the violation (all of them when
        ``violation`` is None), the scenario's fixed delays included."""
        profile = get_profile(self.vllm or None)
        until = violation.time if violation is not None else None
        widened = frozenset(self.widened)
        delays = [(d.point, d.delay) for d, t in zip(self.schedule, self.decision_times,
                                                     strict=True)
                  if (until is None or t <= until)
                  and (not widened or (d.point, d.occurrence) not in widened)]
        return reach_of(profile, [*self.fixed_delays, *delays])

    @property
    def unverified(self) -> str:
        """One line when this run's verdict is unverified on its profile (P/D on 0.8), else
        ""."""
        pd = self.topology is not None and any(e.role == "prefill" for e in self.topology.engines)
        return unverified_note(self.vllm, "pd" if pd else "")

    def reach_text(self) -> str:
        """The reach of a race, as run, replay and the HTML report say it."""
        text = self.reach().describe(self.vllm)
        note = self.unverified
        return f"{text} ({note})" if note else text

    @property
    def violated(self) -> tuple[str, ...]:
        """Names of the violated invariants, in the order they were first detected."""
        seen: dict[str, None] = {}
        for v in self.violations:
            seen.setdefault(v.invariant, None)
        return tuple(seen)


class System:
    """The whole modelled deployment: clients, API servers, sockets, engines (and a proxy)."""

    def __init__(self, world: World, workload: Workload, policy: LifecyclePolicy,
                 profile: VllmProfile | None = None) -> None:
        if profile is None:
            workload, profile = resolve_workload(workload)
        self.world = world
        self.workload = workload
        self.policy = policy
        self.profile = profile
        self._inc = 0
        self.engines: list[EngineCore] = []
        self.frontends: list[AsyncLLM] = []
        self.clients: list[Client] = []
        self._roles: dict[str, str] = {}
        self._channels: list[ChannelNode] = []
        proxies: list[str] = []
        if workload.topology == "pd":
            pd = workload.pd
            push = pd.connector in ("nixl-push", "mooncake")
            prefill = self.new_pd_engine(0, "prefill")
            decode = self.new_pd_engine(1, "decode")
            if pd.bidirectional_kv_xfer and decode.connector is not None:
                decode.connector.decoder_ttl = pd.decoder_kv_blocks_ttl
            self.engines = [prefill, decode]
            self._roles = {"prefill": "prefill", "decode": "decode"}
            decode.notify_channels[0] = self._channel("nixl", decode.name, prefill.name,
                                                      "pd.kv:notify", prefill.deliver_kv_notice)
            if push:
                prefill.push_channels[1] = self._channel("nixl", prefill.name, decode.name,
                                                         "pd.kv:notify", decode.deliver_push_done)
            n = workload.frontends
            p_fes = [self._frontend(i, f"P.frontend{i}", prefill) for i in range(n)]
            d_fes = [self._frontend(i, f"D.frontend{i}", decode) for i in range(n)]
            self.frontends = p_fes + d_fes
            proxy_list = [Proxy(world, i, p_fes[spec.frontend], d_fes[spec.frontend], workload.pd)
                          for i, spec in enumerate(workload.requests)]
            proxies = [p.name for p in proxy_list]
            gateways: list[Gateway] = list(proxy_list)
        elif workload.engine.dp_size > 1:
            self._data_parallel(workload.engine.dp_size)
            gateways = [self.frontends[spec.frontend] for spec in workload.requests]
        else:
            engine = self.new_engine(0, "engine")
            self.engines = [engine]
            self.frontends = [self._frontend(i, f"frontend{i}", engine)
                              for i in range(workload.frontends)]
            gateways = [self.frontends[spec.frontend] for spec in workload.requests]
        connect_at = workload.engine.connect_at
        if connect_at is not None:
            self._gate_inputs(connect_at)
        #: the HTTP layer of each API server (single engine and DP topologies)
        self.api_servers: list[ApiServer] = (
            [] if workload.topology == "pd" else [ApiServer(world, fe) for fe in self.frontends])
        for i, spec in enumerate(workload.requests):
            self.clients.append(Client(
                world, i, self.next_inc(), spec, gateways[i],
                self.api_servers[spec.frontend] if self.api_servers else None))
        if workload.engine.pause_at is not None:
            world.env.process(self._pause_and_resume())
        if workload.engine.reset_prefix_cache_at is not None:  # vLLM's engine only (model_gap)
            world.env.process(self._reset_prefix_cache(workload.engine.reset_prefix_cache_at))
        if workload.frontend.abort_all_at is not None and self.api_servers:
            world.env.process(self._router_abort_all(workload.frontend.abort_all_at))
        #: what each component is: the checker and the reports read this, never the names.
        self.topology = self._topology(proxies)

    def _topology(self, proxies: list[str]) -> Topology:
        roles = self._roles
        dp = len(self.engines) > 1 and not roles
        frontends = []
        for fe in self.frontends:
            engine = self.engines[fe.engine]
            frontends.append(FrontendNode(
                fe.name, fe.index, fe.engine, roles.get(engine.name, ""),
                fe.input_channel.name if fe.input_channel is not None else "",
                engine.output_channels[fe.index].name))
        return Topology(
            tuple(EngineNode(e.name, e.index, roles.get(e.name, ""), e.index if dp else 0)
                  for e in self.engines),
            tuple(frontends), tuple(self._channels), tuple(c.name for c in self.clients),
            tuple(proxies))

    def _channel(self, kind: str, src: str, dst: str, point: str,
                 deliver: Callable[[Any], None]) -> Channel:
        """A socket from ``src`` to ``dst`` (component groups), recorded in the topology."""
        name = f"{kind}:{src}->{dst}"
        self._channels.append(ChannelNode(name, kind, src, dst))
        return Channel(self.world, name, point, self.workload.ipc.latency, deliver)

    def new_engine(self, index: int, name: str) -> EngineCore:
        """The engine of a single-engine topology (a backend swaps its engine-side state here)."""
        return EngineCore(self.world, index, name, self.workload.engine, self.policy,
                          self.profile)

    def new_pd_engine(self, index: int, role: str) -> EngineCore:
        """The prefill (index 0) or decode (index 1) engine of P/D, with its KV connector (a
        backend builds its own here)."""
        pd = self.workload.pd
        # In push mode and with Mooncake P drives the transfer (a WRITE), so P has the
        # transfer time; in pull mode D reads.
        push = pd.connector in ("nixl-push", "mooncake")
        return EngineCore(self.world, index, role, self.workload.engine, self.policy,
                          self.profile, hold_timeout=pd.hold_timeout,
                          transfer_time=pd.transfer_time if role == "decode" or push else 0.0,
                          kv_connector=pd.connector)

    def new_output_processor(self, index: int, name: str,
                             engine: Any) -> FrontendState | None:
        """Frontend ``name``'s request state; None: the model's OutputProcessor (a backend
        swaps in its own here)."""
        return None

    def next_inc(self) -> int:
        """A fresh ground-truth number (incarnations, client uids, abort tags share one counter)."""
        self._inc += 1
        return self._inc

    def _frontend(self, index: int, name: str, engine: EngineCore) -> AsyncLLM:
        fe = AsyncLLM(self.world, index, name, engine.index, self.policy, self.workload.frontend,
                      self.next_inc, self.profile, self.new_output_processor(index, name, engine))
        fe.input_channel = self._channel("ipc", name, engine.name, "ipc.input:transit",
                                         engine.deliver)
        engine.output_channels[index] = self._channel("ipc", engine.name, name,
                                                      "ipc.output:transit", fe.deliver)
        return fe

    def _data_parallel(self, size: int) -> None:
        """``size`` engines ("dp0", ...), every API server talking to each through its own
        load balancer; outputs come back on the channel of the request's client_index.

        Each rank is built by the backend's ``new_engine`` and joined by ``dp_rank``: a
        dense model's ranks are independent EngineCoreProcs (vllm/v1/engine/core.py:1546-1555)
        whose only DP state is the internal load balancing of core.py:1219-1238."""
        world, workload = self.world, self.workload
        latency = workload.ipc.latency
        self.engines = [self.new_engine(e, f"dp{e}") for e in range(size)]
        count = workload.frontends
        for i in range(count):
            name = f"frontend{i}"
            fe = AsyncLLM(world, i, name, 0, self.policy, workload.frontend, self.next_inc,
                          self.profile, self.new_output_processor(i, name, self.engines[0]))
            fe.engines = tuple(range(size))
            fe.dp = DPLoadBalancer(world, name, size, i, count)
            fe.output_processor.dp = True
            for engine in self.engines:
                fe.input_channels[engine.index] = self._channel(
                    "ipc", name, engine.name, "ipc.input:transit", engine.deliver)
                engine.output_channels[i] = self._channel(
                    "ipc", engine.name, name, "ipc.output:transit", fe.deliver)
            self.frontends.append(fe)
        engines = self.engines
        coordinator = DPCoordinator(
            world, lambda: [self.dp_load(e) for e in engines],
            [fe.dp for fe in self.frontends if fe.dp is not None], latency)
        for engine in engines:
            self.dp_rank(engine, coordinator)

    def dp_rank(self, engine: Any, coordinator: DPCoordinator) -> None:
        """Make ``engine`` a DP rank: its outputs carry each client's finished IDs
        (``include_finished_set``) and each step tells the coordinator its counts may have
        changed (a backend joins its own engine here)."""
        engine.outputs.finished_by_client = {}
        engine.outputs.coordinator = coordinator

    def dp_load(self, engine: Any) -> tuple[int, int, float]:
        """What a rank publishes to the coordinator: waiting, running, KV cache usage
        (``_maybe_publish_request_counts``, core.py:1634-1645; coordinator.py:404-405)."""
        kv = engine.kv
        return (len(engine.scheduler.waiting), len(engine.scheduler.running),
                1.0 - kv.num_free_blocks / kv.num_blocks)

    def _pause_and_resume(self) -> Generator[simpy.Event, Any, None]:
        """API server 0 calls pause_generation, then resume_generation (async_llm.py:989-1028)."""
        env = self.world.env
        config = self.workload.engine
        assert config.pause_at is not None
        yield env.timeout(config.pause_at)
        self.frontends[0].pause_generation("pause_generation", config.pause_mode or "abort",
                                           bool(config.pause_clear_cache))
        if config.resume_at is not None:
            yield env.timeout(config.resume_at - env.now)
            self.frontends[0].pause_generation("resume_scheduler")

    def _reset_prefix_cache(self, when: float) -> Generator[simpy.Event, Any, None]:
        """API server 0 calls reset_prefix_cache(reset_running_requests=True)."""
        yield self.world.env.timeout(when)
        self.frontends[0].pause_generation("reset_prefix_cache", "", True)

    def _gate_inputs(self, connect_at: float) -> None:
        """Every engine starts listening at ``connect_at``: until then the API servers'
        ROUTER sockets drop what they send it (no ROUTER_MANDATORY: no error, no block;
        vLLM 0.33 utils/network_utils.py:363-377, v1/engine/core_client.py:1293-1300)."""
        env = self.world.env

        def connected() -> bool:
            return bool(env.now >= connect_at)

        for fe in self.frontends:
            channels = [fe.input_channel, *fe.input_channels.values()]
            for channel in channels:
                if channel is not None:
                    channel.connected = connected

    def _router_abort_all(self, at: float) -> Generator[simpy.Event, Any, None]:
        """The RL router's abort-all on API server 0 (rl/online/api_router.py:120-132)."""
        yield self.world.env.timeout(at)
        yield from self.api_servers[0].router_abort_all()

    def outcomes(self) -> tuple[RequestOutcome, ...]:
        return tuple(RequestOutcome(c.spec.id, c.spec.frontend, c.tokens, c.finish_reason)
                     for c in self.clients)


def run_workload(workload: Workload, policy: LifecyclePolicy, *, seed: int = 0,
                 plan: DelayPlan | None = None, skip: Iterable[str] = (),
                 retain_trace: bool = True, hash_trace: bool = True,
                 system_cls: type[System] | None = None, engine: str = "model") -> RunResult:
    """Simulate ``workload`` under ``policy`` until quiescence or the horizon, and check it.

    ``hash_trace=False`` leaves ``trace_hash`` empty (exploration's inner runs, see
    :class:`racesim.sim.trace.TraceRecorder`). ``system_cls`` and ``engine`` are a backend's:
    the System subclass that builds its engines, and the name its results carry."""
    if system_cls is None and (gap := model_gap(workload)) is not None:
        raise InputError(gap)
    world = World(seed, plan, retain_trace=retain_trace, hash_trace=hash_trace,
                  always_yield=_YIELDING)
    checker = Checker(world, frozenset(skip))
    workload, profile = resolve_workload(workload)
    # looked up at call time: the tests' fixture swaps the module's System
    system = (System if system_cls is None else system_cls)(world, workload, policy, profile)
    checker.attach(system)
    env = world.env
    step, peek, horizon = env.step, env.peek, workload.horizon
    steps = 0
    # A run makes many short-lived reference cycles (a process and the event it waits on): a
    # larger youngest GC generation collects them in fewer passes. Restored after the run.
    threshold = gc.get_threshold()
    if 0 < threshold[0] < _GC_GEN0:
        gc.set_threshold(_GC_GEN0, *threshold[1:])
    try:
        while peek() <= horizon:  # until quiescence (empty queue) or the horizon
            step()
            steps += 1
    finally:
        gc.set_threshold(*threshold)
    violations = checker.finish()
    fixed = tuple((p, d) for p, _k, d in world.plan.environment() if d > 0)
    return RunResult(seed, policy.name, world.trace.hexdigest(), world.trace.count,
                     float(world.env.now), world.schedule, violations, system.outcomes(),
                     world.occurrences, world.trace.events, steps, profile.name,
                     world.decision_times, fixed, system.topology, engine, world.widened,
                     checker.evaluated())
