"""The bench's vLLM figure: schedules per second on vLLM's own engine code, beside the model's.

``vllm_schedules_per_s`` is ``explore(abort-reuse, buggy, strategy=random, workers=1,
engine="vllm")`` on the 0.33 profile (the release the vllm backend runs), in a fresh Python
process, as ``racesim explore --engine vllm`` runs it: runs per second of the explore call
(baseline included, no shrinking). That process imports vLLM and builds its config objects
once, before the clock starts (``import_s``: that one-time cost), as every worker of a real
exploration does. ``model_schedules_per_s`` is the same explore on the model at 0.33, also in
a fresh process, so the two figures differ only in the backend. Best of ``repeats``, like the
other rates. Without an importable vLLM 0.33 the figure is None and ``unavailable`` says why:
not an error.

``vllm_harness_share`` is the share of that explore's wall time spent outside vLLM's own
calls (the simulation, the fake executor, racesim's bookkeeping around vLLM's objects): the
same explore once more in a fresh process, with every entry point the backend calls into
vLLM wrapped in a timer (outermost call only: vLLM calling vLLM is vLLM's time). The timers
themselves count as harness time, so the figure is an upper bound.

The engine figures (``vllm_schedules_per_s``, ``vllm_harness_share``) run the model's frontend
over vLLM's engine (``RACESIM_VLLM_FRONTEND=model``), so they measure vLLM's engine code alone.
``vllm_frontend_schedules_per_s`` is the same explore as ``racesim explore --engine vllm`` runs
it by default, with vLLM's own frontend as well (its AsyncLLM on the World's loop), in a fresh
process with its own ``import_s`` (target ``FRONTEND_TARGET`` per core); ``frontend_ran`` says
whose frontend that run had ("vllm").
"""

from __future__ import annotations

import time
from typing import Any

from racesim.bench.scale import in_fresh_process

__all__ = ["measure_vllm", "vllm_figures", "VLLM_SCENARIO", "VLLM_PROFILE", "VLLM_POLICY",
           "VLLM_TARGET", "HARNESS_TARGET"]

VLLM_SCENARIO = "abort-reuse"
VLLM_PROFILE = "0.33"
#: vLLM 0.33 with request-ID randomization disabled: IDs as given, vLLM's own abort path
VLLM_POLICY = "buggy"
#: runs per second per core the vllm backend should reach
VLLM_TARGET = 300.0
#: runs per second per core vLLM's own frontend should reach (issue 25)
FRONTEND_TARGET = 50.0
#: the share of a vllm-backend run's time spent outside vLLM's own calls, at most
HARNESS_TARGET = 0.30


def _vllm_entry_points() -> list[tuple[Any, str]]:
    """(class, method) of every vLLM call the backend makes in a run (engine_vllm/)."""
    from racesim.engine_vllm._vllm import vllm

    v = vllm()
    from vllm.v1.engine import input_processor

    return [(v.Scheduler, name) for name in ("schedule", "update_from_output", "add_request",
                                             "finish_requests", "has_requests")] + \
        [(v.AsyncScheduler, name) for name in ("schedule", "update_from_output")
         if name in vars(v.AsyncScheduler)] + \
        [(v.OutputProcessor, name) for name in ("add_request", "process_outputs",
                                                "abort_requests")] + \
        [(v.Request, "from_engine_core_request"), (v.SamplingParams, "__init__"),
         (v.EngineCoreRequest, "__init__"), (v.ModelRunnerOutput, "__init__"),
         (input_processor.InputProcessor, "assign_request_id")]


def _harness_child(budget: int) -> dict[str, Any]:
    """The explore of ``_explore_child`` on vLLM with vLLM's entry points timed."""
    import os

    from racesim.explore import explore
    from racesim.runner import run_scenario
    from racesim.scenarios import load_scenario

    os.environ["RACESIM_VLLM_FRONTEND"] = "model"  # the engine's entry points (this process)
    scenario = load_scenario(VLLM_SCENARIO).with_vllm(VLLM_PROFILE)
    run_scenario(scenario, VLLM_POLICY, engine="vllm", retain_trace=False)  # import vLLM
    inside = [0.0]
    depth = [0]
    clock = time.perf_counter

    def timed(fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if depth[0]:
                return fn(*args, **kwargs)
            depth[0] += 1
            started = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                inside[0] += clock() - started
                depth[0] -= 1
        return wrapper

    for cls, name in _vllm_entry_points():
        raw = vars(cls).get(name)
        if raw is None:  # a compiled struct's constructor (msgspec): not wrappable, not timed
            continue
        if isinstance(raw, (classmethod, staticmethod)):
            setattr(cls, name, type(raw)(timed(raw.__func__)))
        else:
            setattr(cls, name, timed(raw))
    started = clock()
    res = explore(scenario, VLLM_POLICY, strategy="random", budget=budget, workers=1,
                  shrink_runs=0, engine="vllm")
    seconds = clock() - started
    return {"seconds": seconds, "inside_vllm_s": inside[0], "runs": res.runs}


def _unavailable() -> str | None:
    """Why the vllm backend cannot run here, without importing vLLM; None when it can."""
    from racesim.runner.engines import check_engine
    from racesim.sim import InputError

    try:
        check_engine("vllm", VLLM_PROFILE)
    except InputError as exc:
        return str(exc)
    return None


def _explore_child(budget: int, on_vllm: int) -> dict[str, Any]:
    """One timed explore in this (fresh) process; on vLLM after a warm-up run that imports it.
    ``on_vllm``: 0 the model, 1 vLLM's engine with the model's frontend, 2 the default (vLLM's
    own frontend)."""
    import os

    from racesim.explore import explore
    from racesim.runner import run_scenario
    from racesim.scenarios import load_scenario

    if on_vllm == 1:
        os.environ["RACESIM_VLLM_FRONTEND"] = "model"
    else:
        os.environ.pop("RACESIM_VLLM_FRONTEND", None)
    engine = "vllm" if on_vllm else "model"
    scenario = load_scenario(VLLM_SCENARIO).with_vllm(VLLM_PROFILE)
    started = time.perf_counter()
    run_scenario(scenario, VLLM_POLICY, engine=engine, retain_trace=False)
    warm = time.perf_counter() - started
    started = time.perf_counter()
    res = explore(scenario, VLLM_POLICY, strategy="random", budget=budget, workers=1,
                  shrink_runs=0, engine=engine)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "runs": res.runs, "violating_runs": res.violating_runs,
            "import_s": warm, "frontend": res.frontend[0]}


