"""Round trips: scenario TOML and dicts, counterexample JSON (and what replays from it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import _profiles  # noqa: F401  (loads the ci/dev/nightly profile before @settings below)
import pytest
from hypothesis import given
from hypothesis import strategies as st

from racesim.documents import Counterexample, read_counterexample, write_counterexample
from racesim.engine_model import INVARIANTS, POINTS
from racesim.runner import run_scenario
from racesim.scenarios import Scenario, parse_scenario, scenario_from_dict, scenario_to_toml
from racesim.scenarios.strategies import scenarios, schedules

# Any text the loader accepts: no surrogates (TOML is UTF-8), anything else goes, quotes,
# backslashes, newlines and control characters included.
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
IDS = st.lists(TEXT.filter(bool), min_size=1, max_size=3, unique=True)
SECONDS = st.floats(0.0, 1e6, allow_nan=False)
PLAN = st.lists(st.tuples(st.sampled_from(POINTS.names()),
                          st.none() | st.integers(0, 2**63 - 1), SECONDS),
                max_size=4, unique_by=lambda e: e[:2]).map(tuple)


@st.composite
def decorated_scenarios(draw: st.DrawFn) -> Scenario:
    """A generated scenario with any name, summary and IDs, plus [delays] and [witness]."""
    scen = draw(scenarios(id_pool=draw(IDS)))
    return dataclasses.replace(scen, name=draw(TEXT), summary=draw(TEXT), delays=draw(PLAN),
                               witness=draw(PLAN))


@given(decorated_scenarios())
def test_scenario_toml_round_trips(scen: Scenario) -> None:
    text = scenario_to_toml(scen)
    back = parse_scenario(text, "<round trip>")
    assert back == scen
    assert scenario_to_toml(back) == text  # and the text is a fixed point


@given(decorated_scenarios())
def test_scenario_dict_round_trips(scen: Scenario) -> None:
    assert scenario_from_dict(scen.to_dict()) == scen


OPTIONS = {"buggy": st.just({}), "abort-scope": st.just({}), "engine-final": st.just({}),
           "internal-id": st.just({}) | st.builds(lambda n: {"suffix_hex": str(n)},
                                                  st.integers(0, 32))}


@given(data=st.data(), policy=st.sampled_from(sorted(OPTIONS)),
       seed=st.integers(0, 2**64), shrunk_from=st.none() | st.integers(0, 10**6))
def test_counterexample_json_round_trips_and_replays(tmp_path_factory: pytest.TempPathFactory,
                                                     data: st.DataObject, policy: str,
                                                     seed: int, shrunk_from: int | None) -> None:
    scen = data.draw(decorated_scenarios(), label="scenario")
    options = data.draw(OPTIONS[policy], label="options")
    sched = data.draw(schedules(scen, policy=policy, seed=seed), label="schedule")
    skip = tuple(data.draw(st.lists(st.sampled_from(list(INVARIANTS)), unique=True, max_size=3),
                           label="skip"))
    result = run_scenario(scen, policy, options=options, seed=seed, schedule=sched, skip=skip)
    cx = Counterexample(scen, policy, options, seed, result.schedule, skip,
                        tuple(v.as_dict() for v in result.violations), result.trace_hash,
                        shrunk_from, {"strategy": "hypothesis", "run": 3})
    path = write_counterexample(Path(tmp_path_factory.mktemp("cx")) / "cx.json", cx)
    back = read_counterexample(str(path))
    assert back.as_dict() == cx.as_dict()
    # the file names the profile it ran on, so it replays there whatever the default becomes
    assert back.scenario == scen.with_vllm(scen.vllm) and back.schedule == result.schedule
    assert back.vllm == result.vllm
    replay = run_scenario(back.scenario, back.policy, options=back.options, seed=back.seed,
                          schedule=back.schedule, skip=back.skip)
    assert replay.trace_hash == result.trace_hash
