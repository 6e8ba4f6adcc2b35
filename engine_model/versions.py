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

from collections.abc import Iterable
from dataclasses import dataclass, replace

from racesim.engine_model.config import EngineConfig, Workload
from racesim.engine_model.points import POINTS
from racesim.engine_model.profile_tables import WRITTEN_OUT
from racesim.engine_model.profile_types import Behaviour, VllmProfile
from racesim.sim.errors import InputError

__all__ = ["MID_STEP_WIDTHS", "Behaviour", "VllmProfile", "PROFILES", "DEFAULT_VLLM", "WIDTHS",
           "Reach", "RELEASE_OF", "ALIASES", "profile_name", "get_profile", "profile_gap",
           "model_gap", "reach_of", "resolve_workload", "unverified_note"]

WIDTHS = ("live", "yield", "latent")

#: The release the model follows unless a scenario or ``--vllm`` says otherwise.
DEFAULT_VLLM = "0.33"

#: Points whose width in a step with more than ``output_chunk_size`` outputs is another one on
#: every output chunk but the last: the output handler processes a chunk, sleeps(0) when more
#: chunks follow, then sends that chunk's stop-string ABORTs (0.33 v1/engine/async_llm.py:
#: 891-922, envs.py:1476; the same in 0.8.5's async_llm.py:363-386). A run records such passes
#: (``World.widen_next``) and its reach does not count their delays as latent.
MID_STEP_WIDTHS: dict[str, str] = {"frontend.output_handler:before_abort_send": "yield"}

#: 0.8 and 0.33 (profile_tables.py), then the releases between them in release order.
PROFILES: dict[str, VllmProfile] = dict(WRITTEN_OUT)


def _add_release_profiles() -> None:
    """Insert the releases between 0.8 and 0.33 (release_profiles.py), in release order."""
    from racesim.engine_model.release_profiles import RELEASES, release_profiles

    every = {**PROFILES, **release_profiles(PROFILES["0.33"])}
    PROFILES.clear()
    PROFILES.update((name, every[name]) for name in RELEASES if name in every)
    RELEASE_OF.update({name: release for name, release in RELEASES.items() if release})
    ALIASES.update({release: name for name, release in RELEASES.items() if release})


#: profile name -> the vLLM release (``major.minor.patch``) it follows
RELEASE_OF: dict[str, str] = {}
#: a full release name ("0.20.0") -> its profile's name ("0.20")
ALIASES: dict[str, str] = {}
_add_release_profiles()


def profile_name(name: str) -> str | None:
    """The profile ``name`` means: a profile name ("0.20"), or its release ("0.20.0")."""
    return name if name in PROFILES else ALIASES.get(name)


def get_profile(name: str | None) -> VllmProfile:
    """The profile called ``name`` (None: the default; a full release name such as "0.20.0"
    means its profile), or an InputError naming the known ones."""
    key = DEFAULT_VLLM if name is None else name
    profile = PROFILES.get(key)
    if profile is None and key in ALIASES:
        profile = PROFILES[ALIASES[key]]
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


def unverified_note(vllm: str, topology: str) -> str:
    """One line saying that a verdict of a ``topology`` run on profile ``vllm`` is unverified
    (the profile models code that release does not ship), or "" when it is not."""
    reason = get_profile(vllm or None).pd_unverified if topology == "pd" else ""
    return f"unverified on vLLM {vllm}: {reason}" if reason else ""


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


def model_gap(workload: Workload) -> str | None:
    """Why the model cannot run ``workload`` (one line), or None, where the vllm backend can.
    The model has no speculative decoding (no draft tokens, no rejections; the vllm backend
    runs vLLM's own, racesim.engine_vllm.runner.spec), no cache clearing at a pause, and
    follows 0.33's pause only (0.20's runs on vLLM's own code)."""
    if workload.engine.pause_at is not None and \
            "pause-vllm-only" in get_profile(workload.engine.vllm).features:
        return (f"engine.pause_at on profile {get_profile(workload.engine.vllm).name!r} runs on "
                f"the vllm backend only (the model's pause follows 0.33's); run it with "
                f"--engine vllm")
    if workload.engine.num_speculative_tokens:
        return ("engine.num_speculative_tokens runs on the vllm backend only (the model has no "
                "speculative decoding); run it with --engine vllm")
    if workload.engine.pause_clear_cache:
        return ("engine.pause_clear_cache = true runs on the vllm backend only (the model's "
                "pause neither preempts running requests nor empties the prefix cache); run "
                "it with --engine vllm")
    if workload.engine.reset_prefix_cache_at is not None:
        return ("engine.reset_prefix_cache_at runs on the vllm backend only (the model has no "
                "reset_prefix_cache); run it with --engine vllm")
    return None


