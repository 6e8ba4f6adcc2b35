"""Exploration: find a race with no hint, shrink it, and say how much a clean result proves.

Run 0 is the unperturbed baseline. Invariants it already violates are the scenario's standing
violations (metrics-exact under most policies, or a race that needs no delay at all). The
counterexample, and ``first_violation_run``, are the first run that violates something *beyond*
them; both fall back to the baseline itself when nothing else is found. ``violating_runs``
counts every run with any violation.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

from racesim.documents import (
    Counterexample,
    free_path,
    safe_file_name,
    violation_dicts,
    write_counterexample,
)
from racesim.engine_model import RunResult
from racesim.engine_model.policies import policy_spec
from racesim.engine_model.versions import get_profile, reach_of, unverified_note
from racesim.parallel import executor, ordered_map
from racesim.reports.verdict import verdict
from racesim.run_summary import RunSummary
from racesim.runner import RunSpec, import_from_cwd
from racesim.scenarios import Scenario
from racesim.shrink import shrink
from racesim.sim import Decision, InputError
from racesim.sim.strategies import STRATEGIES, StrategyConfig, make_strategy

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


def _run_batch(ctx: _Context, runs: Sequence[int]) -> list[RunSummary]:
    strategy = make_strategy(ctx.strategy, ctx.config)
    out = []
    run = ctx.spec.run
    for i in runs:
        r = run(decider=strategy.decider(i), retain_trace=False, hash_trace=False)
        out.append(RunSummary(i, r.trace_hash, r.violated, r.schedule, r.widened))
    return out


@dataclass
class ExploreResult:
    """What one exploration found: counts, coverage, and its (shrunk) counterexample."""

    spec: RunSpec
    strategy: str
    runs: int = 0
    violating_runs: int = 0
    elapsed_s: float = 0.0
    distinct_traces: int = 0
    coverage: dict[str, int] = field(default_factory=dict)
    baseline_violations: tuple[str, ...] = ()
    invariants: tuple[str, ...] = ()
    strategy_info: dict[str, Any] = field(default_factory=dict)
    counterexample: Counterexample | None = None
    counterexample_path: str | None = None
    #: the first run violating something beyond the baseline (else the first violating run)
    found_run: RunSummary | None = None
    #: the shrunk counterexample's run, trace kept (for reports)
    final_run: RunResult | None = None
    shrink_runs: int = 0
    interrupted: bool = False
    #: "all" await points, or only the "live" ones (live and yield widths) of the profile
    reach: str = "all"
    #: the baseline's reach (only the scenario's fixed delays can make it latent)
    baseline_reach: str = "live"
    #: a user policy raised (one line, file:line); the cell has no verdict
    error: str | None = None
    #: what makes two explorations the same (a file one wrote may be replaced by the other)
    key: dict[str, Any] = field(default_factory=dict)
    #: where its counterexample goes (claimed at the start: never a file another run wrote)
    out_path: Path | None = None
    @property
    def scenario(self) -> Scenario:
        return self.spec.scenario

    @property
    def policy(self) -> str:
        return self.spec.policy

    @property
    def options(self) -> dict[str, str]:
        return self.spec.option_dict

    @property
    def seed(self) -> int:
        return self.spec.seed

    @property
    def skip(self) -> tuple[str, ...]:
        return self.spec.skip

    @property
    def engine(self) -> str:
        """The backend every run used: "model" or "vllm"."""
        return self.spec.engine

    @property
    def first_violation_run(self) -> int | None:
        return self.found_run.run if self.found_run is not None else None

    def confidence(self) -> dict[str, Any]:
        """For a clean result: the failure probability per run it bounds (95 %)."""
        n = self.runs
        clean = self.violating_runs == 0 and n > 0
        out: dict[str, Any] = {"runs": n, "rule_of_three": 3.0 / n if clean else None}
        bound = self.strategy_info.get("bound")
        if clean and isinstance(bound, float) and bound > 0:
            out["pct_bound"] = bound
            out["pct_confidence"] = 1.0 - math.exp(n * math.log1p(-min(bound, 1.0 - 1e-12)))
        else:
            out["pct_bound"] = None
        return out

    def document(self) -> dict[str, Any]:
        cx = None
        if self.counterexample is not None:
            c = self.counterexample
            cx = {"seed": c.seed, "schedule": [d.as_dict() for d in c.schedule],
                  "violations": list(c.violations), "trace_hash": c.trace_hash,
                  "shrunk_from": c.shrunk_from, "shrunk": c.shrunk_from is not None,
                  "path": self.counterexample_path, "reach": c.reach,
                  "requests": len(c.scenario.workload.requests),
                  "found_at_run": self.found_run.run if self.found_run else None}
        return {
            "scenario": self.scenario.name,
            "policy": self.policy,
            "policy_options": self.options,
            "vllm": self.scenario.vllm,
            "engine": self.engine,
            "search": self.reach,
            "strategy": self.strategy,
            "seed": self.seed,
            "runs": self.runs,
            "violating_runs": self.violating_runs,
            "first_violation_run": self.first_violation_run,
            "elapsed_s": round(self.elapsed_s, 3),
            "distinct_traces": self.distinct_traces,
            "coverage": self.coverage,
            "baseline_violations": list(self.baseline_violations),
            "baseline_reach": self.baseline_reach,
            "unverified": unverified_note(self.scenario.vllm,
                                          self.scenario.workload.topology) or None,
            "invariants": list(self.invariants),
            "verdict": verdict(self.invariants),
            "pct": self.strategy_info if self.strategy == "pct" else None,
            "confidence": self.confidence(),
            "counterexample": cx,
            "interrupted": self.interrupted,
            "error": self.error,
        }


def counterexample_path(out_dir: Path, scenario: str, policy: str, strategy: str,
                        seed: int, engine: str = "model") -> Path:
    """The file name of (scenario, policy, strategy, seed, backend). ``explore`` takes the next
    free ``-2``, ``-3``... name when another exploration (another budget, profile, reach...)
    already wrote it, so no exploration overwrites another's."""
    on = "" if engine == "model" else f"__{engine}"
    return out_dir / f"{safe_file_name(f'{scenario}__{policy}__{strategy}__seed{seed}{on}')}.json"


