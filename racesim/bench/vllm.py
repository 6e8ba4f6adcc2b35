"""The bench's vLLM figures: schedules per second on vLLM's own code, beside the model's; where a
run's time goes; and what importing vLLM costs a single ``racesim run``.

``vllm_schedules_per_s`` is ``explore(abort-reuse, buggy, strategy=random, workers=1,
engine="vllm")`` on the 0.33 profile (the release the vllm backend runs), in a fresh Python
process, as ``racesim explore --engine vllm`` runs it: runs per second of the explore call
(baseline included, no shrinking). Before the clock starts that process imports vLLM
(``import_s``: ``racesim.engine_vllm._vllm.vllm()``, vLLM's modules and torch) and makes one run
(``first_run_s``: the config objects, the model runner's modules), as every worker of a real
exploration does once. ``model_schedules_per_s`` is the same explore on the model at 0.33, also
in a fresh process, so the two figures differ only in the backend. Best of ``repeats``, like
the other rates, with each sample's wall and CPU seconds (CPU time is what other processes on
the machine disturb least). Without an importable vLLM 0.33 the figures are None and
``unavailable`` says why: not an error.

The engine figures (``vllm_schedules_per_s``, ``harness_share``) run the model's frontend over
vLLM's engine and model runner (``RACESIM_VLLM_FRONTEND=model``).
``vllm_frontend_schedules_per_s`` is the same explore as ``racesim explore --engine vllm`` runs
it by default, with vLLM's own frontend as well (its AsyncLLM on the World's loop), in a fresh
process with its own ``frontend_import_s`` (target ``FRONTEND_TARGET`` per core);
``frontend_ran`` says whose frontend that run had ("vllm").
``frontend_model_runner_schedules_per_s`` is that explore again with vLLM's own frontend over
racesim's model of the runner (``RACESIM_VLLM_RUNNER=model``: what a frontend change needs),
in a fresh process too; both are also given as schedules per CPU second, the median of the
``repeats`` samples (``frontend_cpu_schedules_per_s``,
``frontend_model_runner_cpu_schedules_per_s``): what one core does, whatever else runs.

``harness_share`` (model frontend) and ``frontend_harness_share`` (vLLM's own) are the share of
such an explore's time spent outside vLLM's own code (the simulation, racesim's stand-ins,
its bookkeeping around vLLM's objects), sampled in one more fresh process each
(:mod:`racesim.bench.share`: the method, its standard error, the split by area in
``harness_areas`` / ``frontend_harness_areas``), with a quarter of the budget (at least 8 runs).

``run_command_s`` is the wall time of one ``racesim run abort-reuse --engine vllm --json`` (a
fresh process, interpreter start to exit), ``run_import_s`` the part of it spent importing vLLM
(timed in that process) and ``run_import_share`` their ratio.
"""

from __future__ import annotations

import time
from typing import Any

from racesim.bench.scale import in_fresh_process
from racesim.bench.share import sample_share

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


def _unavailable() -> str | None:
    """Why the vllm backend cannot run here, without importing vLLM; None when it can."""
    from racesim.runner.engines import check_engine
    from racesim.sim import InputError

    try:
        check_engine("vllm", VLLM_PROFILE)
    except InputError as exc:
        return str(exc)
    return None


def _set_frontend(on_vllm: int) -> str:
    """The backend of ``on_vllm`` (0 the model, 1 vLLM's engine with the model's frontend, 2
    the default: vLLM's own frontend as well, 3 vLLM's own frontend over the model's runner),
    its frontend and runner chosen in this process."""
    import os

    if on_vllm == 1:
        os.environ["RACESIM_VLLM_FRONTEND"] = "model"
    else:
        os.environ.pop("RACESIM_VLLM_FRONTEND", None)
    if on_vllm == 3:
        os.environ["RACESIM_VLLM_RUNNER"] = "model"
    else:
        os.environ.pop("RACESIM_VLLM_RUNNER", None)
    return "vllm" if on_vllm else "model"


def _warm_up(engine: str) -> tuple[Any, float, float]:
    """The scenario, and the seconds of importing vLLM and of a first run (on the model: no
    import)."""
    from racesim.runner import run_scenario
    from racesim.scenarios import load_scenario

    scenario = load_scenario(VLLM_SCENARIO).with_vllm(VLLM_PROFILE)
    started = time.perf_counter()
    if engine == "vllm":
        from racesim.engine_vllm import _vllm

        _vllm.vllm()
    imported = time.perf_counter()
    run_scenario(scenario, VLLM_POLICY, engine=engine, retain_trace=False)
    return scenario, imported - started, time.perf_counter() - imported


