"""One numbering: a request ID's incarnations are 1, 2, 3... in order of first appearance in
everything a person reads (the terminal, the run and explore HTML reports, RaceFound
messages), and a run's narration never contradicts its own violations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from racesim.cli import main
from racesim.engine_model.events import FeAdd
from racesim.engine_model.narrate import describe
from racesim.plugin import RaceFound, RaceSim
from racesim.reports.model import reader_numbers, relabel_incs
from racesim.runner import run_scenario
from racesim.scenarios import bundled_names, load_scenario

_INC = re.compile(r"\binc (\d+)")


def test_the_explore_report_numbers_incarnations_from_1(tmp_path: Path) -> None:
    """abort-reuse has two incarnations of X (the model numbers them 3 and 4)."""
    html = tmp_path / "r.html"
    with pytest.raises(SystemExit):
        main(["explore", "abort-reuse", "--budget", "50", "--out", str(tmp_path),
              "--html", str(html)])
    text = html.read_text(encoding="utf-8")
    shown = {int(n) for n in _INC.findall(text)}
    assert shown and shown <= {1, 2}, sorted(shown)


def test_race_found_numbers_incarnations_from_1() -> None:
    with pytest.raises(RaceFound) as info:
        RaceSim(seed=0, report_dir=None, test="t").check("abort-reuse", "buggy", witness=True)
    shown = {int(n) for n in _INC.findall(str(info.value))}
    assert shown == {1}, str(info.value)  # "received a token generated for inc 1"


@pytest.mark.parametrize("name", bundled_names())
def test_the_narration_does_not_contradict_the_violations(name: str) -> None:
    """An add the frontend never registered (vLLM 0.33 takes an add of a held ID as that
    state's streaming update) is not narrated as "registers request_states[...]"."""
    scenario = load_scenario(name)
    result = run_scenario(scenario, "buggy", witness=bool(scenario.witness))
    numbers = reader_numbers(result.trace)
    registered = set()
    for e in result.trace:
        text = describe(e)
        if isinstance(e.detail, FeAdd) and e.detail.tracked is False:
            assert "registers" not in text and "never registered" in text, text
        elif "registers request_states" in text:
            registered.add(numbers[e.inc])
    for v in result.violations:
        detail = relabel_incs(v.detail, numbers)
        if "never registered" in detail:
            first = _INC.search(detail)
            assert first is not None and int(first.group(1)) not in registered, detail
