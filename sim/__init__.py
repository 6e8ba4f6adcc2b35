"""racesim's deterministic kernel: World, await points, delay plans, schedules, traces.

It knows nothing about vLLM; ``engine_model`` builds the serving-engine model on top of it.
"""

# First, before any other module of sim or engine_model loads: compiled or source
# (racesim.sim._native).
from racesim.sim._native import NATIVE, build_info  # isort: skip
from racesim.sim.errors import InputError
from racesim.sim.points import (
    AwaitPoint,
    Decider,
    Decision,
    DelayPlan,
    PointCatalogue,
    check_delay,
    parse_point_key,
    plan_entries,
)
from racesim.sim.rng import RngStreams, stable_seed
from racesim.sim.trace import (
    EventRecord,
    TraceEvent,
    TraceRecorder,
    UndeclaredKind,
    canonical_json,
    trace_hash_of,
)
from racesim.sim.world import Delay, World

__all__ = [
    "AwaitPoint",
    "Decider",
    "Decision",
    "Delay",
    "DelayPlan",
    "EventRecord",
    "InputError",
    "NATIVE",
    "PointCatalogue",
    "RngStreams",
    "TraceEvent",
    "TraceRecorder",
    "UndeclaredKind",
    "World",
    "build_info",
    "canonical_json",
    "check_delay",
    "parse_point_key",
    "plan_entries",
    "stable_seed",
    "trace_hash_of",
]
