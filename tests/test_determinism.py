"""Same inputs, same trace hash: in any process, under any PYTHONHASHSEED (README
"Concepts"). Runs are compared with each other, never with a stored hash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from racesim.runner import run_scenario
from racesim.scenarios import load_scenario

_SCRIPT = Path(sys.executable).with_name("racesim")
_COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else \
    [sys.executable, "-c", "from racesim.cli import main; main()"]


def _run_in_subprocess(hashseed: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    proc = subprocess.run([*_COMMAND, "run", *args, "--json"], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


@pytest.mark.parametrize("args", [
    ("abort-reuse", "-p", "buggy", "--delay", "frontend.abort:after_pop=0.05"),
    ("async-sched-reuse", "-p", "buggy", "--witness"),
    ("pd-reuse", "-p", "internal-id", "--witness"),
], ids=["abort-reuse", "async-sched-reuse", "pd-reuse"])
def test_trace_hash_is_the_same_under_pythonhashseed_1_and_2(args: tuple[str, ...]) -> None:
    one = _run_in_subprocess("1", *args)
    two = _run_in_subprocess("2", *args)
    assert one["events"] > 0
    assert one == two, "the whole document, trace hash included, must not depend on hash()"


def test_the_subprocess_and_this_process_agree() -> None:
    doc = _run_in_subprocess("3", "abort-reuse", "-p", "internal-id", "--witness", "--seed", "9")
    here = run_scenario(load_scenario("abort-reuse"), "internal-id", witness=True, seed=9)
    assert (doc["trace_hash"], doc["events"]) == (here.trace_hash, here.events)


@pytest.mark.parametrize("scenario", ["abort-reuse", "async-sched-reuse", "pd-reuse",
                                      "abort-storm"])
def test_two_runs_in_one_process_are_identical(scenario: str) -> None:
    scen = load_scenario(scenario)
    first = run_scenario(scen, "internal-id", witness=True, seed=4)
    second = run_scenario(scen, "internal-id", witness=True, seed=4)
    assert first.trace_hash == second.trace_hash
    assert first.trace == second.trace
    assert (first.violations, first.requests, first.schedule) == \
        (second.violations, second.requests, second.schedule)


def test_a_different_seed_gives_a_different_run_under_internal_id() -> None:
    scen = load_scenario("abort-reuse")
    hashes = {run_scenario(scen, "internal-id", seed=s).trace_hash for s in (0, 1, 2)}
    assert len(hashes) == 3, "the seed draws the internal-ID suffixes"


def test_replaying_a_runs_schedule_reproduces_its_trace() -> None:
    scen = load_scenario("abort-storm")
    witnessed = run_scenario(scen, "buggy", witness=True)
    assert witnessed.schedule, "the witness injects delays"
    replayed = run_scenario(scen, "buggy", schedule=witnessed.schedule)
    assert replayed.trace_hash == witnessed.trace_hash
    assert replayed.schedule == witnessed.schedule
