"""Issue 22 item 4: explorations sharing an --out folder never overwrite each other's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import racesim.explore as explore_module
from racesim.cli import main
from racesim.explore import explore
from racesim.scenarios import load_scenario

_SCRIPT = Path(sys.executable).with_name("racesim")
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "racesim"]


def test_a_name_taken_after_it_was_chosen_is_not_overwritten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process writes the chosen name between our choice and our write (the window
    two concurrent explores share): ours goes to the next free name."""
    real = explore_module.free_path
    foreign = {"format": "racesim-counterexample/1", "found_by": {"exploration": "another"}}

    def choose_then_lose(path: Path, ours: Any) -> Path:
        chosen = real(path, ours)
        chosen.write_text(json.dumps(foreign))  # the other exploration wins the race
        return chosen

    monkeypatch.setattr(explore_module, "free_path", choose_then_lose)
    res = explore(load_scenario("abort-reuse"), "buggy", budget=20, workers=1, out_dir=tmp_path)
    taken = tmp_path / "abort-reuse__buggy__random__seed0.json"
    assert json.loads(taken.read_text()) == foreign
    assert res.counterexample_path == str(taken.with_name(taken.stem + "-2.json"))
    assert json.loads(Path(res.counterexample_path).read_text())["shrunk_from"] is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([taken.name,
                                                                 taken.stem + "-2.json"])


def test_concurrent_explores_into_one_folder_keep_every_counterexample(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    budgets = (11, 12, 13, 14)  # distinct explorations: none may replace another's file
    procs = [subprocess.Popen([*COMMAND, "explore", "abort-reuse", "--budget", str(b),
                               "--workers", "1", "--out", str(tmp_path), "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for b in budgets]
    docs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 1, err
        docs.append(json.loads(out))
    paths = [d["counterexample"]["path"] for d in docs]
    assert len(set(paths)) == len(budgets), paths
    for budget, path in zip(budgets, paths, strict=True):
        assert json.loads(Path(path).read_text())["found_by"]["exploration"]["budget"] == budget
    assert len(list(tmp_path.glob("*.json"))) == len(budgets)


def test_explore_html_inside_an_out_folder_that_does_not_exist_yet(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "new"
    with pytest.raises(SystemExit) as exit_:
        main(["explore", "abort-reuse", "-p", "internal-id", "--budget", "3", "--workers", "1",
              "--out", str(out), "--html", str(out / "r.html")])
    err = capsys.readouterr().err
    assert exit_.value.code == 0, err
    assert (out / "r.html").is_file()


def test_matrix_html_inside_an_out_folder_that_does_not_exist_yet(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "new"
    with pytest.raises(SystemExit) as exit_:
        main(["matrix", "-s", "abort-reuse", "-p", "internal-id", "--budget", "2",
              "--workers", "1", "--out", str(out), "--html", str(out / "m.html")])
    assert exit_.value.code == 0, capsys.readouterr().err
    assert (out / "m.html").is_file()
