"""Issue 22 item 1: the matrix and explore count runs that race apart from accounting gaps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _cli import cli as _cli
from racesim.explore import explore
from racesim.reports.verdict import ACCOUNTING, RACE, verdict
from racesim.runner import RunSpec
from racesim.scenarios import load_scenario
from racesim.sim.strategies import StrategyConfig, make_strategy



def _recount(budget: int) -> tuple[int, int]:
    """(racing, accounting-only) runs of abort-reuse x buggy, by running each run again."""
    scen = load_scenario("abort-reuse")
    spec = RunSpec.of(scen, "buggy")
    baseline = spec.run(retain_trace=False)
    strat = make_strategy("random", StrategyConfig(occurrences=baseline.occurrences,
                                                   scale=scen.workload.engine.step_time, seed=0))
    verdicts = [verdict(baseline.violated)]
    verdicts += [verdict(spec.run(decider=strat.decider(i), retain_trace=False).violated)
                 for i in range(1, budget)]
    return verdicts.count(RACE), verdicts.count(ACCOUNTING)


def test_explore_counts_racing_and_accounting_runs_apart() -> None:
    res = explore(load_scenario("abort-reuse"), "buggy", budget=30, workers=1)
    doc = res.document()
    racing, accounting = _recount(30)
    assert (doc["racing_runs"], doc["accounting_runs"]) == (racing, accounting)
    # every run of abort-reuse under buggy misses one abort in the stats; only some race
    assert doc["violating_runs"] == 30 == racing + accounting
    assert 0 < racing < 30


def test_matrix_shows_racing_runs_and_ends_with_a_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["matrix", "-s", "abort-reuse", "-s", "multi-frontend", "-p", "buggy",
            "-p", "internal-id", "--budget", "30", "--workers", "1", "--out",
            str(tmp_path / "cx")]
    code, out, _err = _cli(capsys, *argv, "--json")
    assert code == 0
    cells = {(c["scenario"], c["policy"]): c for c in json.loads(out)["cells"]}
    racing, accounting = _recount(30)
    cell = cells[("abort-reuse", "buggy")]
    assert (cell["racing_runs"], cell["accounting_runs"], cell["violating_runs"]) == \
        (racing, accounting, 30)
    code, out, _err = _cli(capsys, *argv, "--html", str(tmp_path / "m.html"))
    assert code == 0
    assert f"{racing}/30" in out and f"+{accounting} acct." in out
    tail = out.strip().splitlines()
    summary = next(line for line in tail if line.startswith("cells:"))
    n_race = sum(verdict(c["invariants"]) == RACE for c in cells.values())
    assert f"{n_race} racing" in summary and "latent" in summary and "not found" in summary
    assert any(line.startswith("counterexamples: ") and str(tmp_path / "cx") in line
               for line in tail), out
    assert any(line.startswith("report: ") and "m-cells" in line for line in tail), out
    html = (tmp_path / "m.html").read_text()
    assert f"✖ {racing} / 30 runs" in html
    assert f"and {accounting} runs with only an accounting gap" in html


def test_the_explore_report_splits_racing_and_accounting_runs(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    code, out, _err = _cli(capsys, "explore", "abort-reuse", "--budget", "30", "--workers", "1",
                           "--out", str(tmp_path), "--html", str(tmp_path / "e.html"))
    assert code == 1
    racing, accounting = _recount(30)
    assert f"30 of 30: {racing} racing, {accounting} accounting only" in " ".join(out.split())
    html = (tmp_path / "e.html").read_text()
    assert f"30 violating ({racing} racing, {accounting} accounting only)" in html