def _frontend_child(budget: int) -> dict[str, Any]:
    """``_explore_child`` on vLLM as it runs by default: vLLM's own frontend (this fresh
    process only)."""
    return _explore_child(budget, 2)


def measure_vllm(budget: int, repeats: int, progress: Any) -> dict[str, Any]:
    """The ``vllm`` section of the bench document (see the module docstring)."""
    why = _unavailable()
    out: dict[str, Any] = {"scenario": VLLM_SCENARIO, "vllm": VLLM_PROFILE,
                           "policy": VLLM_POLICY, "strategy": "random", "workers": 1,
                           "budget": budget, "target_per_core": VLLM_TARGET,
                           "unavailable": why}
    if why is not None:
        return {**out, "vllm_schedules_per_s": None, "model_schedules_per_s": None,
                "harness_share": None, "frontend_schedules_per_s": None}
    real: list[dict[str, Any]] = []
    model: list[dict[str, Any]] = []
    for i in range(repeats):
        progress(f"vllm backend: {VLLM_SCENARIO} ({i + 1}/{repeats})")
        real.append(in_fresh_process(__name__, "_explore_child", budget, 1))
        progress(f"model at {VLLM_PROFILE}: {VLLM_SCENARIO} ({i + 1}/{repeats})")
        model.append(in_fresh_process(__name__, "_explore_child", budget, 0))
    frontend: list[dict[str, Any]] = []
    for i in range(repeats):
        progress(f"vLLM's own frontend: {VLLM_SCENARIO} ({i + 1}/{repeats})")
        frontend.append(in_fresh_process(__name__, "_frontend_child", budget))
    best_fe = min(frontend, key=lambda r: r["seconds"])
    progress(f"vllm backend: time inside vLLM's own calls ({VLLM_SCENARIO})")
    share = in_fresh_process(__name__, "_harness_child", budget)
    harness = 1.0 - share["inside_vllm_s"] / share["seconds"] if share["seconds"] > 0 else None
    best = min(real, key=lambda r: r["seconds"])
    best_model = min(model, key=lambda r: r["seconds"])
    return {**out,
            "vllm_schedules_per_s": round(best["runs"] / best["seconds"], 1),
            "model_schedules_per_s": round(best_model["runs"] / best_model["seconds"], 1),
            "runs": best["runs"], "seconds": round(best["seconds"], 3),
            "import_s": round(min(r["import_s"] for r in real), 2),
            "frontend_schedules_per_s": round(best_fe["runs"] / best_fe["seconds"], 1),
            "frontend_import_s": round(min(r["import_s"] for r in frontend), 2),
            "frontend_ran": best_fe["frontend"],
            "frontend_target_per_core": FRONTEND_TARGET,
            "frontend_samples_s": [round(r["seconds"], 3) for r in frontend],
            "harness_share": None if harness is None else round(harness, 3),
            "harness_target": HARNESS_TARGET,
            "inside_vllm_s": round(share["inside_vllm_s"], 3),
            "harness_seconds": round(share["seconds"], 3),
            "same_result": all(r["violating_runs"] == best_model["violating_runs"]
                               for r in real + model),
            "samples_s": [round(r["seconds"], 3) for r in real],
            "model_samples_s": [round(r["seconds"], 3) for r in model]}


def vllm_figures(budget: int, repeats: int, progress: Any) -> dict[str, Any]:
    """The bench document's ``vllm_schedules_per_s`` and its ``vllm`` section."""
    section = measure_vllm(budget, repeats, progress)
    return {"vllm_schedules_per_s": section["vllm_schedules_per_s"],
            "vllm_frontend_schedules_per_s": section["frontend_schedules_per_s"],
            "vllm_harness_share": section["harness_share"], "vllm": section}
