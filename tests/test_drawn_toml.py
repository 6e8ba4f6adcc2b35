"""A hypothesis-drawn scenario that fails is printed as TOML that ``racesim run`` accepts: in
hypothesis's falsifying example and in the RaceFound message, with the command to run it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import _profiles  # noqa: F401  (the suite's hypothesis profile, before any @settings)
import pytest
from hypothesis import given, settings

from racesim.cli import main
from racesim.plugin import RaceFound, RaceSim
from racesim.scenarios.strategies import scenarios

HELD = ("frontend.abort:after_pop", None, 0.05)


def test_the_printed_toml_runs_and_shows_the_race(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    sim = RaceSim(seed=0, report_dir=None, test="drawn")

    @settings(max_examples=50, derandomize=True, database=None)
    @given(scenarios(topology="single", frontends=1, async_scheduling=False, id_pool=["X"],
                     min_requests=2, max_requests=3, max_start=0.1, allow_eos=False,
                     allow_disconnects=False, allow_stop_strings=False, allow_n=False))
    def drawn(scen: object) -> None:
        sim.check(scen, "buggy", delays=[HELD])  # type: ignore[arg-type]

    with pytest.raises(RaceFound) as info:
        drawn()
    # what pytest prints: the message, then hypothesis's falsifying example (its notes)
    message = str(info.value)
    example = "\n".join(getattr(info.value, "__notes__", []))
    printed = re.search(r'parse_scenario\(r"""\n(.*?)""", ', example, re.S)
    assert printed, example
    command = re.search(r"replay: save the scenario TOML below as (\S+), then: (racesim run .*)",
                        message)
    assert command, message
    toml = message.split("scenario TOML:\n", 1)[1]
    assert toml.strip() == printed.group(1).strip()
    monkeypatch.chdir(tmp_path)
    Path(command.group(1)).write_text(toml + "\n", encoding="utf-8")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(shlex.split(command.group(2))[1:])
    assert exit_.value.code == 1, capsys.readouterr()
    assert "RACE" in capsys.readouterr().out
