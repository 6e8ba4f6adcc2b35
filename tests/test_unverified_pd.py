"""The 0.8 profile's P/D verdicts are unverified (0.8.5 ships no NixlConnector): run, replay,
matrix and the HTML report say so for a P/D scenario on 0.8, and only there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from racesim.cli import main
from racesim.engine_model.versions import unverified_note
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario

_NOTE = "unverified on vLLM 0.8: 0.8.5 ships no NixlConnector"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    code = exit_.value.code
    return (code if isinstance(code, int) else 1), " ".join(capsys.readouterr().out.split())


def test_the_note_is_for_pd_on_0_8_only() -> None:
    assert unverified_note("0.8", "pd").startswith(_NOTE)
    assert unverified_note("0.8", "single") == unverified_note("0.33", "pd") == ""
    assert run_scenario(load_scenario("pd-reuse").with_vllm("0.8"), "buggy").unverified
    assert not run_scenario(load_scenario("pd-reuse"), "buggy").unverified
    assert not run_scenario(load_scenario("duplicate-in-flight").with_vllm("0.8"),
                            "buggy").unverified


def test_run_says_it_for_a_race_and_for_a_safe_verdict(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out = cli(capsys, "run", "pd-reuse", "-p", "buggy", "--vllm", "0.8", "--witness")
    assert code == 1 and f"live race: reachable in vLLM 0.8 as released ({_NOTE}" in out
    code, out = cli(capsys, "run", "pd-reuse", "-p", "internal-id", "--vllm", "0.8")
    assert code == 0 and _NOTE in out
    code, out = cli(capsys, "run", "pd-reuse", "-p", "buggy", "--witness")
    assert code == 1 and "unverified" not in out
    code, out = cli(capsys, "run", "pd-reuse", "-p", "buggy", "--vllm", "0.8", "--json")
    assert json.loads(out)["unverified"].startswith(_NOTE)


def test_matrix_and_its_html_mark_the_pd_cells(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    html = tmp_path / "m.html"
    args = ["matrix", "-s", "pd-reuse", "-s", "duplicate-in-flight", "-p", "buggy",
            "--vllm", "0.8", "--budget", "2", "--out", str(tmp_path)]
    cli(capsys, *args, "--html", str(html))
    page = html.read_text(encoding="utf-8")
    assert page.count("(unverified)</span>") == 1 and "0.8.5 ships no NixlConnector" in page
    _, out = cli(capsys, *args, "--json")
    labels = {c["scenario"]: c["label"] for c in json.loads(out)["cells"]}
    assert labels["pd-reuse"].endswith(" (unverified)")
    assert "unverified" not in labels["duplicate-in-flight"]


def test_replay_and_the_run_report_say_it(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    code, _ = cli(capsys, "explore", "pd-reuse", "-p", "buggy", "--vllm", "0.8",
                  "--budget", "60", "--out", str(tmp_path))
    assert code == 1
    (cx,) = tmp_path.glob("*.json")
    report = tmp_path / "r.html"
    code, out = cli(capsys, "replay", str(cx), "--html", str(report))
    assert code == 1 and _NOTE in out
    assert "0.8.5 ships no NixlConnector" in report.read_text(encoding="utf-8")
