"""The README's reference examples run as written: the scenario file, the plugin, the strategies.

Each example is the code block after an ``<!-- example: NAME -->`` line.
"""

from __future__ import annotations

import re
from pathlib import Path

import hypothesis  # noqa: F401  (imported once here: pytester drops modules an inner run imports)
import pytest

from racesim.cli import main
from racesim.scenarios import bundled_names, load_scenario

pytest_plugins = ["pytester"]

README = Path(__file__).parents[1] / "README.md"


def example(name: str) -> str:
    text = README.read_text(encoding="utf-8")
    m = re.search(rf"<!-- example: {name} -->\n```\w+\n(.*?)\n```", text, re.S)
    assert m, f"README has no example {name!r}"
    return m.group(1) + "\n"


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


def test_the_strategies_example_runs() -> None:
    exec(compile(example("strategies"), "README:strategies", "exec"), {"__name__": "readme"})


def test_the_exit_status_text_is_the_contract() -> None:
    text = README.read_text(encoding="utf-8")
    assert "0 no violation, 1 a violation was found" not in text
    assert "the race closed" not in text
    assert "| 130 |" in text and "--fail-on-race" in text and "--allow-import" in text


def test_the_findings_table_is_what_the_simulator_shows() -> None:
    """Every cell of the README's findings table, recomputed on the default profile (0.33)
    from the no-delay and the witness run,
    and ``suffix_hex=0`` (randomization disabled) gives buggy's verdict in every row."""
    from racesim.reports.verdict import reach_label
    from racesim.runner import run_scenario

    text = README.read_text(encoding="utf-8")
    block = text.split("<!-- table: findings -->\n", 1)[1].split("\n\n", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()]
    header, body = rows[0], rows[2:]
    assert header[0] == "scenario" and sorted(r[0] for r in body) == sorted(bundled_names())

    severity = ["safe", "accounting gap", "latent hazard", "live race"]

    def label(name: str, policy: str, **options: str) -> str:
        # the more severe of the unperturbed run and the witness run
        scen = load_scenario(name)
        cells = []
        for witness in dict.fromkeys((False, bool(scen.witness))):
            r = run_scenario(scen, policy, options=options, witness=witness)
            cells.append(reach_label(r.violated, r.reach().reach if r.violations else None))
        return max(cells, key=severity.index)

    for row in body:
        assert [label(row[0], p) for p in header[1:]] == row[1:], row[0]
        assert label(row[0], "internal-id", suffix_hex="0") == row[1], row[0]