#: The releases whose config refuses async scheduling with pipeline parallelism, and where.
#: 0.20 allows it (its batch queue is then pp_size deep); 0.8 and 0.9 have no async
#: scheduling in vLLM (the model's profiles may run it: their queue is pp_size deep).
_PP_ASYNC_REFUSED = {
    "0.10": "0.10.1.1 engine/arg_utils.py:1216-1218",
    "0.11": "0.11.0 engine/arg_utils.py:1295-1297",
    "0.14": "0.14.0 config/vllm.py:564-567",
    "0.33": "0.33.0 config/vllm.py:1665-1666, 1676-1680: not supported by the V1 model runner",
}


def _async_scheduling(profile: VllmProfile, engine: EngineConfig) -> bool:
    """The scenario's async scheduling, or its release's default: where the release refuses it
    with pipeline parallelism, an unset one is turned off with a warning and the engine runs
    (0.14.0 config/vllm.py:587-595, 0.33.0 config/vllm.py:1710-1716); only an explicit one is
    refused (profile_gap)."""
    if engine.async_scheduling is not None:
        return engine.async_scheduling
    if (engine.pipeline_parallel_size or 1) > 1 and profile.name in _PP_ASYNC_REFUSED:
        return False
    return profile.async_scheduling


def profile_gap(workload: Workload) -> str | None:
    """Why ``workload`` cannot run on its profile (an engine feature the profile does not
    model), or None."""
    profile = get_profile(workload.engine.vllm)
    engine = workload.engine
    if (engine.pipeline_parallel_size or 1) > 1 and profile.name in _PP_ASYNC_REFUSED and (
            _async_scheduling(profile, engine)):
        return (f"engine.pipeline_parallel_size > 1 with async scheduling: vLLM "
                f"{profile.name} refuses it ({_PP_ASYNC_REFUSED[profile.name]})")
    used = []
    if engine.dp_size > 1:
        used.append(("dp", "engine.data_parallel_size > 1"))
    if engine.pause_at is not None:
        used.append(("pause", "engine.pause_at"))
    if engine.fault_tolerance:
        used.append(("fault-tolerance", "engine.fault_tolerance"))
    preprocess = kv_load = chunks = encode = api = False
    for r in workload.requests:  # one pass: this runs before every run of an exploration
        preprocess = preprocess or r.preprocess_error
        kv_load = kv_load or r.kv_load_fails
        chunks = chunks or r.input_chunks > 0
        encode = encode or r.unserializable
        api = api or r.endpoint is not None
    if preprocess:
        used.append(("preprocess-error", "request.preprocess_error"))
    if kv_load:
        used.append(("kv-load-failure", "request.kv_load_fails"))
    if chunks:
        used.append(("streaming-input", "request.input_chunks"))
    if encode:
        used.append(("encode-error", "request.unserializable"))
    if api or workload.frontend.abort_all_at is not None:
        used.append(("api-layer", "request.endpoint"))
    if workload.topology == "pd":
        if workload.pd.connector != "nixl-pull":
            used.append((workload.pd.connector, f"pd.connector = {workload.pd.connector!r}"))
        if workload.pd.proxy == "http":
            used.append(("pd-proxy-http", "pd.proxy = 'http'"))
        if workload.pd.bidirectional_kv_xfer:
            if workload.pd.connector != "nixl-pull":
                # push_scheduler.py:72-75 raises NotImplementedError; Mooncake has no such key
                return (f"pd.bidirectional_kv_xfer needs pd.connector = 'nixl-pull', not "
                        f"{workload.pd.connector!r}")
            used.append(("nixl-bidirectional", "pd.bidirectional_kv_xfer = true"))
    for feature, key in used:
        if feature not in profile.features:
            have = [p.name for p in PROFILES.values() if feature in p.features]
            if not have:
                return f"{key} is not modelled yet (docs/pd-connectors.md)"
            return (f"{key} is modelled on vLLM {', '.join(have)} only, not on profile "
                    f"{profile.name!r}")
    return None


#: VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT's default (vLLM 0.33 envs.py:268, 1904-1906).
MOONCAKE_ABORT_REQUEST_TIMEOUT = 480.0


def resolve_workload(workload: Workload) -> tuple[Workload, VllmProfile]:
    """The workload with every "the profile's default" (None) setting filled in from its
    profile, and that profile."""
    profile = get_profile(workload.engine.vllm)
    engine = workload.engine
    engine = replace(
        engine, vllm=profile.name,
        async_scheduling=_async_scheduling(profile, engine),
        eager_aborts=profile.eager_aborts if engine.eager_aborts is None else engine.eager_aborts,
        prefix_caching=(profile.prefix_caching if engine.prefix_caching is None
                        else engine.prefix_caching))
    gap = profile_gap(workload)
    if gap is not None:
        raise InputError(gap)
    pd = workload.pd
    if pd.hold_timeout is None:
        # Mooncake's hold is VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, 480 s (0.33 envs.py:1904),
        # whatever NIXL's lease is.
        pd = replace(pd, hold_timeout=(MOONCAKE_ABORT_REQUEST_TIMEOUT
                                       if pd.connector == "mooncake" else profile.hold_timeout))
    return replace(workload, engine=engine, pd=pd), profile
