"""vLLM version profiles: the engine-side semantics of one vLLM release, and the width of every
await point in it.

A profile is orthogonal to the lifecycle policy: the policy is the lifecycle code under test,
the profile is the release it runs on. Each behaviour a profile changes names the vLLM file
or PR it follows; the facts are in the vLLM sources each line names (the 0.33.0 wheel was read
for every 0.33 line).

Width of an await point:

- ``live``: time passes there in the real code (a socket hop, a GPU step, a KV transfer, a
  thread that can be descheduled);
- ``yield``: the real code yields to the event loop but no time need pass (``sleep(0)``);
- ``latent``: an ``await`` that never yields in that release (an eager pyzmq send on a socket
  with ``SNDHWM=0``: awaiting its finished future does not reach the event loop). A delay there
  models a code change or backpressure, so a race that needs one is a latent hazard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from racesim.engine_model.config import Workload
from racesim.engine_model.points import POINTS
from racesim.sim.errors import InputError

__all__ = ["Behaviour", "VllmProfile", "PROFILES", "DEFAULT_VLLM", "WIDTHS", "Reach",
           "get_profile", "reach_of", "resolve_workload"]

WIDTHS = ("live", "yield", "latent")

#: The release the model follows unless a scenario or ``--vllm`` says otherwise.
DEFAULT_VLLM = "0.33"


@dataclass(frozen=True, slots=True)
class Behaviour:
    """One line of ``racesim list versions``: what the profile does, and where vLLM does it."""

    text: str
    source: str


@dataclass(frozen=True, slots=True)
class VllmProfile:
    """The engine-side semantics of one vLLM release."""

    name: str
    release: str
    #: an ADD for an ID already in ``Scheduler.requests``: "overwrite" the entry, or "assert"
    #: ("duplicate request id", the engine dies).
    duplicate_add: str
    #: an add for an ID already in ``OutputProcessor.request_states``: "reject" ("already
    #: running"), or "finish-old" (the old stream ends with STREAM_FINISHED, the new request is
    #: not registered, and its ADD is still sent).
    frontend_duplicate: str
    #: an abort by an external ID the frontend does not know: "as-internal" (treated as an
    #: internal ID) or "noop".
    abort_unknown_external: str
    #: the default of ``[engine] async_scheduling`` when a scenario does not set it.
    async_scheduling: bool
    #: the default of ``[engine] eager_aborts``: ABORTs also go to ``aborts_queue``.
    eager_aborts: bool
    #: the busy loop discards ``aborts_queue`` when it goes idle (the input-queue copies remain).
    idle_clears_aborts: bool
    #: how the prefill side holds a finished request's blocks for the decode side: "timeout"
    #: (a fixed TTL) or "lease" (a TTL renewed by the decode side's heartbeats).
    pd_hold: str
    #: the default TTL (timeout) or lease duration in seconds, when a scenario does not set it;
    #: a lease is renewed by heartbeats every lease // 6 s, each extending it to 2/3 lease.
    hold_timeout: float
    #: an aborted request still waiting for remote KV: "free-now", or "free-after-recv" (its
    #: blocks are freed when the read that writes them completes).
    remote_kv_abort: str
    widths: Mapping[str, str]
    behaviours: tuple[Behaviour, ...]

    def width(self, point: str) -> str:
        return self.widths.get(point, "live")


# Every required point is listed in both profiles (a test checks the catalogue is covered).
_WIDTHS = {
    "client.send": "live",
    "frontend.add_request:before_send": "latent",
    "frontend.abort:after_pop": "latent",
    "frontend.output_handler:between_chunks": "yield",
    "frontend.output_handler:before_abort_send": "latent",
    "ipc.input:transit": "live",
    "ipc.output:transit": "live",
    "engine.input:preprocess": "live",
    "engine.step:execute": "live",
    "engine.step:update_from_output": "live",
    "pd.proxy:after_prefill": "live",
    "pd.kv:read": "live",
    "pd.kv:notify": "live",
}

_WIDTH_SOURCES = Behaviour(
    "frontend.abort:after_pop, frontend.add_request:before_send and "
    "frontend.output_handler:before_abort_send are latent: the ADD/ABORT send is an eager pyzmq "
    "send (ROUTER, SNDHWM=0) whose awaited future is already done",
    "0.33 v1/engine/core_client.py:1281-1300 (AsyncMPClient._send_input_message), "
    "utils/network_utils.py:376 (SNDHWM=0)")

PROFILES: dict[str, VllmProfile] = {
    "0.8": VllmProfile(
        name="0.8",
        release="vLLM 0.8 (March 2025, the code PR #15326 was written against); P/D as of "
                "#20139/#25897, which came later but is kept so old counterexamples replay",
        duplicate_add="overwrite",
        frontend_duplicate="reject",
        abort_unknown_external="as-internal",
        async_scheduling=False,
        eager_aborts=False,
        idle_clears_aborts=False,
        pd_hold="timeout",
        hold_timeout=480.0,
        remote_kv_abort="free-now",
        widths=_WIDTHS,
        behaviours=(
            Behaviour("Scheduler.add_request overwrites requests[id] for a live ID; the old "
                      "object keeps running", "v1/core/sched/scheduler.py at f90d34b"),
            Behaviour("OutputProcessor.add_request raises 'Request id ... already running' for "
                      "an ID in its own request_states", "v1/engine/output_processor.py"),
            Behaviour("synchronous scheduling by default", "before #27614"),
            Behaviour("one input queue: an ABORT is applied only between steps",
                      "v1/engine/core.py before #29987"),
            Behaviour("P/D: the prefill side holds a finished request's blocks for a fixed "
                      "480 s timeout", "nixl_connector.py, #20139 and #25897"),
            _WIDTH_SOURCES,
        ),
    ),
    "0.33": VllmProfile(
        name="0.33",
        release="vLLM 0.33.0 (2026-11, the newest release)",
        duplicate_add="assert",
        frontend_duplicate="finish-old",
        abort_unknown_external="noop",
        async_scheduling=True,
        eager_aborts=True,
        idle_clears_aborts=True,
        pd_hold="lease",
        hold_timeout=30.0,
        remote_kv_abort="free-after-recv",
        widths=_WIDTHS,
        behaviours=(
            Behaviour("Scheduler.add_request asserts 'duplicate request id' for an ID already in "
                      "requests (not a streaming session): AssertionError, the engine dies",
                      "v1/core/sched/scheduler.py:2931-2936, v1/engine/core.py:1582-1587 "
                      "(ENGINE_DEAD; unless fault tolerance is enabled)"),
            Behaviour("OutputProcessor.add_request for an internal ID already present treats it "
                      "as a streaming update: the old stream ends with STREAM_FINISHED, the new "
                      "request is not registered, and AsyncLLM still sends its ADD",
                      "v1/engine/output_processor.py:663-713, v1/engine/async_llm.py:567-585"),
            Behaviour("an abort naming an unknown external ID does nothing",
                      "v1/engine/output_processor.py:627 (external_req_ids.pop(id, []))"),
            Behaviour("async scheduling is on by default (two batches in flight)",
                      "#27614; config/vllm.py:1685-1719"),
            Behaviour("an ABORT goes to both aborts_queue (applied inside step(), before "
                      "update_from_output) and input_queue; aborts_queue is cleared on every "
                      "idle pass of the busy loop",
                      "v1/engine/core.py:690, 792, 824-831, 1650-1666, 2030-2040 (#29987)"),
            Behaviour("P/D: the prefill side holds blocks on a 30 s lease; the decode side's "
                      "scheduler sends heartbeats every lease//6 s from its add until the blocks "
                      "arrive (the first one per prefill engine only starts the handshake), "
                      "each extending the lease to now + 2/3 lease",
                      "kv_connector/v1/nixl/base_scheduler.py:82-88, 513-518; "
                      "nixl/base_worker.py:627-631, 3352-3399 (#41383)"),
            Behaviour("an aborted request still waiting for remote KV keeps its blocks until "
                      "the read completes", "v1/core/sched/scheduler.py:3017-3025"),
            _WIDTH_SOURCES,
        ),
    ),
}


def get_profile(name: str | None) -> VllmProfile:
    """The profile called ``name`` (None: the default), or an InputError naming the known ones."""
    key = DEFAULT_VLLM if name is None else name
    profile = PROFILES.get(key)
    if profile is None:
        raise InputError(f"unknown vLLM version {key!r} (known: {', '.join(PROFILES)})")
    return profile


@dataclass(frozen=True, slots=True)
class Reach:
    """Whether a violation can happen in vLLM as released (``live``), or needs a delay at an
    await that never yields there (``latent``, naming those points)."""

    reach: str
    needs: tuple[str, ...] = ()

    def describe(self, vllm: str) -> str:
        if self.reach == "live":
            return f"live race: reachable in vLLM {vllm} as released"
        return (f"latent hazard: needs a delay at {', '.join(self.needs)}, which does not yield "
                f"in vLLM {vllm}")


def reach_of(profile: VllmProfile, delays: Iterable[tuple[str, float]]) -> Reach:
    """The reach of a run that took ``delays`` ((point, seconds) pairs, the scenario's fixed
    delays included): latent when any positive delay sits at a latent point."""
    needs: dict[str, None] = {}
    for point, seconds in delays:
        if seconds > 0 and profile.width(point) == "latent":
            needs.setdefault(point, None)
    return Reach("latent", tuple(needs)) if needs else Reach("live")


def _check_catalogue() -> None:
    for profile in PROFILES.values():
        for p in POINTS:
            if profile.widths.get(p.name) not in WIDTHS:
                raise AssertionError(f"profile {profile.name}: no width for {p.name}")


_check_catalogue()


def resolve_workload(workload: Workload) -> tuple[Workload, VllmProfile]:
    """The workload with every "the profile's default" (None) setting filled in from its
    profile, and that profile."""
    profile = get_profile(workload.engine.vllm)
    engine = workload.engine
    engine = replace(
        engine, vllm=profile.name,
        async_scheduling=(profile.async_scheduling if engine.async_scheduling is None
                          else engine.async_scheduling),
        eager_aborts=profile.eager_aborts if engine.eager_aborts is None else engine.eager_aborts)
    pd = workload.pd
    if pd.hold_timeout is None:
        pd = replace(pd, hold_timeout=profile.hold_timeout)
    return replace(workload, engine=engine, pd=pd), profile