def _explore_child(budget: int, on_vllm: int) -> dict[str, Any]:
    """One timed explore in this (fresh) process, after a warm-up run (``_set_frontend``)."""
    from racesim.explore import explore

    engine = _set_frontend(on_vllm)
    scenario, import_s, first_s = _warm_up(engine)
    started, cpu = time.perf_counter(), time.process_time()
    res = explore(scenario, VLLM_POLICY, strategy="random", budget=budget, workers=1,
                  shrink_runs=0, engine=engine)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {"seconds": seconds, "cpu_s": cpu, "runs": res.runs,
            "violating_runs": res.violating_runs, "import_s": import_s, "first_run_s": first_s,
            "frontend": res.frontend[0]}


def _frontend_child(budget: int, model_runner: int = 0) -> dict[str, Any]:
    """``_explore_child`` on vLLM as it runs by default: vLLM's own frontend (this fresh
    process only); over the model's runner when ``model_runner`` is 1 (arguments cross the
    process boundary as integers)."""
    return _explore_child(budget, 3 if model_runner else 2)


def _cpu_rate(samples: list[dict[str, Any]]) -> float:
    """Schedules per CPU second, the median sample's."""
    rates = sorted(r["runs"] / r["cpu_s"] for r in samples)
    return round(rates[len(rates) // 2], 1)


def _share_child(budget: int, on_vllm: int) -> dict[str, Any]:
    """``_explore_child``'s explore on vLLM, sampled (:mod:`racesim.bench.share`)."""
    from racesim.explore import explore

    engine = _set_frontend(on_vllm)
    scenario, _import_s, _first_s = _warm_up(engine)
    res, share = sample_share(lambda: explore(scenario, VLLM_POLICY, strategy="random",
                                              budget=budget, workers=1, shrink_runs=0,
                                              engine=engine))
    return {**share, "runs": res.runs, "frontend": res.frontend[0]}


#: ``python -m racesim ARGS`` with vLLM imported first, timed (the run would import it at the
#: same point: before its first run), the time on stderr after ``_MARK``
_MARK = "racesim-bench-import-s "
_COMMAND = ("import runpy, sys, time; started = time.perf_counter(); "
            "from racesim.engine_vllm import _vllm; _vllm.vllm(); "
            f"sys.stderr.write('{_MARK}%f\\n' % (time.perf_counter() - started)); "
            "sys.argv[0] = 'racesim'; runpy.run_module('racesim', run_name='__main__')")


def _command(progress: Any) -> dict[str, Any]:
    """``racesim run abort-reuse --engine vllm --json`` in a fresh process, timed from outside
    it (``-I``: nothing from the current folder), and the part of it spent importing vLLM."""
    import subprocess
    import sys

    progress(f"racesim run {VLLM_SCENARIO} --engine vllm (a fresh process)")
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-I", "-c", _COMMAND, "run", VLLM_SCENARIO,
                           "--engine", "vllm", "--json"], check=True, capture_output=True,
                          text=True)
    wall = time.perf_counter() - started
    import_s = next(float(line[len(_MARK):]) for line in proc.stderr.splitlines()
                    if line.startswith(_MARK))
    return {"run_command_s": round(wall, 2), "run_import_s": round(import_s, 2),
            "run_import_share": round(import_s / wall, 3)}


