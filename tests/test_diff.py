"""``racesim diff`` and the fixture's ``explore()``/``diff()``.

The diff tests change vLLM's own Scheduler (code that runs in the World today): a patch that
drops an abort of a request that is not running yet must open ``frontend-covers-engine``
(vLLM's engine keeps a request its frontend no longer has), the empty patch must open nothing,
and the converse comparison must close what the patch opened. Each diff starts two worker
processes that import vLLM (20-70 s each on a busy machine), so the budgets are small.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import cli, one_line_error
from test_backend import _drop_waiting_abort

from racesim.diff import diff
from racesim.runner import resolve_backend
from racesim.scenarios import load_scenario


def _racesim(command: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """A printed ``racesim ...`` command, run as printed (through this interpreter)."""
    words = shlex.split(command)
    assert words[0] == "racesim"
    return subprocess.run([sys.executable, "-m", "racesim", *words[1:]], capture_output=True,
                          text=True, timeout=900, cwd=tmp_path,
                          env={**__import__("os").environ,
                               "RACESIM_CACHE": str(tmp_path / "cache")})


@pytest.mark.vllm
def test_a_patch_that_drops_an_abort_opens_a_live_race_shrunk_and_replayable(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RACESIM_CACHE", str(tmp_path / "cache"))
    patch = _drop_waiting_abort(tmp_path)
    code, out, err = cli(capsys, "diff", "-s", "abort-storm", "-p", "internal-id", "--budget",
                         "10", "--vllm-patch", str(patch), "--out", str(tmp_path / "out"),
                         "--json", "--html", str(tmp_path / "diff.html"))
    assert code == 1, err
    doc = json.loads(out)
    cell, = doc["cells"]
    assert doc["opens_live_race"] and doc["candidate"]["sha256"]
    opened = {c["invariant"]: c for c in cell["opens"]}
    change = opened["frontend-covers-engine"]
    assert change["reach"] == "live" and change["verdict"] == "race"
    assert change["shrink_runs"] > 0 and change["requests"] <= 2  # shrunk from 60 clients
    assert "frontend-covers-engine" not in cell["unchanged"] and not cell["closes"]
    cx = json.loads(Path(change["counterexample"]).read_text())
    assert cx["vllm_tree"]["kind"] == "patch" and cx["vllm_tree"]["sha256"] == \
        doc["candidate"]["sha256"]
    assert "--vllm-patch" in change["replay"]
    replayed = _racesim(change["replay"], tmp_path)
    assert replayed.returncode == 1, replayed.stderr[-2000:]
    assert "frontend-covers-engine" in replayed.stdout
    assert "frontend-covers-engine" in (tmp_path / "diff.html").read_text()
    # replay checks the recorded patch: an edited diff is refused in one line
    patch.write_text(patch.read_text() + "\n")
    code, _, err = cli(capsys, "replay", change["counterexample"])
    one_line_error(code, err, "recorded on --vllm-patch", "changed since")


@pytest.mark.vllm
def test_the_empty_patch_opens_nothing_and_the_converse_closes_what_the_patch_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, racesim: object) -> None:
    monkeypatch.setenv("RACESIM_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # the fixture's files go to racesim-out/ here
    patch = _drop_waiting_abort(tmp_path)
    empty = tmp_path / "empty.diff"
    empty.write_text("")
    scen = load_scenario("abort-storm")
    res = diff([scen], ["internal-id"], baseline=resolve_backend(patch=str(patch)),
               candidate=resolve_backend(patch=str(empty)), budget=8, out_dir=tmp_path)
    cell, = res.cells
    assert not cell.opens and not res.opens_live_race
    assert "frontend-covers-engine" in {c.invariant for c in cell.closes}
    # the fixture: the unchanged release against itself is a clean run, an empty list
    assert racesim.diff("abort-storm", vllm_patch=str(empty), budget=4) == []  # type: ignore[attr-defined]


def test_the_fixture_explores_with_reach_and_prints_a_replay_command_that_works(
        tmp_path: Path, racesim: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    clean = racesim.explore("abort-reuse", "internal-id", reach="live", budget=20,  # type: ignore[attr-defined]
                            skip=["metrics-exact"])
    assert clean == []
    found = racesim.explore("abort-reuse", "buggy", budget=30, skip=["metrics-exact"])  # type: ignore[attr-defined]
    assert found and found[0].counterexample.startswith(str(tmp_path / "racesim-out"))
    assert f"replay: {found[0].replay}" in repr(found[0])
    replayed = _racesim(found[0].replay, tmp_path)
    assert replayed.returncode == 1 and set(found[0].invariants) & set(replayed.stdout.split())


def test_diff_needs_a_candidate(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "diff", "-s", "abort-storm")
    one_line_error(code, err, "--vllm-src DIR or --vllm-patch FILE")
