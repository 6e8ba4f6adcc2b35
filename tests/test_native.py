"""The compiled build (mypyc) and the pure-Python one: when each is used, and that both give
the same runs (README "Concepts": same inputs, same trace hash, in any process)."""

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

from racesim import sim
from racesim.sim._native import GUARDED, SourceFinder, decide

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


def _compiled_modules() -> list[str]:
    """setup.py's COMPILED list of module names (read from the file, not from a build)."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    (compiled,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                   and any(getattr(t, "id", "") == "COMPILED" for t in node.targets)]
    return list(ast.literal_eval(compiled))


def test_the_guarded_packages_are_the_ones_setup_py_compiles() -> None:
    modules = _compiled_modules()
    assert modules and {".".join(m.split(".")[:2]) for m in modules} == set(GUARDED)
    # racesim.sim.points is the top-level folder's sim/points.py (package-dir in pyproject)
    assert all(m.startswith("racesim.") for m in modules)
    assert all((ROOT / (m.removeprefix("racesim.").replace(".", "/") + ".py")).is_file()
               for m in modules)


def test_a_compiled_file_not_from_the_build_means_source(tmp_path: Path) -> None:
    manifest = _tree(tmp_path)
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / f"stray{_SUFFIX}").write_bytes(b"\0")  # left by another build
    native, why, _ = decide(manifest, tmp_path, {})
    assert not native and "sim/stray" in why and "not from this build" in why


def test_the_source_finder_loads_py_files(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("x = 1\n")
    finder = SourceFinder(["pkg"])
    spec = finder.find_spec("pkg.mod", [str(tmp_path / "pkg")])
    assert spec is not None and spec.origin == str(tmp_path / "pkg" / "mod.py")
    assert finder.find_spec("other.mod", [str(tmp_path / "pkg")]) is None
    assert finder.find_spec("pkg.missing", [str(tmp_path / "pkg")]) is None


# Line 1: which files the compiled modules were loaded from; line 2: the runs, as JSON text (so
# that an int against a float, 0 against 0.0, is a difference).
_PROBE = """
import importlib, json, sys
import racesim.engine_model.scheduler  # first, before anything imports sim by name
from racesim import sim
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario
from racesim.sim.strategies import StrategyConfig, make_strategy
names = sys.argv[1:]
files = {n: importlib.import_module(n).__file__ for n in names}
print(json.dumps({"native": sim.NATIVE, "files": files}))
runs = []
def seen(tag, r):
    runs.append([tag, r.trace_hash, r.events, r.sim_time, [v.as_dict() for v in r.violations],
                 [list(d) for d in r.schedule], [o.as_dict() for o in r.requests]])
for name, policy in (("abort-reuse", "buggy"), ("async-sched-reuse", "buggy"),
                     ("pd-reuse", "abort-scope"), ("parallel-sampling-abort", "engine-final")):
    s = load_scenario(name)
    for witness in (False, True):
        seen([name, policy, witness], run_scenario(s, policy, witness=witness))
    base = run_scenario(s, policy, retain_trace=False)
    for strategy in ("random", "grid"):
        st = make_strategy(strategy, StrategyConfig(base.occurrences,
                                                    s.workload.engine.step_time, 3))
        for i in range(1, 5):
            r = run_scenario(s, policy, decider=st.decider(i))
            seen([name, policy, strategy, i], r)
            seen([name, policy, strategy, i, "replayed"],
                 run_scenario(s, policy, schedule=r.schedule))
            seen([name, policy, strategy, i, "unkept"],
                 run_scenario(s, policy, decider=st.decider(i), retain_trace=False,
                              hash_trace=False))
print(json.dumps(runs))
"""


def _probe(pure: bool) -> tuple[dict[str, Any], str]:
    env = {k: v for k, v in os.environ.items() if k != "RACESIM_PURE"}
    if pure:
        env["RACESIM_PURE"] = "1"
    proc = subprocess.run([sys.executable, "-c", _PROBE, *_compiled_modules()],
                          capture_output=True, text=True, env=env, timeout=180, check=True)
    meta, runs = proc.stdout.strip().splitlines()
    doc: dict[str, Any] = json.loads(meta)
    return doc, runs


def test_racesim_pure_loads_every_module_from_source() -> None:
    meta, _ = _probe(pure=True)
    assert meta["native"] is False
    assert sorted(meta["files"]) == sorted(_compiled_modules())
    assert all(f.endswith(".py") for f in meta["files"].values()), meta["files"]


def test_compiled_and_source_builds_give_identical_runs() -> None:
    if not sim.NATIVE:
        if os.environ.get("RACESIM_REQUIRE_COMPILED") == "1":  # .ci/run sets it
            pytest.fail(f"the compiled build must be tested here, but this is {sim.build_info()}")
        pytest.skip(f"racesim is not compiled in this environment: {sim.build_info()}")
    compiled, compiled_runs = _probe(pure=False)
    assert compiled["native"] is True
    assert not any(f.endswith(".py") for f in compiled["files"].values()), compiled["files"]
    source, source_runs = _probe(pure=True)
    assert source["native"] is False
    assert len(json.loads(compiled_runs)) == 4 * (2 + 2 * 4 * 3)
    assert compiled_runs == source_runs, "the builds differ (compared as JSON text)"


def test_compiled_frozen_records_pickle_and_copy() -> None:
    """A compiled frozen class cannot be restored field by field: these pickle by constructor
    (exploration sends schedules and strategy configs to worker processes)."""
    import copy
    import pickle

    from racesim.engine_model.messages import (
        AbortMessage,
        EngineDead,
        KVDoneNotice,
        KVTransferParams,
    )
    from racesim.engine_model.points import POINTS
    from racesim.sim import Decision
    from racesim.sim.strategies import StrategyConfig

    records = [KVTransferParams(do_remote_decode=True, remote_block_ids=(1, 2)),
               AbortMessage(("X",), 3), EngineDead(0, "gone"), KVDoneNotice("X", 2),
               Decision("client.send", 1, 0.5), next(iter(POINTS)),
               StrategyConfig({"client.send": 2}, 0.01, seed=4, pct_depth=3)]
    for record in records:
        assert pickle.loads(pickle.dumps(record)) == record, record
        assert copy.deepcopy(record) == record, record