def measure_vllm(budget: int, repeats: int, progress: Any) -> dict[str, Any]:
    """The ``vllm`` section of the bench document (see the module docstring)."""
    why = _unavailable()
    out: dict[str, Any] = {"scenario": VLLM_SCENARIO, "vllm": VLLM_PROFILE,
                           "policy": VLLM_POLICY, "strategy": "random", "workers": 1,
                           "budget": budget, "target_per_core": VLLM_TARGET,
                           "unavailable": why}
    if why is not None:
        return {**out, "vllm_schedules_per_s": None, "model_schedules_per_s": None,
                "harness_share": None, "frontend_schedules_per_s": None,
                "frontend_model_runner_schedules_per_s": None,
                "frontend_harness_share": None}
    real: list[dict[str, Any]] = []
    model: list[dict[str, Any]] = []
    frontend: list[dict[str, Any]] = []
    fake: list[dict[str, Any]] = []
    for i in range(repeats):  # the four alternate, so a slow spell of the machine hits all
        progress(f"vllm backend: {VLLM_SCENARIO} ({i + 1}/{repeats})")
        real.append(in_fresh_process(__name__, "_explore_child", budget, 1))
        progress(f"model at {VLLM_PROFILE}: {VLLM_SCENARIO} ({i + 1}/{repeats})")
        model.append(in_fresh_process(__name__, "_explore_child", budget, 0))
        progress(f"vLLM's own frontend: {VLLM_SCENARIO} ({i + 1}/{repeats})")
        frontend.append(in_fresh_process(__name__, "_frontend_child", budget))
        progress(f"vLLM's own frontend, the model's runner: {VLLM_SCENARIO} "
                 f"({i + 1}/{repeats})")
        fake.append(in_fresh_process(__name__, "_frontend_child", budget, 1))
    small = max(8, budget // 4)
    progress(f"vllm backend: where the time goes ({VLLM_SCENARIO}, sampled)")
    share = in_fresh_process(__name__, "_share_child", small, 1)
    progress(f"vLLM's own frontend: where the time goes ({VLLM_SCENARIO}, sampled)")
    fe_share = in_fresh_process(__name__, "_share_child", small, 2)
    best = min(real, key=lambda r: r["seconds"])
    best_model = min(model, key=lambda r: r["seconds"])
    best_fe = min(frontend, key=lambda r: r["seconds"])
    best_fake = min(fake, key=lambda r: r["seconds"])
    return {**out,
            "vllm_schedules_per_s": round(best["runs"] / best["seconds"], 1),
            "model_schedules_per_s": round(best_model["runs"] / best_model["seconds"], 1),
            "runs": best["runs"], "seconds": round(best["seconds"], 3),
            "import_s": round(min(r["import_s"] for r in real), 2),
            "first_run_s": round(min(r["first_run_s"] for r in real), 3),
            "frontend_schedules_per_s": round(best_fe["runs"] / best_fe["seconds"], 1),
            "frontend_import_s": round(min(r["import_s"] for r in frontend), 2),
            "frontend_first_run_s": round(min(r["first_run_s"] for r in frontend), 3),
            "frontend_ran": best_fe["frontend"],
            "frontend_target_per_core": FRONTEND_TARGET,
            "frontend_samples_s": [round(r["seconds"], 3) for r in frontend],
            "frontend_samples_cpu_s": [round(r["cpu_s"], 3) for r in frontend],
            "frontend_cpu_schedules_per_s": _cpu_rate(frontend),
            "frontend_model_runner_schedules_per_s":
                round(best_fake["runs"] / best_fake["seconds"], 1),
            "frontend_model_runner_cpu_schedules_per_s": _cpu_rate(fake),
            "frontend_model_runner_ran": best_fake["frontend"],
            "frontend_model_runner_samples_s": [round(r["seconds"], 3) for r in fake],
            "frontend_model_runner_samples_cpu_s": [round(r["cpu_s"], 3) for r in fake],
            "harness_target": HARNESS_TARGET,
            "harness_runs": small,
            "harness_share": share["harness_share"],
            "harness_share_stderr": share["harness_share_stderr"],
            "harness_samples": share["samples"],
            "harness_areas": share["areas"],
            "frontend_harness_share": fe_share["harness_share"],
            "frontend_harness_share_stderr": fe_share["harness_share_stderr"],
            "frontend_harness_samples": fe_share["samples"],
            "frontend_harness_areas": fe_share["areas"],
            **_command(progress),
            "same_result": all(r["violating_runs"] == best_model["violating_runs"]
                               for r in real + model),
            "samples_s": [round(r["seconds"], 3) for r in real],
            "samples_cpu_s": [round(r["cpu_s"], 3) for r in real],
            "model_samples_s": [round(r["seconds"], 3) for r in model]}


def vllm_figures(budget: int, repeats: int, progress: Any) -> dict[str, Any]:
    """The bench document's ``vllm_schedules_per_s`` and its ``vllm`` section."""
    section = measure_vllm(budget, repeats, progress)
    return {"vllm_schedules_per_s": section["vllm_schedules_per_s"],
            "vllm_frontend_schedules_per_s": section["frontend_schedules_per_s"],
            "vllm_frontend_model_runner_schedules_per_s":
                section["frontend_model_runner_schedules_per_s"],
            "vllm_harness_share": section["harness_share"],
            "vllm_frontend_harness_share": section["frontend_harness_share"],
            "vllm_import_s": section.get("import_s"), "vllm": section}
