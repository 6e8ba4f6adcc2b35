"""One of each: the run spec, the delay-entry check, the replay decider, the schedule alphabet
and the race-window rule the terminal shares with the HTML report."""

from __future__ import annotations

import pickle

import pytest

from racesim.engine_model.points import POINTS
from racesim.cli.render import timeline_events
from racesim.reports.focus import race_span
from racesim.reports.model import TraceModel, topology_of
from racesim.runner import RunSpec, parse_delay_option, run_scenario
from racesim.scenarios import load_scenario
from racesim.sim import Decision, DelayPlan, InputError, World
from racesim.sim.points import delay_entry, plan_entries
from racesim.sim.strategies import Replay, StrategyConfig, delay_alphabet, grid_cells


def _scenario():  # type: ignore[no-untyped-def]
    return load_scenario("abort-reuse").with_vllm("0.8")


def test_a_spec_checks_once_and_runs_as_run_scenario_does() -> None:
    with_options = RunSpec.of(_scenario(), "buggy", options={"b": "1", "a": "2"})
    assert with_options.options == (("a", "2"), ("b", "1"))
    assert with_options.option_dict == {"a": "2", "b": "1"}
    spec = RunSpec.of(_scenario(), "buggy", seed=3, skip=["no-leak", "metrics-exact"])
    assert spec.skip == ("metrics-exact", "no-leak")
    assert pickle.loads(pickle.dumps(spec)) == spec
    with pytest.raises(InputError, match="no-such"):
        RunSpec.of(_scenario(), "buggy", skip=["no-such"])
    mine = spec.run(witness=True)
    theirs = run_scenario(_scenario(), "buggy", seed=3, witness=True,
                          skip=["no-leak", "metrics-exact"])
    assert mine.trace_hash == theirs.trace_hash and mine.violated == theirs.violated
    assert spec.with_scenario(_scenario().with_vllm("0.33")).scenario.vllm == "0.33"


def test_a_replayed_schedule_is_a_decider_and_reproduces_the_run() -> None:
    first = run_scenario(_scenario(), "buggy", witness=True)
    assert first.schedule
    again = run_scenario(_scenario(), "buggy", schedule=first.schedule)
    assert again.trace_hash == first.trace_hash
    replay = Replay(first.schedule)
    d = first.schedule[0]
    assert replay(d.point, d.occurrence, 0.5) == d.delay
    assert replay(d.point, d.occurrence + 1000, 0.5) == 0.5
    with pytest.raises(ValueError, match="schedule or decider"):
        run_scenario(_scenario(), "buggy", schedule=first.schedule, decider=replay)
    world = World(0, DelayPlan(decider=replay))
    assert world.pause(d.point, 0.0, "x") == (d.delay if d.occurrence == 0 else 0.0)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: delay_entry("no.such", 0, 0.1, POINTS, "here"), "here: unknown await point"),
    (lambda: delay_entry("client.send", -1, 0.1, POINTS, "here"), "here: occurrence must be"),
    (lambda: delay_entry("client.send", True, 0.1, POINTS, "here"), "occurrence must be"),
    (lambda: delay_entry("client.send", None, 0.1, POINTS, "here", every=False),
     "occurrence must be a whole number in 0..2\\*\\*63-1 \\(got None\\)"),
    (lambda: delay_entry("client.send", 0, -1, POINTS, "here"), "here: delay must be"),
    (lambda: parse_delay_option("client.send#0=soon"), "delay must be a number"),
    (lambda: plan_entries({"client.send": "x"}, POINTS, "t"), "delay must be a number"),
])
def test_every_delay_entry_goes_through_one_check(call, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match=message):
        call()


def test_the_grid_and_the_hypothesis_schedules_share_one_alphabet() -> None:
    config = StrategyConfig(occurrences={"client.send": 2}, scale=0.01)
    values = {v for cell in grid_cells(config) for _p, _k, v in cell}
    assert values == set(delay_alphabet(0.01)) == {0.0, 0.0001, 0.01, 0.05}


def test_the_terminal_timeline_opens_where_the_html_race_window_does() -> None:
    result = run_scenario(_scenario(), "buggy", witness=True)
    span = race_span(TraceModel(result.trace, topology_of(result)), result.violations)
    assert span is not None
    opener = result.trace[span[0]]
    shown = [e.seq for e in timeline_events(result, limit=1000)]
    assert opener.seq in shown
    assert shown[0] <= opener.seq


def test_decisions_replay_by_occurrence() -> None:
    replay = Replay([Decision("client.send", 1, 0.25)])
    assert [replay("client.send", k, 0.0) for k in range(3)] == [0.0, 0.25, 0.0]
