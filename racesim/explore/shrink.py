"""Shrink a failing schedule: fewest delays, then fewest requests, then smallest delays.

"Simpler" means, in this order: no delay at an await point that never yields in the scenario's
vLLM profile (a live counterexample is preferred to a latent one); fewer non-default delays;
fewer requests in the scenario (the counterexample embeds the smaller scenario); smaller delay
values. Every candidate is judged by
re-running it, so the result is a real failing run, never an extrapolation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from racesim.engine_model.versions import get_profile
from racesim.runner import RunSpec
from racesim.scenarios import Scenario
from racesim.sim import Decision

__all__ = ["ShrinkResult", "shrink"]


@dataclass(frozen=True, slots=True)
class ShrinkResult:
    """The smallest failing scenario and schedule a shrink found."""

    scenario: Scenario
    schedule: tuple[Decision, ...]
    runs: int
    exhausted: bool  # stopped by the run budget rather than by a fixpoint


Pred = Callable[[Scenario, Sequence[Decision]], bool]


class _Budget(Exception):
    pass


def shrink(spec: RunSpec, schedule: Sequence[Decision], target: frozenset[str], *,
           max_runs: int = 400, judge: Pred | None = None) -> ShrinkResult:
    """Shrink ``schedule`` (and the requests of the spec's scenario) while some ``target``
    invariant fails; ``judge`` (a scenario and schedule still fail) replaces that test
    (``racesim diff``: fails on the candidate and not on the baseline, in other processes)."""
    runs = 0
    scenario = spec.scenario

    def fails(scen: Scenario, sched: Sequence[Decision]) -> bool:
        nonlocal runs
        if runs >= max_runs:
            raise _Budget
        runs += 1
        if judge is not None:
            return judge(scen, sched)
        result = spec.with_scenario(scen).run(schedule=tuple(sched), retain_trace=False,
                                              hash_trace=False)
        return any(v in target for v in result.violated)

    best_scen, best = scenario, tuple(sorted(schedule))
    exhausted = False
    profile = get_profile(scenario.vllm)
    try:
        live = tuple(d for d in best if profile.width(d.point) != "latent")
        if live != best and fails(best_scen, live):
            best = live  # the race is live: the latent delays were not needed
        best = _fewest_delays(best_scen, best, fails)
        best_scen = _fewest_requests(best_scen, best, fails)
        best = _smallest_delays(best_scen, best, fails)
    except _Budget:
        exhausted = True
    return ShrinkResult(best_scen, best, runs, exhausted)


def _fewest_delays(scen: Scenario, sched: tuple[Decision, ...], fails: Pred,
                   ) -> tuple[Decision, ...]:
    if not sched:
        return sched
    if fails(scen, ()):
        return ()
    for d in sched:  # a single delay is the best answer there is
        if fails(scen, (d,)):
            return (d,)
    # ddmin-style: drop chunks, halving the chunk size down to single decisions.
    chunk = max(1, len(sched) // 2)
    while True:
        i = 0
        while i < len(sched):
            candidate = sched[:i] + sched[i + chunk:]
            if candidate and fails(scen, candidate):
                sched = candidate
            else:
                i += chunk
        if chunk == 1:
            break
        chunk = max(1, chunk // 2)
    return sched


def _fewest_requests(scen: Scenario, sched: tuple[Decision, ...], fails: Pred) -> Scenario:
    i = len(scen.workload.requests) - 1
    while i >= 0 and len(scen.workload.requests) > 1:
        keep = tuple(j for j in range(len(scen.workload.requests)) if j != i)
        smaller = replace(scen, workload=scen.workload.without_requests(keep))
        if fails(smaller, sched):
            scen = smaller
        i -= 1
    return scen


def _smallest_delays(scen: Scenario, sched: tuple[Decision, ...], fails: Pred,
                     ) -> tuple[Decision, ...]:
    for i, d in enumerate(sched):
        lo, hi = 0.0, d.delay
        for _ in range(6):  # bisect toward the smallest delay that still fails
            mid = round((lo + hi) / 2, 6)
            if mid <= lo or mid >= hi:
                break
            trial = (*sched[:i], Decision(d.point, d.occurrence, mid), *sched[i + 1:])
            if fails(scen, trial):
                hi = mid
                sched = trial
            else:
                lo = mid
    return sched
