"""The README's and docs/'s examples run as written: the scenario file, the plugin, the
strategies, the Python API, Dask on a local cluster; their links lead somewhere.

Each example is the code block after an ``<!-- example: NAME -->`` line, in README.md or in a
page under docs/; every such block is run by a test here (``EXAMPLES``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import hypothesis  # noqa: F401  (imported once here: pytester drops modules an inner run imports)
import pytest

from racesim.cli import main
from racesim.scenarios import bundled_names, load_scenario

pytest_plugins = ["pytester"]

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
#: The pages a newcomer reads: the README, then one reference topic per file under docs/.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
#: Every example block in PAGES, each run by a test below.
EXAMPLES = {"scenario", "plugin", "strategies", "python-api", "dask", "diff", "plugin-search"}
_EXAMPLE = re.compile(r"<!-- example: ([\w-]+) -->\n```\w+\n(.*?)\n```", re.S)


def example(name: str) -> str:
    found = [m.group(2) for page in PAGES
             for m in _EXAMPLE.finditer(page.read_text(encoding="utf-8")) if m.group(1) == name]
    assert len(found) == 1, f"README.md and docs/ have {len(found)} examples {name!r}"
    return found[0] + "\n"


def test_every_example_is_run_here() -> None:
    names = [m.group(1) for page in PAGES
             for m in _EXAMPLE.finditer(page.read_text(encoding="utf-8"))]
    assert sorted(names) == sorted(EXAMPLES)


def _corpus_command_exists() -> bool:
    from racesim.cli import cli
    return "corpus" in getattr(cli, "commands", {})


def test_every_relative_link_leads_to_a_file() -> None:
    """docs/corpus.md comes with ``racesim corpus`` (its own branch): until that command
    exists here, the README's link to it is the one allowed to lead nowhere."""
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            path = (page.parent / target).resolve()
            if path == ROOT / "docs" / "corpus.md" and not _corpus_command_exists():
                continue
            assert path.exists(), f"{page.name} links to {target}, which does not exist"


def test_the_scenario_example_loads_and_its_witness_opens_the_race(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(example("scenario"), encoding="utf-8")
    scen = load_scenario(str(path))
    assert scen.name == "my-reuse" and len(scen.workload.requests) == 2
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(path), "--witness"])
    assert exit_.value.code == 1 and "abort-precision" in capsys.readouterr().out


def test_the_plugin_example_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_example=example("plugin"))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_the_plugin_search_example_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_example=example("plugin-search"))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


@pytest.mark.vllm
def test_the_diff_example_opens_a_live_race(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import shlex

    from test_backend import _drop_waiting_abort

    _drop_waiting_abort(tmp_path)  # tmp_path/drop-waiting-abort.diff, as the example names it
    words = shlex.split(example("diff"))
    assert words[:2] == ["racesim", "diff"]
    done = subprocess.run([sys.executable, "-m", "racesim", *words[1:]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=1500,
                          env={**os.environ, "RACESIM_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 1, done.stderr[-2000:]
    assert "opens   frontend-covers-engine (live race" in done.stdout
    assert re.search(r"replay: racesim replay \S+ --engine vllm --vllm-patch "
                     r"\S*/drop-waiting-abort\.diff", done.stdout), done.stdout


def test_the_strategies_example_runs() -> None:
    exec(compile(example("strategies"), "README:strategies", "exec"), {"__name__": "readme"})


def test_the_python_api_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # it writes racesim-out/ where it runs
    exec(compile(example("python-api"), "docs:python-api", "exec"), {"__name__": "docs"})
    assert list((tmp_path / "racesim-out").glob("abort-reuse__buggy__pct__seed0.json"))


def test_the_dask_example_runs_on_a_local_cluster(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    script = tmp_path / "on_dask.py"
    script.write_text(example("dask"), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "200 runs; the first violation at run" in done.stdout


def test_the_exit_status_text_is_the_contract() -> None:
    text = "\n".join(page.read_text(encoding="utf-8") for page in PAGES)
    assert "0 no violation, 1 a violation was found" not in text
    assert "the race closed" not in text
    assert "| 130 |" in text and "--fail-on-race" in text and "--allow-import" in text


def test_the_findings_table_is_what_the_simulator_shows() -> None:
    """Every cell of the README's findings table, recomputed on the default profile (0.33)
    from the no-delay and the witness run; the shipped column leads; internal-id (8 hex) is
    the shipped column and ``suffix_hex=0`` (randomization disabled) buggy's, in every row.
    A cell with no violation says so ("no violation"), never "safe": two runs are no search."""
    from racesim.reports.verdict import reach_label
    from racesim.runner import run_scenario

    text = README.read_text(encoding="utf-8")
    block = text.split("<!-- table: findings -->\n", 1)[1].split("\n\n", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()]
    header, body = rows[0], rows[2:]
    assert header[0] == "scenario" and sorted(r[0] for r in body) == sorted(bundled_names())

    severity = ["no violation", "accounting gap", "latent hazard", "live race"]
    assert header[1:] == ["shipped", "buggy", "abort-scope", "engine-final"]

    def label(name: str, policy: str, **options: str) -> str:
        # the more severe of the unperturbed run and the witness run
        scen = load_scenario(name)
        cells = []
        for witness in dict.fromkeys((False, bool(scen.witness))):
            r = run_scenario(scen, policy, options=options, witness=witness)
            words = reach_label(r.violated, r.reach().reach if r.violations else None)
            cells.append("no violation" if words == "safe" else words)
        return max(cells, key=severity.index)

    for row in body:
        assert [label(row[0], p) for p in header[1:]] == row[1:], row[0]
        assert label(row[0], "internal-id") == row[1], row[0]
        assert label(row[0], "internal-id", suffix_hex="0") == row[2], row[0]
