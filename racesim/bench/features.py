"""``racesim bench``'s exploration speed on the scenarios of newer lifecycle features: for each
(figure, scenario, policy), ``explore`` with the random strategy on one worker, checker on, no
shrinking, in a fresh Python process as ``racesim explore`` runs it; schedules per second of
the whole call, the best of ``repeats``. Each scenario runs on its own vLLM profile (the
feature's release), unlike the seed's figures, which stay on the bench's fixed profile.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from racesim.bench.scale import in_fresh_process

__all__ = ["FEATURE_EXPLORES", "measure_feature_explores"]

#: (figure name, bundled scenario, policy). prefix-reuse shares ref-counted prompt blocks
#: between live and cached owners on every run; internal-id keeps every run clean, so each
#: one lives its whole lifecycle.
FEATURE_EXPLORES: tuple[tuple[str, str, str], ...] = (
    ("prefix_cached", "prefix-reuse", "internal-id"),
)


def _feature_child(index: int, budget: int) -> dict[str, Any]:
    from racesim.explore import explore
    from racesim.scenarios import load_scenario

    _figure, name, policy = FEATURE_EXPLORES[index]
    scenario = load_scenario(name)
    started = time.perf_counter()
    res = explore(scenario, policy, strategy="random", budget=budget, workers=1, shrink_runs=0)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "runs": res.runs, "violating_runs": res.violating_runs,
            "vllm": scenario.vllm}


def measure_feature_explores(budget: int, repeats: int,
                             progress: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """``{figure: {scenario, policy, vllm, runs, seconds, schedules_per_s, samples_s}}``."""
    out: dict[str, dict[str, Any]] = {}
    for index, (figure, name, policy) in enumerate(FEATURE_EXPLORES):
        samples = []
        for i in range(repeats):
            progress(f"explore {name} ({figure}): 1 worker ({i + 1}/{repeats})")
            samples.append(in_fresh_process(__name__, "_feature_child", index, budget))
        best = min(samples, key=lambda s: s["seconds"])
        out[figure] = {"scenario": name, "policy": policy, "vllm": best["vllm"],
                       "runs": best["runs"], "violating_runs": best["violating_runs"],
                       "seconds": round(best["seconds"], 3),
                       "schedules_per_s": round(best["runs"] / best["seconds"], 1),
                       "samples_s": [round(s["seconds"], 3) for s in samples]}
    return out
