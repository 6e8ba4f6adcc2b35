"""Issue 28 item 2: the matrix leads with what each release ships, then the other
configurations, and says which question it answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _cli import cli


def test_the_first_table_is_the_shipped_configuration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["matrix", "-s", "abort-reuse", "-s", "duplicate-in-flight", "--budget", "5",
            "--workers", "1", "--out", str(tmp_path / "cx")]
    code, out, _err = cli(capsys, *args, "--json")
    doc = json.loads(out)
    assert code == 0
    assert doc["policies"] == ["shipped", "buggy", "abort-scope", "engine-final"]
    first, other = doc["tables"]
    assert first["policies"] == ["shipped"] and "vLLM 0.33.0 as shipped" in first["title"]
    assert other["policies"] == ["buggy", "abort-scope", "engine-final"]
    cells = {(c["scenario"], c["policy"]): c for c in doc["cells"]}
    assert cells[("abort-reuse", "shipped")]["ids"] == "release"
    assert cells[("abort-reuse", "buggy")]["ids"] == "given"
    assert cells[("duplicate-in-flight", "shipped")]["label"] == "not found in 5 runs"
    assert "reached" in cells[("duplicate-in-flight", "shipped")]
    code, out, _err = cli(capsys, *args, "--html", str(tmp_path / "m.html"))
    text = out.splitlines()
    assert text[0].startswith("What each release ships")
    assert any(line.startswith("Other configurations") for line in text)
    html = (tmp_path / "m.html").read_text()
    assert html.index("What each release ships") < html.index("Other configurations")


def test_the_readme_says_which_question_its_table_answers() -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert "This table answers: what do two fixed runs show?" in readme
    assert "`racesim matrix` answers another question" in readme