def unshrunk_path(path: Path) -> Path:
    """Where a found, not yet shrunk, counterexample waits: never over a shrunk file."""
    return path.with_name(path.stem + ".unshrunk.json")


def explore(scenario: Scenario, policy: str, *, options: Mapping[str, str] | None = None,
            strategy: str = "random", budget: int = 200, time_limit: float | None = None,
            seed: int = 0, workers: int | None = 1, dask: str | None = None,
            skip: Sequence[str] = (), out_dir: Path | None = None,
            progress: Progress | None = None, shrink_runs: int = 400,
            reach: str = "all", engine: str = "model") -> ExploreResult:
    """Explore ``budget`` schedules of ``scenario`` under ``policy`` (run 0 = baseline).

    ``reach="live"`` delays only the await points that are live or yield in the scenario's
    vLLM profile, so whatever it finds can happen in that release as shipped."""
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
    spec = RunSpec.of(scenario, policy, options=options, seed=seed, skip=skip, engine=engine)
    started = time.monotonic()
    res = ExploreResult(spec, strategy, reach=reach,
                        key=_exploration_key(spec, strategy, reach, budget, time_limit))
    if out_dir is not None:
        res.out_path = free_path(
            counterexample_path(out_dir, scenario.name, policy, strategy, seed, engine),
            lambda data: isinstance(data, dict) and isinstance(data.get("found_by"), dict)
            and data["found_by"].get("exploration") == res.key)
    try:
        baseline = spec.run(retain_trace=False)
    except KeyboardInterrupt:  # nothing found yet: say so rather than unwind the caller
        res.interrupted = True
        res.elapsed_s = time.monotonic() - started
        return res
    res.baseline_violations = baseline.violated
    res.baseline_reach = baseline.reach().reach
    occurrences = baseline.occurrences
    if reach == "live":  # the strategies delay only the points they are given
        profile = get_profile(scenario.vllm)
        occurrences = {p: n for p, n in occurrences.items() if profile.width(p) != "latent"}
    config = StrategyConfig(occurrences=occurrences,
                            scale=scenario.workload.engine.step_time, seed=seed)
    standing = frozenset(baseline.violated)
    traces: set[tuple[Decision, ...]] = set()
    invariants: dict[str, None] = {}

    def record(s: RunSummary) -> None:
        res.runs += 1
        traces.add(s.schedule)
        for point in dict.fromkeys(map(_POINT, s.schedule)):  # each point once per run
            res.coverage[point] = res.coverage.get(point, 0) + 1
        if s.violated:
            res.violating_runs += 1
            for v in s.violated:
                invariants.setdefault(v, None)
            found = res.found_run
            if found is None or (_beyond(s, standing) and not _beyond(found, standing)):
                res.found_run = s
                if out_dir is not None:  # on disk before anything else can fail
                    _save(res, s, None, out_dir)

    record(RunSummary(0, baseline.trace_hash, baseline.violated, ()))
    try:
        if strategy == "hypothesis":
            from racesim.hypothesis_search import hypothesis_search
            minimal = hypothesis_search(spec, config, budget - 1, standing, record,
                                        lambda: _over(started, time_limit), progress, out_dir)
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
            ctx = _Context(spec, strategy, config)
            with executor(workers, dask) as ex:
                for s in ordered_map(_run_batch, ctx, range(1, total), ex):
                    record(s)
                    if progress is not None:
                        progress(res.runs, total, res.violating_runs)
                    if _over(started, time_limit):
                        break
    except KeyboardInterrupt:
        res.interrupted = True
    res.distinct_traces = len(traces)
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
    shrunk = shrink(spec, found.schedule, target, max_runs=shrink_runs)
    res.shrink_runs = shrunk.runs
    final = spec.with_scenario(shrunk.scenario).run(schedule=shrunk.schedule)
    cx = _counterexample(res, shrunk.scenario, final, len(found.schedule), found.run)
    if out_dir is not None:
        path = res.out_path or counterexample_path(out_dir, spec.scenario.name, spec.policy,
                                                   res.strategy, spec.seed, spec.engine)
        write_counterexample(path, cx)
        unshrunk_path(path).unlink(missing_ok=True)  # ours, and now superseded
        res.counterexample_path = str(path)
    res.final_run, res.counterexample = final, cx


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
            "options": dict(sorted(spec.option_dict.items())), "seed": spec.seed,
            "skip": list(spec.skip), "strategy": strategy, "reach": reach, "budget": budget,
            "time_limit": time_limit}


def _over(started: float, limit: float | None) -> bool:
    return limit is not None and time.monotonic() - started >= limit


def _counterexample(res: ExploreResult, scenario: Scenario, run: RunResult | RunSummary,
                    shrunk_from: int | None, found_at: int) -> Counterexample:
    violations: tuple[dict[str, Any], ...]
    if isinstance(run, RunSummary):
        violations = tuple({"invariant": v} for v in run.violated)
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
                          engine=res.engine)


def _save(res: ExploreResult, s: RunSummary, shrunk_from: int | None, out_dir: Path) -> None:
    if not s.trace_hash:  # found by an unhashed run: one more run, with its hash, to record it
        r = res.spec.run(schedule=s.schedule, retain_trace=False)
        s = RunSummary(s.run, r.trace_hash, r.violated, r.schedule, r.widened)
    cx = _counterexample(res, res.scenario, s, shrunk_from, s.run)
    path = unshrunk_path(res.out_path or counterexample_path(
        out_dir, res.scenario.name, res.policy, res.strategy, res.seed, res.engine))
    write_counterexample(path, cx)
    res.counterexample, res.counterexample_path = cx, str(path)
