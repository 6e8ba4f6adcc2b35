"""Issue 22 item 2: a delay that never applied, a misspelled point, clashing outputs and an
early stop are said, not silently ignored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from _cli import cli as _cli, one_line_error as _one_line_error

_SCRIPT = Path(sys.executable).with_name("racesim")
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "racesim"]




def _scenario(tmp_path: Path, extra: str) -> str:
    text = (Path(__file__).parents[1] / "scenarios" / "bundled" / "abort-reuse.toml").read_text()
    path = tmp_path / "s.toml"
    path.write_text(text + "\n" + extra)
    return str(path)


@pytest.mark.parametrize("table", ["delays", "witness"])
def test_an_unknown_point_in_a_scenario_table_is_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str) -> None:
    text = (Path(__file__).parents[1] / "scenarios" / "bundled" / "abort-reuse.toml").read_text()
    text = text.replace("[witness]\n", "").replace('"frontend.abort:after_pop" = 0.05', "")
    path = tmp_path / "s.toml"
    path.write_text(text + f'\n[{table}]\n"frontend.abort:afterpop" = 0.05\n')
    code, _out, err = _cli(capsys, "run", str(path), "--witness")
    _one_line_error(code, err, "frontend.abort:afterpop", table)


def test_an_unknown_delay_point_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = _cli(capsys, "run", "abort-reuse", "--delay", "frontend.abort:afterpop=1")
    _one_line_error(code, err, "frontend.abort:afterpop")


def test_a_delay_at_a_point_no_event_reached_is_warned_after_the_run(
        capsys: pytest.CaptureFixture[str]) -> None:
    # abort-reuse is single-topology: no event ever passes the P/D proxy
    code, _out, err = _cli(capsys, "run", "abort-reuse", "--delay", "pd.kv:read=0.1",
                           "--skip", "metrics-exact")
    assert code == 0
    assert "pd.kv:read" in err and "never" in err, err


def test_a_delay_at_an_occurrence_that_never_happened_is_warned(
        capsys: pytest.CaptureFixture[str]) -> None:
    # one abort in the scenario: frontend.abort:after_pop is passed once (occurrence 0)
    code, _out, err = _cli(capsys, "run", "abort-reuse", "--delay",
                           "frontend.abort:after_pop#5=0.05", "--skip", "metrics-exact")
    assert code == 0
    assert "frontend.abort:after_pop#5" in err and "1 time" in err, err
    code, _out, err = _cli(capsys, "run", "abort-reuse", "--delay",
                           "frontend.abort:after_pop#0=0.05", "--skip", "metrics-exact")
    assert "never" not in err and "warning: --delay" not in err, err


def test_scenario_delays_and_witness_at_unreached_points_are_warned(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _scenario(tmp_path, '[delays]\n"pd.proxy:after_prefill" = 0.01\n')
    code, _out, err = _cli(capsys, "run", path, "--witness", "--json")
    assert code == 1
    assert "[delays]" in err and "pd.proxy:after_prefill" in err, err
    _code, _out, err = _cli(capsys, "explore", path, "--budget", "2", "--workers", "1",
                          "--out", str(tmp_path / "o"), "--json")
    assert "pd.proxy:after_prefill" in err, err
    text = (Path(__file__).parents[1] / "scenarios" / "bundled" / "abort-reuse.toml").read_text()
    (tmp_path / "w.toml").write_text(text.replace('"frontend.abort:after_pop" = 0.05',
                                                  '"pd.kv:notify#3" = 0.05'))
    code, _out, err = _cli(capsys, "run", str(tmp_path / "w.toml"), "--witness")
    assert "[witness]" in err and "pd.kv:notify#3" in err, err


MISSPELLED = """\
from racesim.engine_model.policies import LifecyclePolicy


class Typo(LifecyclePolicy):
    name = "typo"
    summary = "sends its ABORT through a misspelled point"

    def abort(self, llm, request_ids):
        llm.output_processor.abort_requests(request_ids)
        yield from llm.send_abort(request_ids, "frontend.abort:afterpop")
"""


def test_a_policy_passing_a_misspelled_point_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "typo.py").write_text(MISSPELLED)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([*COMMAND, "run", "abort-reuse", "-p", "typo:Typo"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    _one_line_error(proc.returncode, proc.stderr, "frontend.abort:afterpop", "typo:Typo")


@pytest.mark.parametrize("command", ["run", "replay"])
def test_html_and_trace_naming_one_file_is_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    target = "abort-reuse"
    if command == "replay":
        _cli(capsys, "explore", "abort-reuse", "--budget", "5", "--workers", "1",
             "--out", str(tmp_path))
        target = str(next(tmp_path.glob("*.json")))
    same = tmp_path / "r.out"
    code, _out, err = _cli(capsys, command, target, "--html", str(same), "--trace",
                           str(tmp_path / "." / "r.out"))
    _one_line_error(code, err, "--html", "--trace", "r.out")
    assert not same.exists()


def test_explore_says_why_it_stopped_before_the_budget(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _code, out, _err = _cli(capsys, "explore", "abort-reuse", "-p", "internal-id",
                            "--strategy", "grid", "--budget", "100000", "--workers", "1",
                            "--out", str(tmp_path), "--json")
    doc: dict[str, Any] = json.loads(out)
    assert doc["runs"] < 100000
    assert "grid" in doc["stopped_early"] and str(doc["runs"]) in doc["stopped_early"]
    _code, out, _err = _cli(capsys, "explore", "abort-reuse", "-p", "internal-id", "--strategy",
                          "grid", "--budget", "100000", "--workers", "1", "--out",
                          str(tmp_path))
    assert "stopped" in out and "grid" in out and "100000" in out


def test_hypothesis_says_why_it_stopped_before_the_budget(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _code, out, _err = _cli(capsys, "explore", "abort-reuse", "--strategy", "hypothesis",
                           "--budget", "5000", "--out", str(tmp_path), "--json")
    doc = json.loads(out)
    assert doc["runs"] < 5000 and "hypothesis" in doc["stopped_early"]


def test_a_full_budget_says_nothing_about_stopping(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _code, out, _err = _cli(capsys, "explore", "abort-reuse", "--budget", "5", "--workers", "1",
                           "--out", str(tmp_path), "--json")
    doc = json.loads(out)
    assert doc["runs"] == 5 and doc["stopped_early"] is None


def test_matrix_says_which_cells_stopped_before_the_budget(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = _cli(capsys, "matrix", "-s", "abort-reuse", "-p", "internal-id",
                           "--strategy", "grid", "--budget", "100000", "--workers", "1",
                           "--out", str(tmp_path))
    assert code == 0
    assert "stopped before --budget" in out and "grid" in out, out
