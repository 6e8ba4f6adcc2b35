"""The compiled build (mypyc) and the pure-Python one: when each is used, and that both give
the same runs (DESIGN "Determinism rules": same inputs, same trace hash, in any process)."""

from __future__ import annotations

import ast
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
from sim._native import GUARDED, MANIFEST, SourceFinder, decide

ROOT = Path(__file__).resolve().parents[1]

_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _tree(tmp_path: Path, *, complete: bool = True, compiled: bool = True, shared: bool = True,
          source: bytes = b"x = 1\n") -> Path:
    """A fake install: pkg/mod.py, its compiled file, the shared library, and a manifest."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_bytes(source)
    if compiled:
        (tmp_path / "pkg" / f"mod{_SUFFIX}").write_bytes(b"\0")
    if shared:
        (tmp_path / f"grp__mypyc{_SUFFIX}").write_bytes(b"\0")
    manifest = tmp_path / "_native.json"
    manifest.write_text(json.dumps({"compiler": "mypyc", "complete": complete,
                                    "shared": "grp__mypyc", "modules": {
        "pkg.mod": {"source": "pkg/mod.py",
                    "sha256": hashlib.sha256(b"x = 1\n").hexdigest()}}}))
    return manifest


def test_compiled_modules_are_used_when_the_build_is_complete_and_current(
        tmp_path: Path) -> None:
    native, why, packages = decide(_tree(tmp_path), tmp_path, {"RACESIM_PURE": "0"})
    assert native, why
    assert packages == (*GUARDED, "pkg")


@pytest.mark.parametrize("case, expected", [
    ({"complete": False}, "did not compile"),
    ({"compiled": False}, "compiled pkg/mod.py is missing"),
    ({"shared": False}, "compiled library grp__mypyc is missing"),
    ({"source": b"x = 2\n"}, "pkg/mod.py changed since it was compiled"),
])
def test_anything_short_of_a_current_complete_build_loads_source(
        tmp_path: Path, case: dict[str, Any], expected: str) -> None:
    native, why, packages = decide(_tree(tmp_path, **case), tmp_path, {})
    assert not native and expected in why
    assert packages == (*GUARDED, "pkg"), "all modules of the compiled packages load from source"


def test_racesim_pure_forces_source(tmp_path: Path) -> None:
    native, why, _ = decide(_tree(tmp_path), tmp_path, {"RACESIM_PURE": "1"})
    assert not native and "RACESIM_PURE" in why


def test_without_a_readable_manifest_compiled_files_never_load(tmp_path: Path) -> None:
    assert decide(tmp_path / "_native.json", tmp_path, {}) == (False, "not compiled", GUARDED)
    (tmp_path / "_native.json").write_text("{not json")
    native, why, packages = decide(tmp_path / "_native.json", tmp_path, {})
    assert not native and "unreadable" in why and packages == GUARDED


def test_the_guarded_packages_are_the_ones_setup_py_compiles() -> None:
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    (compiled,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                   and any(getattr(t, "id", "") == "COMPILED" for t in node.targets)]
    modules = ast.literal_eval(compiled)
    assert modules and {m.split("/", 1)[0] for m in modules} == set(GUARDED)
    assert all((ROOT / m).is_file() for m in modules)


def test_the_source_finder_loads_py_files(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("x = 1\n")
    finder = SourceFinder(["pkg"])
    spec = finder.find_spec("pkg.mod", [str(tmp_path / "pkg")])
    assert spec is not None and spec.origin == str(tmp_path / "pkg" / "mod.py")
    assert finder.find_spec("other.mod", [str(tmp_path / "pkg")]) is None
    assert finder.find_spec("pkg.missing", [str(tmp_path / "pkg")]) is None


_PROBE = """
import json, sys
import engine_model.scheduler  # first, before anything imports sim by name
import sim
from sim._native import MANIFEST
from racesim.runner import run_scenario
from scenarios import load_scenario
from sim.strategies import StrategyConfig, make_strategy
names = sorted(json.loads(MANIFEST.read_text())["modules"]) if MANIFEST.exists() else []
out = {"native": sim.NATIVE, "files": {n: sys.modules[n].__file__ for n in names
                                        if n in sys.modules}, "runs": []}
def seen(tag, r):
    out["runs"].append([tag, r.trace_hash, r.events, repr(r.sim_time),
                        [v.as_dict() for v in r.violations], [tuple(d) for d in r.schedule]])
for name, policy in (("abort-reuse", "buggy"), ("async-sched-reuse", "buggy"),
                     ("pd-reuse", "abort-scope"), ("parallel-sampling-abort", "engine-final")):
    s = load_scenario(name)
    for witness in (False, True):
        seen([name, policy, witness], run_scenario(s, policy, witness=witness))
    base = run_scenario(s, policy, retain_trace=False)
    st = make_strategy("random", StrategyConfig(base.occurrences, s.workload.engine.step_time, 3))
    for i in range(1, 6):
        seen([name, policy, i], run_scenario(s, policy, decider=st.decider(i)))
        seen([name, policy, i, "unkept"], run_scenario(s, policy, decider=st.decider(i),
                                                        retain_trace=False, hash_trace=False))
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
    assert doc["files"] or not MANIFEST.exists()
    assert all(f.endswith(".py") for f in doc["files"].values()), doc["files"]


def test_compiled_and_source_builds_give_identical_runs() -> None:
    if not sim.NATIVE:
        if os.environ.get("CI") and os.environ.get("RACESIM_PURE", "") in ("", "0"):
            pytest.fail(f"CI must test the compiled build, but it runs {sim.build_info()}")
        pytest.skip(f"racesim is not compiled in this environment: {sim.build_info()}")
    compiled = _probe(pure=False)
    assert compiled["native"] is True
    assert len(compiled["files"]) == 17, "every compiled module is loaded by these runs"
    assert not any(f.endswith(".py") for f in compiled["files"].values()), compiled["files"]
    source = _probe(pure=True)
    assert len(compiled["runs"]) == 48
    assert compiled["runs"] == source["runs"]


def test_compiled_frozen_records_pickle_and_copy() -> None:
    """A compiled frozen class cannot be restored field by field: these pickle by constructor
    (exploration sends schedules and strategy configs to worker processes)."""
    import copy
    import pickle

    from engine_model.messages import AbortMessage, EngineDead, KVDoneNotice, KVTransferParams
    from engine_model.points import POINTS
    from sim import Decision
    from sim.strategies import StrategyConfig

    records = [KVTransferParams(do_remote_decode=True, remote_block_ids=(1, 2)),
               AbortMessage(("X",), 3), EngineDead(0, "gone"), KVDoneNotice("X", 2),
               Decision("client.send", 1, 0.5), next(iter(POINTS)),
               StrategyConfig({"client.send": 2}, 0.01, seed=4, pct_depth=3)]
    for record in records:
        assert pickle.loads(pickle.dumps(record)) == record, record
        assert copy.deepcopy(record) == record, record
