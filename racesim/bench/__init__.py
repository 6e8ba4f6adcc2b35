"""``racesim bench``: how fast racesim explores, measured against bare simpy, in one run of the
command (the explores and each scale size in fresh child processes).

Every figure is wall-clock time (``time.perf_counter``) around simulated runs; nothing inside a
run reads the wall clock. The rates (``simpy_events_per_s``, ``model_events_per_s``,
``schedules_per_s``) are each the best of ``repeats`` measurements, and ``parallel_speedup``
and ``parallel.capacity`` are ratios of the best times of their two sides (other processes on
the machine only ever slow a measurement down, as ``timeit`` assumes); every sample is in the
document. ``first_bug`` and ``scale`` are single measurements. The document :func:`run_bench`
returns:

``simpy_events_per_s``
    a bare simpy workload with no model: sender processes that yield timeouts and trigger events
    their receivers wait on, driven by the same ``peek``/``step`` loop as a model run;
    events = ``env.step`` calls.
``model_events_per_s``, ``overhead_ratio``
    ``env.step`` calls per second during model runs (every race scenario under ``buggy`` with
    random-strategy schedules, checker on, no trace kept or hashed: the exploration path), and
    ``simpy_events_per_s / model_events_per_s``.
``schedules_per_s``
    ``explore(abort-reuse, buggy, strategy=random, workers=1)``, checker on: runs per second of
    the whole call (baseline run included, no shrinking), in a fresh Python process as
    ``racesim explore`` runs it.
``dp_schedules_per_s``
    the same explore on the data-parallel scenario ``dp-reuse-across-engines`` (two engines,
    two API servers) under ``internal-id``, on its own profile (0.33: data parallelism is not
    modelled on 0.8), where it breaks nothing, so every run of the budget is made.
``first_bug``
    ``{scenario: {strategy: {runs, seconds}}}``: ``first_violation_run`` of ``explore`` under
    ``buggy`` (the first run violating something beyond the unperturbed baseline) and the wall
    seconds from the explore call to the end of that run; both null when the budget found none.
    ``runs`` is 0 when the baseline itself already breaks a safety invariant (a race that needs
    no delay, as in multi-frontend); ``seconds`` is then one baseline run's.
``scale``
    an abort-storm-like load (IDs drawn from a pool, explicit aborts, disconnects, EOS, staggered
    arrivals) of 1k, 10k and 100k requests under ``engine-final`` (under which this load breaks
    nothing, so every request lives its whole lifecycle and the load stays steady), each in a
    fresh Python process with ``retain_trace=False``: wall seconds of the run, and memory as
    ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of that process: ``peak_rss_mb`` (the whole
    process) and ``run_rss_mb`` (its growth during the run); ``growth_exponent`` is the
    least-squares slope of log(seconds) against log(requests).
``feature_schedules_per_s``, ``features``
    exploration speed on newer lifecycle features' scenarios (prefix-reuse under internal-id, on
    its own profile), measured as ``schedules_per_s`` with a fifth of its budget
    (:mod:`racesim.bench.features`).
``vllm_schedules_per_s``, ``vllm``
    that explore on vLLM's own engine code (``--engine vllm``, 0.33, with the model's frontend:
    ``RACESIM_VLLM_FRONTEND=model``) beside the model's at 0.33; None when vLLM 0.33 is not
    importable (``vllm.unavailable``; :mod:`racesim.bench.vllm`).
``vllm_frontend_schedules_per_s``
    the same as ``--engine vllm`` runs it by default, with vLLM's own frontend (target 50 per
    core; ``vllm.frontend_ran`` "vllm").
``vllm_frontend_model_runner_schedules_per_s``
    the same with vLLM's own frontend over racesim's model of the runner
    (``RACESIM_VLLM_RUNNER=model``); ``vllm.frontend_cpu_schedules_per_s`` and
    ``vllm.frontend_model_runner_cpu_schedules_per_s`` are both per CPU second (median).
``vllm_import_s``
    what importing vLLM takes in a fresh process (``vllm.first_run_s``: the first run after
    it); ``vllm.run_command_s`` and ``vllm.run_import_share``: one ``racesim run abort-reuse
    --engine vllm`` in a fresh process and the share of it spent importing vLLM.
``vllm_harness_share``, ``vllm_frontend_harness_share``
    the share of those vllm-backend explores' CPU time spent outside vLLM's own code, sampled
    (target at most 0.30; None without vLLM; :mod:`racesim.bench.share`).
``build``, ``compiled``
    whether the simulation's hot modules run compiled (mypyc, the default install) or as
    Python source (``RACESIM_PURE=1``, or no compiler at install time), and why.
``parallel_speedup``
    the ``schedules_per_s`` explore again with ``workers=2``: wall seconds of ``workers=1`` over
    ``workers=2`` (pool start-up included); ``parallel.identical`` says both found the same, and
    ``parallel.capacity`` is the physical limit at that moment: how much faster two processes
    run two pure-Python CPU burns than one (2.0 on two idle cores; less while other processes
    hold a core, which wall-clock figures cannot tell apart from a slow racesim).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from racesim.bench.baseline import bare_simpy, parallel_capacity
from racesim.bench.features import measure_feature_explores
from racesim.bench.scale import BENCH_VLLM, in_fresh_process, measure_scale, storm_workload
from racesim.bench.vllm import vllm_figures

__all__ = ["run_bench", "storm_workload", "bare_simpy", "parallel_capacity",
           "RACE_SCENARIOS", "STRATEGIES", "TARGETS"]

RACE_SCENARIOS = ("abort-reuse", "stop-string-reuse", "async-sched-reuse", "pd-reuse",
                  "multi-frontend", "parallel-sampling-abort", "abort-storm", "stale-abort-reuse")
STRATEGIES = ("random", "pct", "grid", "hypothesis")
_POLICY = "buggy"
_SCHEDULES_SCENARIO = "abort-reuse"
_DP_SCENARIO, _DP_POLICY = "dp-reuse-across-engines", "internal-id"

#: The speed racesim aims for: (figure, comparison, bound). Measured and reported, never asserted.
TARGETS: tuple[tuple[str, str, float], ...] = (
    ("overhead_ratio", "<=", 4.0),
    ("schedules_per_s", ">=", 1000.0),
    ("first_bug_best_runs", "<=", 100.0),
    ("growth_exponent", "<=", 1.15),
    ("parallel_speedup", ">=", 1.6),
)

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class _Sizes:
    simpy_pairs: int
    simpy_rounds: int
    model_runs: int           # random-schedule runs per race scenario
    explore_budget: int       # schedules_per_s and parallel_speedup
    first_bug_budget: int
    first_bug_time_limit: float
    scale: tuple[int, ...]
    burn: int                 # loop iterations of the parallel-capacity probe
    repeats: int              # measurements per timed figure (the best is reported)
    vllm_budget: int          # vllm_schedules_per_s (and the model's figure beside it)


# explore_budget: about four seconds on one worker (compiled), so the process pool's start-up is
# a small share of the parallel figure, as in a real exploration.
_FULL = _Sizes(simpy_pairs=200, simpy_rounds=500, model_runs=40, explore_budget=5000,
               first_bug_budget=200, first_bug_time_limit=20.0, scale=(1000, 10000, 100000),
               burn=10_000_000, repeats=3, vllm_budget=1000)
_QUICK = _Sizes(simpy_pairs=10, simpy_rounds=20, model_runs=2, explore_budget=24,
                first_bug_budget=6, first_bug_time_limit=5.0, scale=(40, 80, 160),
                burn=100_000, repeats=1, vllm_budget=8)


# -- model --------------------------------------------------------------------------------------

def _model_events(runs: int, progress: Progress) -> dict[str, Any]:
    from racesim.runner import run_scenario
    from racesim.scenarios import load_scenario
    from racesim.sim.strategies import StrategyConfig, make_strategy

    total_steps = 0
    total_s = 0.0
    per: dict[str, float] = {}
    for name in RACE_SCENARIOS:
        progress(f"model events: {name}")
        scenario = load_scenario(name).with_vllm(BENCH_VLLM)
        base = run_scenario(scenario, _POLICY, retain_trace=False)
        strategy = make_strategy("random", StrategyConfig(
            occurrences=base.occurrences, scale=scenario.workload.engine.step_time, seed=0))
        deciders = [strategy.decider(i) for i in range(1, runs + 1)]
        steps = 0
        started = time.perf_counter()
        for decider in deciders:
            steps += run_scenario(scenario, _POLICY, decider=decider, retain_trace=False,
                                  hash_trace=False).steps
        seconds = time.perf_counter() - started
        per[name] = steps / seconds
        total_steps += steps
        total_s += seconds
    return {"events_per_s": total_steps / total_s, "steps": total_steps,
            "seconds": total_s, "by_scenario": {k: round(v) for k, v in per.items()}}


def _explore_timed(name: str, strategy: str, budget: int, workers: int,
                   time_limit: float | None = None, policy: str = _POLICY,
                   vllm: str | None = BENCH_VLLM) -> tuple[Any, float, list[float]]:
    from racesim.explore import explore
    from racesim.scenarios import load_scenario

    scenario = load_scenario(name).with_vllm(vllm)
    stamps: list[float] = []

    def tick(_runs: int, _total: int, _violating: int) -> None:
        stamps.append(time.perf_counter())  # one call per run after the baseline, in run order

    started = time.perf_counter()
    res = explore(scenario, policy, strategy=strategy, budget=budget, workers=workers,
                  time_limit=time_limit, shrink_runs=0, progress=tick)
    seconds = time.perf_counter() - started
    return res, seconds, [s - started for s in stamps]


def _first_bug(name: str, strategy: str, sizes: _Sizes) -> dict[str, Any]:
    from racesim.reports.verdict import RACE, verdict

    res, seconds, stamps = _explore_timed(name, strategy, sizes.first_bug_budget, 1,
                                          sizes.first_bug_time_limit)
    found = res.found_run
    k = res.first_violation_run
    if found is not None and k is not None and set(found.violated) - set(res.baseline_violations):
        at = stamps[k - 1] if 0 < k <= len(stamps) else seconds
        return {"runs": k, "seconds": round(at, 3)}
    if verdict(res.baseline_violations) == RACE:
        # A race that needs no delay (multi-frontend): the unperturbed baseline, run 0, has it.
        return {"runs": 0, "seconds": round(_baseline_seconds(name), 3)}
    return {"runs": None, "seconds": None}


def _baseline_seconds(name: str) -> float:
    from racesim.runner import run_scenario
    from racesim.scenarios import load_scenario

    scenario = load_scenario(name).with_vllm(BENCH_VLLM)
    started = time.perf_counter()
    run_scenario(scenario, _POLICY, retain_trace=False)
    return time.perf_counter() - started


def _explore_child(budget: int, workers: int) -> dict[str, Any]:
    """The schedules_per_s explore in a fresh process, as ``racesim explore`` runs it (a
    process that has run other measurements first is measurably slower: a bigger, older heap)."""
    res, seconds, _ = _explore_timed(_SCHEDULES_SCENARIO, "random", budget, workers)
    return {"seconds": seconds, "runs": res.runs, "violating_runs": res.violating_runs,
            "first_violation_run": res.first_violation_run,
            "distinct_traces": res.distinct_traces}


def _dp_explore_child(budget: int) -> dict[str, Any]:
    """The dp_schedules_per_s explore in a fresh process (the scenario's own profile)."""
    res, seconds, _ = _explore_timed(_DP_SCENARIO, "random", budget, 1, policy=_DP_POLICY,
                                     vllm=None)
    return {"seconds": seconds, "runs": res.runs, "violating_runs": res.violating_runs}


# -- the bench ----------------------------------------------------------------------------------

def run_bench(*, quick: bool = False, progress: Progress | None = None) -> dict[str, Any]:
    """Measure everything side by side; ``quick`` shrinks every size (for tests)."""
    import simpy

    from racesim import sim

    say: Progress = progress if progress is not None else (lambda _msg: None)
    sizes = _QUICK if quick else _FULL
    load_before = _loadavg()
    started = time.perf_counter()

    repeats = range(sizes.repeats)
    say("bare simpy")
    simpy_samples = [bare_simpy(sizes.simpy_pairs, sizes.simpy_rounds) for _ in repeats]
    steps, seconds = min(simpy_samples, key=lambda sample: sample[1])
    simpy_rate = steps / seconds
    model_samples = [_model_events(sizes.model_runs, say) for _ in repeats]
    model = max(model_samples, key=lambda sample: sample["events_per_s"])

    # 1 and 2 workers alternate, so a slow spell of the machine hits both alike
    ones: list[dict[str, Any]] = []
    twos: list[dict[str, Any]] = []
    burns: list[tuple[float, float]] = []
    for i in repeats:
        say(f"explore {_SCHEDULES_SCENARIO}: 1 worker ({i + 1}/{sizes.repeats})")
        ones.append(in_fresh_process(__name__, "_explore_child", sizes.explore_budget, 1))
        say(f"explore {_SCHEDULES_SCENARIO}: 2 workers ({i + 1}/{sizes.repeats})")
        twos.append(in_fresh_process(__name__, "_explore_child", sizes.explore_budget, 2))
        say(f"parallel capacity ({i + 1}/{sizes.repeats})")
        burns.append(parallel_capacity(sizes.burn))
    dps = []
    for i in repeats:
        say(f"explore {_DP_SCENARIO}: 1 worker ({i + 1}/{sizes.repeats})")
        dps.append(in_fresh_process(__name__, "_dp_explore_child", sizes.explore_budget))
    dp = min(dps, key=lambda sample: sample["seconds"])
    one = min(ones, key=lambda sample: sample["seconds"])
    two = min(twos, key=lambda sample: sample["seconds"])
    one_s, two_s = one["seconds"], two["seconds"]
    # like the speedup, from the best time of each side (a best-of ratio could exceed 2)
    capacity = 2 * min(a for a, _ in burns) / min(b for _, b in burns)

    first_bug: dict[str, dict[str, dict[str, Any]]] = {}
    for name in RACE_SCENARIOS:
        first_bug[name] = {}
        for strategy in STRATEGIES:
            say(f"first bug: {name} / {strategy}")
            first_bug[name][strategy] = _first_bug(name, strategy, sizes)

    scale = measure_scale(sizes.scale, say)
    features = measure_feature_explores(max(1, sizes.explore_budget // 5), sizes.repeats, say)

    best: dict[str, int | None] = {
        name: min((c["runs"] for c in cells.values() if c["runs"] is not None), default=None)
        for name, cells in first_bug.items()}
    found = [v for v in best.values() if v is not None]
    worst_best = max(found) if found and len(found) == len(best) else None
    doc: dict[str, Any] = {
        "quick": quick,
        # compiled (mypyc) or pure Python: every figure below depends on it
        "build": sim.build_info(),
        "compiled": sim.NATIVE,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "implementation": platform.python_implementation(),
                    "simpy": simpy.__version__, "platform": platform.platform(),
                    # other processes compete for the same cores: wall-clock figures need a
                    # quiet machine (1-minute load average before and after the bench)
                    "loadavg_1m": [load_before, _loadavg()]},
        "simpy_events_per_s": round(simpy_rate),
        "model_events_per_s": round(model["events_per_s"]),
        "overhead_ratio": round(simpy_rate / model["events_per_s"], 2),
        "schedules_per_s": round(one["runs"] / one_s, 1),
        "dp_schedules_per_s": round(dp["runs"] / dp["seconds"], 1),
        "dp_schedules": {"scenario": _DP_SCENARIO, "policy": _DP_POLICY, "strategy": "random",
                         "workers": 1, "runs": dp["runs"], "seconds": round(dp["seconds"], 3),
                         "violating_runs": dp["violating_runs"],
                         "samples_s": [round(r["seconds"], 3) for r in dps]},
        "first_bug": first_bug,
        "feature_schedules_per_s": {k: f["schedules_per_s"] for k, f in features.items()},
        "features": features,
        "scale": scale,
        "parallel_speedup": round(one_s / two_s, 2),
        **vllm_figures(sizes.vllm_budget, sizes.repeats, say),
        "repeats": sizes.repeats,
        "simpy": {"steps": steps, "seconds": round(seconds, 3), "pairs": sizes.simpy_pairs,
                  "rounds": sizes.simpy_rounds,
                  "samples_s": [round(s, 3) for _, s in simpy_samples]},
        "model": {"policy": _POLICY, "strategy": "random", "runs_per_scenario": sizes.model_runs,
                  "steps": model["steps"], "seconds": round(model["seconds"], 3),
                  "events_per_s_by_scenario": model["by_scenario"],
                  "samples_events_per_s": [round(m["events_per_s"]) for m in model_samples]},
        "schedules": {"scenario": _SCHEDULES_SCENARIO, "policy": _POLICY, "strategy": "random",
                      "workers": 1, "runs": one["runs"], "seconds": round(one_s, 3),
                      "samples_s": [round(r["seconds"], 3) for r in ones],
                      "process": "a fresh Python process per explore, as `racesim explore`"},
        "parallel": {"scenario": _SCHEDULES_SCENARIO, "runs": two["runs"],
                     "workers_1_s": round(one_s, 3), "workers_2_s": round(two_s, 3),
                     "workers_2_samples_s": [round(r["seconds"], 3) for r in twos],
                     "identical": all(_same(one, r) for r in ones + twos),
                     # the most two processes could gain at that moment (a pure CPU burn)
                     "capacity": round(capacity, 2),
                     "capacity_samples": [round(2 * a / b, 2) for a, b in burns]},
        "first_bug_budget": {"policy": _POLICY, "runs": sizes.first_bug_budget,
                             "time_limit_s": sizes.first_bug_time_limit,
                             "best_runs": best},
    }
    figures = {"overhead_ratio": doc["overhead_ratio"], "schedules_per_s": doc["schedules_per_s"],
               "first_bug_best_runs": worst_best, "growth_exponent": scale["growth_exponent"],
               "parallel_speedup": doc["parallel_speedup"]}
    doc["targets"] = {name: {"target": f"{op} {bound:g}", "value": figures[name],
                             "met": _met(figures[name], op, bound)}
                      for name, op, bound in TARGETS}
    doc["elapsed_s"] = round(time.perf_counter() - started, 1)
    return doc


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("runs", "violating_runs", "first_violation_run", "distinct_traces")
    return all(a[k] == b[k] for k in keys)


def _met(value: float | None, op: str, bound: float) -> bool:
    if value is None:
        return False
    return value <= bound if op == "<=" else value >= bound
