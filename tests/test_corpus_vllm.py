"""``racesim corpus`` on the vllm backend: deterministic, and the README's table is what the
command prints for the releases installed here (README "The bug corpus")."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.vllm


def _corpus(*args: str, seed: str = "0") -> dict[str, Any]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    proc = subprocess.run([sys.executable, "-m", "racesim", "corpus", *args, "--json"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=1800,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _without_seconds(value: Any) -> Any:
    """The document with every wall-clock figure left out (they alone may differ)."""
    if isinstance(value, dict):
        return {k: _without_seconds(v) for k, v in value.items()
                if not k.endswith("_s") and k != "counterexample"}
    if isinstance(value, list):
        return [_without_seconds(v) for v in value]
    return value


def test_same_seed_same_result_in_another_process(vllm_backend: object, tmp_path: Path) -> None:
    args = ("42492-cancel-resubmit-async", "--budget", "15", "--model-budget", "15",
            "--out", str(tmp_path))
    first = _corpus(*args, seed="0")
    second = _corpus(*args, seed="4242")
    assert first["entries"][0]["fixed"]["status"] in ("clean", "not clean")
    assert _without_seconds(first) == _without_seconds(second)


def _readme_rows() -> dict[str, list[str]]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- table: corpus -->\n", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in block.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[1]] = cells
    return rows


def test_the_readme_table_is_what_racesim_corpus_prints(vllm_backend: object,
                                                         tmp_path: Path) -> None:
    """Every entry is in the README; each cell of a release that ran here (installed, or in a
    venv under RACESIM_VLLM_VENVS) and every model cell equal the command's output with its
    default options."""
    from racesim.cli.corpus import markdown_table

    doc = _corpus("--out", str(tmp_path))
    printed = {}
    for line in markdown_table(doc).splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        printed[cells[1]] = cells
    readme = _readme_rows()
    assert set(readme) == set(printed)
    ran = 0
    for e in doc["entries"]:
        mine, theirs = readme[e["name"]], printed[e["name"]]
        assert mine[:4] == theirs[:4] and mine[6] == theirs[6]  # issue, entry, releases
        assert mine[5] == theirs[5], e["name"]  # the model (runs in this process)
        if e["buggy"]["status"] not in ("skipped", "not run"):
            assert mine[4] == theirs[4], e["name"]
            ran += 1
        if e["fixed"]["status"] not in ("skipped", "not run"):
            assert mine[7] == theirs[7], e["name"]
            ran += 1
    assert ran > 0
    assert re.search(r"found \d+ of \d+", (REPO / "README.md").read_text(encoding="utf-8"))
