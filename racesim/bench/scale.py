"""The bench's ``scale`` figures: an abort-storm-like load of growing size, each size run in a
fresh Python process (wall seconds and peak memory), and how the time grows with the size.

See :mod:`racesim.bench` for the document these figures go into.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["SCALE_POLICY", "BENCH_VLLM", "storm_workload", "measure_scale", "in_fresh_process"]

#: Under this policy the storm breaks nothing: every request lives its whole lifecycle.
SCALE_POLICY = "engine-final"
#: The vLLM profile every bench figure is measured on: 0.8, the model the figures have always
#: measured, so that a change to the model's speed shows up against earlier runs rather than
#: being mixed with a change of semantics.
BENCH_VLLM = "0.8"

Progress = Callable[[str], None]


def storm_workload(n: int, seed: int = 0, *, id_pool: int = 64, gap: float = 0.005) -> Any:
    """An abort-storm-like :class:`racesim.engine_model.Workload` of ``n`` requests: IDs drawn
    from a pool of ``id_pool`` (so IDs are reused, sometimes while still live), arrivals every
    ``gap`` seconds on average; a quarter abort explicitly, a fifth disconnect after a few tokens, a
    fifth stop at EOS. The engine is sized to keep up, so the load is steady at any ``n``."""
    from racesim.engine_model import EngineConfig, RequestSpec, Workload

    rng = random.Random(seed)
    ids = [f"r{i}" for i in range(id_pool)]
    requests = []
    t = 0.0
    for _ in range(n):
        t += rng.uniform(0.0, 2 * gap)
        at = round(t, 4)
        kind = rng.random()
        extra: dict[str, Any] = {}
        if kind < 0.25:
            extra["abort_at"] = round(at + rng.uniform(0.01, 0.15), 4)
        elif kind < 0.45:
            extra["disconnect_after_tokens"] = rng.choice((2, 4, 6))
        elif kind < 0.65:
            extra["eos_at"] = rng.choice((3, 5, 8))
        requests.append(RequestSpec(rng.choice(ids), at, rng.choice((16, 32, 48)),
                                    rng.choice((10, 20, 30)), **extra))
    engine = EngineConfig(vllm=BENCH_VLLM, num_blocks=2048, block_size=16, max_num_seqs=128,
                          max_num_batched_tokens=8192, step_time=0.01)
    return Workload(horizon=t + 60.0, engine=engine, requests=tuple(requests))


def _rss_mb(maxrss: int) -> float:
    return maxrss / (1024 * 1024) if sys.platform == "darwin" else maxrss / 1024


def _scale_child(n: int) -> dict[str, Any]:
    """One size in a fresh process: wall seconds and ru_maxrss around the run."""
    import resource

    from racesim.engine_model import load_policy, run_workload

    workload = storm_workload(n)
    policy = load_policy(SCALE_POLICY)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    r = run_workload(workload, policy, retain_trace=False)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"requests": n, "seconds": round(seconds, 3), "peak_rss_mb": round(_rss_mb(peak), 1),
            "run_rss_mb": round(_rss_mb(peak - before), 1),
            "run_kb_per_request": round(_rss_mb(peak - before) * 1024 / n, 2),
            "events": r.events, "steps": r.steps, "sim_time": round(r.sim_time, 3),
            "violated": list(r.violated)}


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((x - mx) ** 2 for x in lx)
    return sum((x - mx) * (y - my) for x, y in zip(lx, ly, strict=True)) / den if den else 0.0


# the child runs isolated (python -I: neither the current folder nor PYTHON* variables on
# sys.path, so a json.py where the user typed `racesim bench` is never imported); this
# racesim's root comes first instead, as argv[1]
_CHILD = "import sys; sys.path.insert(0, sys.argv[1]); import importlib, json; " \
         "module = importlib.import_module(sys.argv[2]); " \
         "print(json.dumps(getattr(module, sys.argv[3])(*map(int, sys.argv[4:]))))"


def in_fresh_process(module: str, function: str, *args: int) -> dict[str, Any]:
    """``function(*args)`` of racesim's ``module`` in a fresh Python process (its JSON
    answer)."""
    root = str(Path(__file__).resolve().parents[2])  # this racesim, whatever sys.path says
    out = subprocess.run([sys.executable, "-I", "-c", _CHILD, root, module, function,
                          *map(str, args)], check=True, capture_output=True, text=True)
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return row


def measure_scale(sizes: Sequence[int], progress: Progress) -> dict[str, Any]:
    """The ``scale`` figures: each size in a fresh process, and the growth exponent."""
    rows = []
    for n in sizes:
        progress(f"scale: {n} requests")
        rows.append(in_fresh_process(__name__, "_scale_child", n))
    secs = [max(r["seconds"], 1e-6) for r in rows]
    return {"policy": SCALE_POLICY, "sizes": rows,
            "growth_exponent": round(_slope([r["requests"] for r in rows], secs), 3),
            "memory": "resource.getrusage(RUSAGE_SELF).ru_maxrss of a fresh Python process: "
                      "peak_rss_mb is the process's peak, run_rss_mb its growth during the run"}
