"""What a process keeps between vllm-backend runs (vLLM's modules, the config objects of each
engine shape, the plugin entry points, the model's generation config) never carries one run into
the next: scenarios run in turn in one process trace exactly what they trace in another process
that runs them in the opposite order, the first of them first of all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.vllm

SCENARIOS = ("abort-reuse", "parallel-sampling-abort", "stop-string-reuse", "multi-frontend")
#: RACESIM_VLLM_FRONTEND of each pass: the model's frontend, then the default (vLLM's own)
FRONTENDS = ("model", "")

_CHILD = """
import json, os, sys
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario
from racesim.sim.strategies import RandomStrategy, StrategyConfig

out = []
for frontend, name in json.loads(sys.argv[1]):
    os.environ["RACESIM_VLLM_FRONTEND"] = frontend
    scenario = load_scenario(name)
    base = run_scenario(scenario, "buggy", engine="vllm")
    config = StrategyConfig(occurrences=base.occurrences,
                            scale=scenario.workload.engine.step_time)
    delayed = run_scenario(scenario, "buggy", engine="vllm",
                           decider=RandomStrategy(config).decider(1))
    out.append([frontend + "/" + name, base.frontend, base.trace_hash, delayed.trace_hash])
print(json.dumps(out))
"""


def _hashes(order: list[tuple[str, str]], fresh: bool) -> list[list[str]]:
    if fresh:
        proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(order)], cwd=REPO,
                              capture_output=True, text=True, timeout=900, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
    saved = os.environ.get("RACESIM_VLLM_FRONTEND")
    argv = sys.argv
    try:
        sys.argv = ["-c", json.dumps(order)]
        import contextlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(_CHILD, {"__name__": "__child__"})
        return json.loads(buf.getvalue().strip().splitlines()[-1])  # type: ignore[no-any-return]
    finally:
        sys.argv = argv
        if saved is None:
            os.environ.pop("RACESIM_VLLM_FRONTEND", None)
        else:
            os.environ["RACESIM_VLLM_FRONTEND"] = saved


def test_runs_in_turn_trace_what_another_process_traces_in_the_opposite_order(
        vllm_backend: object) -> None:
    order = [(f, name) for f in FRONTENDS for name in SCENARIOS]
    here = _hashes(order + order, fresh=False)  # each scenario twice, after all the others
    there = {row[0]: row[1:] for row in _hashes(order[::-1], fresh=True)}
    assert len(here) == 2 * len(there) == 2 * len(order)
    for key, *traced in here:
        assert traced == there[key], key
    assert {frontend for key, frontend, *_ in here if key.startswith("/")} == {"vllm"}, \
        "the default pass ran vLLM's own frontend"
    assert len({h for _k, _f, *hs in here for h in hs}) == 2 * len(order), \
        "each run traced its own scenario and schedule"
