"""The compiled build (mypyc) and the pure-Python one: when each is used, and that both give
the same runs (DESIGN "Determinism rules": same inputs, same trace hash, in any process)."""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sim
from sim._native import decide

_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _tree(tmp_path: Path, *, complete: bool = True, compiled: bool = True,
          source: bytes = b"x = 1\n") -> Path:
    """A fake install: pkg/mod.py, its compiled file, and a manifest for them."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_bytes(source)
    if compiled:
        (tmp_path / "pkg" / f"mod{_SUFFIX}").write_bytes(b"\0")
    manifest = tmp_path / "_native.json"
    manifest.write_text(json.dumps({"compiler": "mypyc", "complete": complete, "modules": {
        "pkg.mod": {"source": "pkg/mod.py",
                    "sha256": hashlib.sha256(b"x = 1\n").hexdigest()}}}))
    return manifest


def test_compiled_modules_are_used_when_the_build_is_complete_and_current(
        tmp_path: Path) -> None:
    native, why, packages = decide(_tree(tmp_path), tmp_path, {})
    assert native, why
    assert packages == ("pkg",)


@pytest.mark.parametrize("case, expected", [
    ({"complete": False}, "did not compile"),
    ({"compiled": False}, "compiled pkg/mod.py is missing"),
    ({"source": b"x = 2\n"}, "pkg/mod.py changed since it was compiled"),
])
def test_anything_short_of_a_current_complete_build_loads_source(
        tmp_path: Path, case: dict[str, Any], expected: str) -> None:
    native, why, packages = decide(_tree(tmp_path, **case), tmp_path, {})
    assert not native and expected in why
    assert packages == ("pkg",), "every module of the compiled packages then loads from source"


def test_racesim_pure_forces_source(tmp_path: Path) -> None:
    native, why, _ = decide(_tree(tmp_path), tmp_path, {"RACESIM_PURE": "1"})
    assert not native and "RACESIM_PURE" in why


def test_no_manifest_means_nothing_was_compiled(tmp_path: Path) -> None:
    assert decide(tmp_path / "_native.json", tmp_path, {}) == (False, "not compiled", ())
    (tmp_path / "_native.json").write_text("{not json")
    native, why, packages = decide(tmp_path / "_native.json", tmp_path, {})
    assert not native and "unreadable" in why and packages == ()


_PROBE = """
import json, sys
import sim, engine_model.scheduler, sim.world
from racesim.runner import run_scenario
from scenarios import load_scenario
from sim.strategies import StrategyConfig, make_strategy
out = {"native": sim.NATIVE, "files": [engine_model.scheduler.__file__, sim.world.__file__],
       "runs": []}
for name, policy in (("abort-reuse", "buggy"), ("async-sched-reuse", "buggy"),
                     ("pd-reuse", "abort-scope"), ("parallel-sampling-abort", "engine-final")):
    s = load_scenario(name)
    for witness in (False, True):
        r = run_scenario(s, policy, witness=witness)
        out["runs"].append([name, policy, witness, r.trace_hash, list(r.violated), r.events])
    base = run_scenario(s, policy, retain_trace=False)
    st = make_strategy("random", StrategyConfig(base.occurrences, s.workload.engine.step_time, 3))
    for i in range(1, 6):
        r = run_scenario(s, policy, decider=st.decider(i))
        out["runs"].append([name, policy, i, r.trace_hash, list(r.violated), r.events])
print(json.dumps(out))
"""


def _probe(pure: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "RACESIM_PURE"}
    if pure:
        env["RACESIM_PURE"] = "1"
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          env=env, timeout=120, check=True)
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_racesim_pure_loads_every_module_from_source() -> None:
    doc = _probe(pure=True)
    assert doc["native"] is False
    assert all(f.endswith(".py") for f in doc["files"]), doc["files"]


def test_compiled_and_source_builds_give_identical_runs() -> None:
    if not sim.NATIVE:
        pytest.skip(f"racesim is not compiled in this environment: {sim.build_info()}")
    compiled = _probe(pure=False)
    assert compiled["native"] is True
    assert not any(f.endswith(".py") for f in compiled["files"]), compiled["files"]
    source = _probe(pure=True)
    assert len(compiled["runs"]) == 28
    assert compiled["runs"] == source["runs"]
