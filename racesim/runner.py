"""Run one scenario under one policy: the library call behind ``racesim run`` and ``replay``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from racesim.engine_model import RunResult, load_policy, run_workload
from racesim.engine_model.checker import check_invariant_names
from racesim.engine_model.points import POINTS
from racesim.reports.commands import replay_command, run_command
from racesim.scenarios import Scenario
from racesim.sim import Decider, Decision, DelayPlan, InputError, check_delay, parse_point_key

__all__ = ["run_scenario", "parse_delay_option", "replay_command", "run_command", "PlanEntry"]

PlanEntry = tuple[str, int | None, float]


def parse_delay_option(text: str) -> PlanEntry:
    """``POINT=SECONDS`` or ``POINT#K=SECONDS`` from the command line."""
    key, sep, value = text.partition("=")
    if not sep:
        raise InputError(f"--delay {text!r}: expected POINT=SECONDS or POINT#K=SECONDS")
    point, k = parse_point_key(key.strip(), POINTS, f"--delay {text!r}")
    try:
        seconds: object = float(value)
    except ValueError:
        seconds = value
    return point, k, check_delay(seconds, f"--delay {text!r}")


def run_scenario(scenario: Scenario, policy: str, *, options: Mapping[str, str] | None = None,
                 seed: int = 0, witness: bool = False, delays: Iterable[PlanEntry] = (),
                 schedule: Sequence[Decision] | None = None, decider: Decider | None = None,
                 skip: Iterable[str] = (), retain_trace: bool = True,
                 hash_trace: bool = True) -> RunResult:
    """One deterministic run. ``schedule`` replays a recorded run exactly (it wins over all)."""
    skip_set = check_invariant_names(tuple(skip))
    overrides: list[PlanEntry] = []
    if witness:
        overrides.extend(scenario.witness)
    overrides.extend(delays)
    if schedule is not None:
        overrides.extend((d.point, d.occurrence, d.delay) for d in schedule)
    plan = DelayPlan(environment=scenario.delays, overrides=overrides, decider=decider)
    return run_workload(scenario.workload, load_policy(policy, options), seed=seed, plan=plan,
                        skip=skip_set, retain_trace=retain_trace, hash_trace=hash_trace)
