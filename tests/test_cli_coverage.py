"""Issue 28 item 4: what a search reached, honest words for what it did not find, and
``--check-determinism``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _cli import cli
from racesim.runner import run_scenario
from racesim.runner.determinism import check_determinism
from racesim.scenarios import load_scenario


def test_explore_reports_what_it_reached_and_says_not_found(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = cli(capsys, "explore", "abort-storm", "-p", "internal-id", "--reach",
                          "live", "--skip", "metrics-exact", "--skip", "abort-isolation",
                          "--budget", "20", "--workers", "1", "--out", str(tmp_path), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["verdict"] == "safe"  # the old field, for old readers
    assert doc["finding"] == "not found in 20 runs" and doc["exhaustive"] is False
    reached = doc["reached"]
    # --reach live leaves the latent sends alone; a P/D-free scenario never reads from P
    assert "frontend.abort:after_pop" in reached["not_delayable"]
    assert "pd.kv:read" in reached["never_passed"]
    assert {"kv-destination", "stranded-hold"} <= set(reached["invariants_never_evaluated"])
    assert "unique-live-id" in reached["invariants_evaluated"]
    assert 0 < reached["windows_opened"] <= reached["windows_available"]
    code, out, _err = cli(capsys, "explore", "abort-storm", "-p", "internal-id", "--reach",
                          "live", "--skip", "metrics-exact", "--skip", "abort-isolation",
                          "--budget", "20", "--workers", "1", "--out", str(tmp_path))
    text = " ".join(out.split())
    assert "not found in 20 runs" in text and "never evaluated" in text
    assert "verdict safe" not in text.replace("│", "")


def test_only_an_exhaustive_grid_says_safe(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = cli(capsys, "explore", "abort-storm", "-p", "internal-id", "--reach",
                          "live", "--skip", "metrics-exact", "--skip", "abort-isolation",
                          "--strategy", "grid", "--budget", "100000", "--workers", "1",
                          "--out", str(tmp_path), "--json")
    doc = json.loads(out)
    assert doc["exhaustive"] is True, doc["stopped_early"]
    assert doc["invariants"] == []
    assert doc["finding"] == f"safe (exhaustive: all {doc['runs']} grid schedules)"


def test_check_determinism_agrees_and_shows_a_difference(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = cli(capsys, "run", "abort-reuse", "-p", "buggy", "--witness",
                          "--check-determinism", "--json")
    assert json.loads(out)["determinism"]["same"] is True and code == 1
    scen = load_scenario("abort-reuse")
    first = run_scenario(scen, "buggy", witness=True)
    det = check_determinism(first, lambda: run_scenario(scen, "buggy", witness=True, seed=1))
    if det.same:  # the seed did not reach the trace: make a difference that must show
        det = check_determinism(first, lambda: run_scenario(scen, "shipped", witness=True))
    assert not det.same and det.index is not None
    assert det.first is not None and det.first == first.trace[det.index]
    assert f"first differing event: #{det.index}" in "\n".join(det.lines())
