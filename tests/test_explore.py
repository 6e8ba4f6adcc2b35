"""Exploration: it finds the races with no hint, shrinks them, replays them, and its results do
not depend on how many workers ran them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import cli

from racesim.documents import read_counterexample
from racesim.explore import explore
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario


@pytest.fixture(scope="module")
def abort_reuse():  # type: ignore[no-untyped-def]
    # The seed-era model: on 0.33 the same search also finds latent two-delay schedules.
    return load_scenario("abort-reuse").with_vllm("0.8")


@pytest.mark.parametrize("strategy", ["random", "pct", "grid", "hypothesis"])
def test_every_strategy_finds_abort_reuse_and_shrinks_it_to_one_delay(
        abort_reuse, strategy: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    res = explore(abort_reuse, "buggy", strategy=strategy, budget=200, workers=1,
                  out_dir=tmp_path)
    assert res.baseline_violations == ("metrics-exact",)  # the standing gap, not the race
    assert res.counterexample is not None
    cx = res.counterexample
    races = {v["invariant"] for v in cx.violations} - {"metrics-exact"}
    assert races, cx.violations
    assert len(cx.schedule) == 1, cx.schedule
    assert cx.shrunk_from is not None and cx.shrunk_from >= 1
    assert res.first_violation_run is not None and res.first_violation_run > 0
    # The file on disk replays to the same trace hash.
    saved = read_counterexample(res.counterexample_path or "")
    assert saved.schedule == cx.schedule
    again = run_scenario(saved.scenario, saved.policy, options=saved.options, seed=saved.seed,
                         schedule=saved.schedule, skip=saved.skip)
    assert again.trace_hash == cx.trace_hash


def test_a_clean_result_states_its_confidence(abort_reuse) -> None:  # type: ignore[no-untyped-def]
    res = explore(abort_reuse, "internal-id", budget=60, workers=1, skip=["metrics-exact"])
    assert res.violating_runs == 0 and res.counterexample is None
    conf = res.confidence()
    assert conf["rule_of_three"] == pytest.approx(3 / 60)
    assert res.distinct_traces > 1
    assert "frontend.abort:after_pop" in res.coverage


def test_pct_reports_its_bound(abort_reuse) -> None:  # type: ignore[no-untyped-def]
    res = explore(abort_reuse, "internal-id", strategy="pct", budget=30, workers=1,
                  skip=["metrics-exact"])
    info = res.strategy_info
    assert info["d"] == 2 and info["n"] >= 5 and info["k"] >= 40
    assert info["bound"] == pytest.approx(1 / (info["n"] * info["k"]))
    assert res.confidence()["pct_bound"] == info["bound"]


def test_workers_do_not_change_the_result() -> None:
    scen = load_scenario("async-sched-reuse")
    one = explore(scen, "buggy", budget=80, seed=3, workers=1).document()
    two = explore(scen, "buggy", budget=80, seed=3, workers=2).document()
    for doc in (one, two):
        doc.pop("elapsed_s")
    assert one == two
    assert one["counterexample"] is not None


def test_dask_gives_the_same_result_as_one_worker() -> None:
    distributed = pytest.importorskip("distributed")
    scen = load_scenario("abort-reuse")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        remote = explore(scen, "buggy", budget=40, workers=None,
                         dask=cluster.scheduler_address).document()
    local = explore(scen, "buggy", budget=40, workers=1).document()
    for doc in (remote, local):
        doc.pop("elapsed_s")
    assert remote == local


def test_the_counterexample_is_on_disk_before_shrinking(abort_reuse, tmp_path: Path,
                                                       monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import racesim.explore as ex

    def broken_shrink(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("shrinker crashed")

    monkeypatch.setattr(ex, "shrink", broken_shrink)
    with pytest.raises(RuntimeError):
        explore(abort_reuse, "buggy", budget=50, workers=1, out_dir=tmp_path)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    found = read_counterexample(str(files[0]))
    assert found.shrunk_from is None and found.schedule


def test_an_exploration_never_replaces_another_ones_file(abort_reuse, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first = explore(abort_reuse, "buggy", strategy="pct", budget=40, out_dir=tmp_path)
    assert first.counterexample_path and first.counterexample
    kept = Path(first.counterexample_path).read_text(encoding="utf-8")
    # another budget, then another profile: new files beside it, the shrunk race is kept
    other = explore(abort_reuse, "buggy", strategy="pct", budget=2, out_dir=tmp_path)
    newer = explore(abort_reuse.with_vllm("0.33"), "buggy", strategy="pct", budget=2,
                    out_dir=tmp_path)
    paths = {first.counterexample_path, other.counterexample_path, newer.counterexample_path}
    assert len(paths) == 3 and Path(first.counterexample_path).read_text(encoding="utf-8") == kept
    # the same exploration again replaces its own file and nothing else
    again = explore(abort_reuse, "buggy", strategy="pct", budget=2, out_dir=tmp_path)
    assert again.counterexample_path == other.counterexample_path
    assert len(list(tmp_path.glob("*.json"))) == 3
    # a file racesim did not write is never replaced
    mine = tmp_path / "mine"
    mine.mkdir()
    foreign = mine / Path(first.counterexample_path).name
    foreign.write_text("my notes\n", encoding="utf-8")
    moved = explore(abort_reuse, "buggy", strategy="pct", budget=2, out_dir=mine)
    assert foreign.read_text(encoding="utf-8") == "my notes\n"
    assert moved.counterexample_path and Path(moved.counterexample_path).parent == mine
    assert Path(moved.counterexample_path).name.endswith("-2.json")


def test_replay_reproduces_the_hash_from_another_folder(abort_reuse, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    res = explore(abort_reuse, "buggy", strategy="pct", budget=100, workers=1,
                  out_dir=tmp_path / "out")
    assert res.counterexample_path is not None
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run([sys.executable, "-m", "racesim", "replay",
                           str(Path(res.counterexample_path).resolve()), "--json"],
                          cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["trace_hash"] == res.counterexample.trace_hash  # type: ignore[union-attr]


def test_explore_cli_json_and_exit_codes(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "racesim", "explore", "abort-reuse", "--budget", "60",
            "--workers", "1", "--out", str(tmp_path), "--json"]
    bad = subprocess.run([*base, "-p", "buggy"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    doc = json.loads(bad.stdout)
    for key in ("scenario", "policy", "strategy", "runs", "violating_runs",
                "first_violation_run", "elapsed_s", "counterexample", "confidence"):
        assert key in doc
    assert doc["counterexample"]["path"]
    clean = subprocess.run([*base, "-p", "internal-id", "--skip", "metrics-exact"],
                           capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0, clean.stdout
    assert json.loads(clean.stdout)["confidence"]["rule_of_three"] == pytest.approx(3 / 60)


def test_matrix_cells_come_from_running(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "racesim", "matrix", "-s", "multi-frontend",
                           "-p", "buggy", "-p", "internal-id", "--budget", "10", "--workers",
                           "1", "--out", str(tmp_path), "--json", "--fail-on-race"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr  # a racing cell, and --fail-on-race
    cells = {(c["scenario"], c["policy"]): c for c in json.loads(proc.stdout)["cells"]}
    # vLLM 0.33 (the default): the second API server's duplicate ADD fails the scheduler's
    # "duplicate request id" assert with no delay at all, a live race.
    buggy = cells[("multi-frontend", "buggy")]
    assert "engine-alive" in buggy["invariants"] and buggy["vllm"] == "0.33"
    assert (buggy["reach"], buggy["verdict"], buggy["label"]) == ("live", "race", "live race")
    assert cells[("multi-frontend", "internal-id")]["invariants"] == []
    assert cells[("multi-frontend", "internal-id")]["label"] == "not found in 10 runs"
    assert cells[("multi-frontend", "internal-id")]["runs"] == 10


def test_a_race_at_run_0_is_the_verdict_and_the_counterexample_only_what_a_delay_adds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # #25067 on the 0.10 profile dies with no perturbation at all; the shrunk counterexample is
    # a latent delay that violates more, so its reach must not read as the verdict's.
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli(capsys, "explore", "25067-disconnect-after-prefill", "-p", "buggy",
                       "--vllm", "0.10", "--budget", "20")
    assert code == 1
    reach = next(line for line in out.splitlines() if line.startswith("│ reach"))
    assert "run 0, with no perturbation, violates engine-alive: live race" in reach, reach
    assert "beyond it, latent hazard" in reach, reach
    assert "counterexample beyond run 0" in out
