"""Exploration: find a race with no hint, shrink it, and say how much a clean result proves.

Run 0 is the unperturbed baseline. Invariants it already violates are the scenario's standing
violations (metrics-exact under most policies, or a race that needs no delay at all). The
counterexample, and ``first_violation_run``, are the first run that violates something *beyond*
them; both fall back to the baseline itself when nothing else is found. ``violating_runs``
counts every run with any violation (DESIGN.md's contract); ``racing_runs`` counts the runs that
broke a safety or liveness invariant, ``accounting_runs`` those that broke only accounting ones
(``metrics-exact``), so ``violating_runs == racing_runs + accounting_runs``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

from racesim.explore.distinct import DistinctCounter
from racesim.documents import (
    Counterexample,
    free_path,
    release_of_run,
    replaceable,
    violation_dicts,
    write_claimed,
)
from racesim.engine_model import RunResult
from racesim.engine_model.policies import PolicyImportError, policy_spec
from racesim.engine_model.versions import get_profile, reach_of
from racesim.explore.result import ExploreResult, counterexample_path, unshrunk_path
from racesim.explore.parallel import executor, ordered_map
from racesim.reports.verdict import RACE, verdict
from racesim.runner.summary import RunSummary
from racesim.runner import Backend, RunSpec, import_from_cwd
from racesim.scenarios import Scenario
from racesim.explore.shrink import shrink
from racesim.sim import InputError
from racesim.sim.strategies import STRATEGIES, StrategyConfig, make_strategy
from racesim.explore.unreached import unreached_warnings

__all__ = ["ExploreResult", "RunSummary", "explore", "counterexample_path",
           "unshrunk_path"]

Progress = Callable[[int, int, int], None]


_POINT = itemgetter(0)  # Decision.point, read in C


@dataclass(frozen=True, slots=True)
class _Context:
    """Everything a worker needs to reproduce run i (pickled once per batch)."""

    spec: RunSpec
    strategy: str
    config: StrategyConfig
    target: str | None = None
    symptom: str | None = None


def _hits(result: RunResult, target: str | None, symptom: str | None) -> bool:
    """``result`` violates ``target``, and (``symptom``) with that text in a violation's detail
    or vLLM file:line: the same invariant broken another way is another bug."""
    if target is None or target not in result.violated:
        return False
    return symptom is None or any(
        v.invariant == target and (symptom in v.detail or symptom in (v.where or ""))
        for v in result.violations)


def _run_batch(ctx: _Context, runs: Sequence[int]) -> list[RunSummary]:
    strategy = make_strategy(ctx.strategy, ctx.config)
    out = []
    run = ctx.spec.run
    for i in runs:
        r = run(decider=strategy.decider(i), retain_trace=False, hash_trace=False)
        out.append(RunSummary(i, r.trace_hash, r.violated, r.schedule, r.widened,
                              _hits(r, ctx.target, ctx.symptom), r.evaluated))
    return out


def explore(scenario: Scenario, policy: str, *, options: Mapping[str, str] | None = None,
            strategy: str = "random", budget: int = 200, time_limit: float | None = None,
            seed: int = 0, workers: int | None = 1, dask: str | None = None,
            skip: Sequence[str] = (), out_dir: Path | None = None,
            progress: Progress | None = None, shrink_runs: int = 400,
            reach: str = "all", engine: str | Backend = "model", target: str | None = None,
            symptom: str | None = None, stop_at_target: bool = False,
            ids: str | None = None,
            on_run: Callable[[RunSummary], None] | None = None) -> ExploreResult:
    """Explore ``budget`` schedules of ``scenario`` under ``policy`` (run 0 = baseline).

    ``reach="live"`` delays only the await points that are live or yield in the scenario's
    vLLM profile, so whatever it finds can happen in that release as shipped. ``target``
    names an invariant whose first violating run is recorded (``target_run``; with ``symptom``,
    only a violation whose detail or vLLM file:line contains that text counts); with
    ``stop_at_target`` the search ends there (runs arrive in order, so the run is the same
    for any worker count). ``on_run`` sees every run's summary, in run order (``racesim diff``
    keeps the violating schedules to replay them on the other tree)."""
    if reach not in ("all", "live"):
        raise InputError(f"--reach must be 'all' or 'live', got {reach!r}")
    if strategy not in STRATEGIES:
        raise InputError(f"unknown strategy {strategy!r} (known: {', '.join(STRATEGIES)})")
    if budget < 1:
        raise InputError(f"--budget must be >= 1, got {budget}")
    if time_limit is not None and not time_limit > 0:
        raise InputError(f"--time-limit must be > 0 seconds, got {time_limit}")
    import_from_cwd(policy)  # a module:Class in the current folder, as run and matrix find it
    policy_spec(policy)  # fail fast on an unknown policy, before any worker starts
    spec = RunSpec.of(scenario, policy, options=options, seed=seed, skip=skip, engine=engine,
                      ids=ids)
    _ = spec.id_scheme  # refuse --ids for a policy that assigns its own IDs, before any run
    started = time.monotonic()
    res = ExploreResult(spec, strategy, reach=reach,
                        key=_exploration_key(spec, strategy, reach, budget, time_limit),
                        target=target)
    if out_dir is not None:
        res.out_path = free_path(res.first_path(out_dir), res.ours)
    try:
        baseline = spec.run(retain_trace=False)
    except KeyboardInterrupt:  # nothing found yet: say so rather than unwind the caller
        res.interrupted = True
        res.elapsed_s = time.monotonic() - started
        return res
    res.baseline_violations = baseline.violated
    # the scenario's fixed delays apply in every run; the unperturbed one is where a misplaced
    # entry shows (a perturbed run may pass a point more often, but the user meant run 0 too)
    res.warnings.extend(unreached_warnings("[delays]", scenario.delays, baseline.occurrences))
    res.baseline_reach = baseline.reach().reach
    res.frontend = (baseline.frontend, baseline.frontend_note)
    occurrences = baseline.occurrences
    if reach == "live":  # the strategies delay only the points they are given
        profile = get_profile(scenario.vllm)
        occurrences = {p: n for p, n in occurrences.items() if profile.width(p) != "latent"}
    config = StrategyConfig(occurrences=occurrences,
                            scale=scenario.workload.engine.step_time, seed=seed)
    standing = frozenset(baseline.violated)
    traces = DistinctCounter()  # digests, not schedules: bounded memory on long runs
    invariants: dict[str, None] = {}
    evaluated: set[str] = set()
    windows: set[tuple[str, int]] = set()

    def record(s: RunSummary) -> None:
        if on_run is not None:
            on_run(s)
        res.runs += 1
        traces.add(s.schedule)
        evaluated.update(s.evaluated)
        for d in s.schedule:
            windows.add((d.point, d.occurrence))
        for point in dict.fromkeys(map(_POINT, s.schedule)):  # each point once per run
            res.coverage[point] = res.coverage.get(point, 0) + 1
        hit = s.hit and res.target_run is None
        if hit:
            res.target_run, res.target_s = s.run, time.monotonic() - started
        if s.violated:
            res.violating_runs += 1
            if verdict(s.violated) == RACE:
                res.racing_runs += 1
            else:
                res.accounting_runs += 1
            for v in s.violated:
                invariants.setdefault(v, None)
            found = res.found_run
            if hit or (res.target_run is None and (found is None or (
                    _beyond(s, standing) and not _beyond(found, standing)))):
                # the target's first run is the counterexample once there is one
                res.found_run = s
                if out_dir is not None:  # on disk before anything else can fail
                    _save(res, s, None, out_dir)

    record(RunSummary(0, baseline.trace_hash, baseline.violated, (), baseline.widened,
                      _hits(baseline, target, symptom), baseline.evaluated))
    try:
        if stop_at_target and res.target_run is not None:
            budget = 1  # the baseline already shows it
        if strategy == "hypothesis":
            from racesim.explore.hypothesis_search import hypothesis_search
            minimal = hypothesis_search(spec, config, budget - 1, standing, record,
                                        lambda: _over(started, time_limit), progress, out_dir)
            if res.runs < budget and not res.interrupted:
                res.stopped_early = (
                    f"--time-limit {time_limit:g} s reached" if _over(started, time_limit)
                    else "hypothesis stopped once it had found and shrunk a failing schedule"
                    if minimal is not None
                    else "hypothesis ran out of distinct schedules to draw"
                ) + f" after {res.runs} of --budget {budget} runs"
            if minimal is not None and res.found_run is not None:
                # hypothesis's own shrunk example replaces the first one it tripped over
                r = spec.run(delays=minimal, retain_trace=False, hash_trace=False)
                res.found_run = RunSummary(res.found_run.run, "", r.violated, r.schedule,
                                           r.widened)
        else:
            strat = make_strategy(strategy, config)
            res.strategy_info = strat.info()
            size = strat.size()
            total = budget if size is None else min(budget, size)
            res.space = size
            ctx = _Context(spec, strategy, config, target, symptom)
            deadline = None if time_limit is None else started + time_limit
            with executor(workers, dask, time_limit) as ex, _worker_errors(policy, dask):
                for s in ordered_map(_run_batch, ctx, range(1, total), ex, deadline=deadline):
                    record(s)
                    if progress is not None:
                        progress(res.runs, total, res.violating_runs)
                    if stop_at_target and res.target_run is not None:
                        break
                    if _over(started, time_limit):
                        if res.runs < total:
                            res.stopped_early = (f"--time-limit {time_limit:g} s reached after "
                                                 f"{res.runs} of --budget {budget} runs")
                        break
            if res.stopped_early is None and res.runs < total and not res.interrupted:
                res.stopped_early = (f"no results came back from the workers by --time-limit "
                                     f"{time_limit:g} s; stopped after {res.runs} of --budget "
                                     f"{budget} runs")
            if res.stopped_early is None and total < budget and res.runs == total:
                res.stopped_early = (f"the {strategy} strategy has only {total} distinct "
                                     f"schedules (run 0 included) and tried them all, fewer "
                                     f"than --budget {budget}")
    except KeyboardInterrupt:
        res.interrupted = True
    res.reached = reached(baseline.occurrences, occurrences, res.coverage, windows, evaluated,
                          spec.skip)
    res.distinct_traces = len(traces)
    res.distinct_estimated = traces.estimated
    res.invariants = tuple(invariants)
    found = res.found_run
    if found is not None and not res.interrupted:
        try:
            _shrink_found(res, found, standing, shrink_runs, out_dir)
        except KeyboardInterrupt:  # keep the unshrunk file already written
            res.interrupted = True
    res.elapsed_s = time.monotonic() - started
    return res


def _shrink_found(res: ExploreResult, found: RunSummary, standing: frozenset[str],
                  shrink_runs: int, out_dir: Path | None) -> None:
    """Shrink the found run, write ``<stem>.json`` and drop the ``.unshrunk.json`` stand-in."""
    spec = res.spec
    target = frozenset(set(found.violated) - standing) or frozenset(found.violated)
    if res.target is not None and res.target in found.violated:
        target = frozenset({res.target})
    shrunk = shrink(spec, found.schedule, target, max_runs=shrink_runs)
    res.shrink_runs = shrunk.runs
    final = spec.with_scenario(shrunk.scenario).run(schedule=shrunk.schedule)
    cx = _counterexample(res, shrunk.scenario, final, len(found.schedule), found.run)
    if out_dir is not None:
        first = res.first_path(out_dir)
        path = write_claimed(res.out_path or first, cx, res.ours, first=first)
        res.out_path = path
        for stale in (res.stand_in, unshrunk_path(path)):  # ours, and now superseded
            if stale is not None and stale.exists() and replaceable(stale, res.ours):
                stale.unlink(missing_ok=True)
        res.counterexample_path = str(path)
    res.final_run, res.counterexample = final, cx


@contextmanager
def _worker_errors(policy: str, dask: str | None) -> Iterator[None]:
    """A policy this process imported but a Dask worker could not: say where it failed and how
    to ship the module (the workers import it by name, from their own sys.path)."""
    try:
        yield
    except PolicyImportError as exc:
        if not dask:
            raise
        module = policy.partition(":")[0]
        raise InputError(f"--dask: policy {policy!r} failed to import on a Dask worker ({exc}); "
                         f"ship its module to the workers with client.upload_file"
                         f"('{module.replace('.', '/')}.py') or install its package on every "
                         f"worker") from None


def _beyond(s: RunSummary | None, standing: frozenset[str]) -> bool:
    return s is not None and bool(set(s.violated) - standing)


def _exploration_key(spec: RunSpec, strategy: str, reach: str, budget: int,
                     time_limit: float | None) -> dict[str, Any]:
    """The inputs that decide an exploration's result, as JSON values: an earlier file with the
    same key is the same exploration asked for again. The scenario enters by content, so an
    edited scenario file never replaces the counterexample of its earlier text."""
    text = json.dumps(spec.scenario.to_dict(), sort_keys=True, ensure_ascii=False)
    return {"scenario": spec.scenario.name,
            "scenario_sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
            "vllm": spec.scenario.vllm, "engine": spec.engine, "policy": spec.policy,
            "ids": spec.id_scheme,
            **({"vllm_tree": spec.backend.tree_record()} if spec.backend.has_tree else {}),
            # the model's runner is another trace: its file never stands for vLLM's runner's
            **({"runner": spec.backend.runner} if spec.backend.runner else {}),
            "options": dict(sorted(spec.option_dict.items())), "seed": spec.seed,
            "skip": list(spec.skip), "strategy": strategy, "reach": reach, "budget": budget,
            "time_limit": time_limit}


def reached(passed: Mapping[str, int], delayable: Mapping[str, int],
            coverage: Mapping[str, int], windows: set[tuple[str, int]],
            evaluated: set[str], skip: Sequence[str]) -> dict[str, Any]:
    """What a search reached, beyond ``coverage`` (runs that delayed each point): the await
    points the scenario passes that no run delayed (``never_delayed``; ``not_delayable``: latent
    ones a ``--reach live`` search leaves alone), those it never passes, the windows opened (a
    window is one pass of an await point, ``(point, occurrence)``, held open by a delay) of the
    passes the unperturbed run makes, and the invariants evaluated with a live incarnation in
    some run and those never evaluated."""
    from racesim.engine_model.invariants import INVARIANTS
    from racesim.engine_model.points import POINTS

    on = {p for p, n in passed.items() if n > 0}
    return {
        "never_delayed": sorted(p for p in on if p in delayable and p not in coverage),
        "not_delayable": sorted(p for p in on if p not in delayable),
        "never_passed": sorted(p.name for p in POINTS if p.name not in on),
        "windows_opened": len(windows),
        "windows_available": sum(n for p, n in delayable.items() if n > 0),
        "invariants_evaluated": [n for n in INVARIANTS if n in evaluated],
        "invariants_never_evaluated": [n for n in INVARIANTS
                                       if n not in evaluated and n not in skip],
    }


def _over(started: float, limit: float | None) -> bool:
    return limit is not None and time.monotonic() - started >= limit


def _counterexample(res: ExploreResult, scenario: Scenario, run: RunResult | RunSummary,
                    shrunk_from: int | None, found_at: int) -> Counterexample:
    violations: tuple[dict[str, Any], ...]
    if isinstance(run, RunSummary):  # an unshrunk find: its invariants, and what decides each
        from racesim.reports.provenance import provenance

        release = release_of_run(scenario.vllm, res.engine)
        violations = tuple({"invariant": v, "provenance": provenance(
            {"invariant": v}, res.engine, release, scenario.workload.topology)}
            for v in run.violated)
        fixed = [(p, d) for p, _k, d in scenario.delays]
        widened = frozenset(run.widened)
        reach = reach_of(get_profile(scenario.vllm),
                         [*fixed, *((d.point, d.delay) for d in run.schedule
                                    if (d.point, d.occurrence) not in widened)]).reach
    else:
        violations = tuple(violation_dicts(run))
        reach = run.reach().reach
    return Counterexample(scenario, res.policy, dict(res.options), res.seed, run.schedule,
                          res.skip, violations, run.trace_hash, shrunk_from,
                          {"strategy": res.strategy, "run": found_at,
                           "shrunk": shrunk_from is not None, "reach": res.reach,
                           "exploration": res.key}, reach,
                          engine=res.engine, ids=res.spec.id_scheme,
                          vllm_tree=res.spec.backend.tree_record(),
                          vllm_release=res.spec.backend.release or ""
                          if res.spec.backend.has_tree else "",
                          frontend=res.frontend[0] if res.spec.backend.is_vllm else "",
                          runner=res.spec.backend.runner or "")


def _save(res: ExploreResult, s: RunSummary, shrunk_from: int | None, out_dir: Path) -> None:
    if not s.trace_hash:  # found by an unhashed run: one more run, with its hash, to record it
        r = res.spec.run(schedule=s.schedule, retain_trace=False)
        s = RunSummary(s.run, r.trace_hash, r.violated, r.schedule, r.widened)
    cx = _counterexample(res, res.scenario, s, shrunk_from, s.run)
    first = res.first_path(out_dir)
    res.out_path = write_claimed(res.out_path or first, cx, res.ours, first=first,
                                 stand_in=True)
    path = res.stand_in = unshrunk_path(res.out_path)
    res.counterexample, res.counterexample_path = cx, str(path)
