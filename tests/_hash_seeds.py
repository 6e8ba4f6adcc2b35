"""Trace hashes of vllm-backend runs made in fresh processes under given PYTHONHASHSEEDs.

vLLM keeps request IDs in sets of strings (ParentRequest's children, ``finished_requests``);
the backend orders them, and these tests check it by hashing the same runs in two processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def hashes_per_seed(scenarios: Sequence[str], policies: Sequence[str],
                    seeds: Sequence[str]) -> list[str]:
    """For each seed, the printed list of witness-run hashes (scenario-major) on vLLM."""
    code = ("from racesim.runner import run_scenario; from racesim.scenarios import "
            "load_scenario as l; print([run_scenario(l(n), p, witness=True, engine='vllm')"
            f".trace_hash for n in {tuple(scenarios)!r} for p in {tuple(policies)!r}])")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}, cwd=REPO)
             for seed in seeds]
    return [p.communicate(timeout=600)[0] for p in procs]
