"""Trace hashes pinned across racesim versions: a counterexample file written by an earlier
racesim replays to the same hash (README "Concepts": same schedule, byte-identical trace).

Every other determinism test compares runs with each other; this one compares them with the
hashes racesim recorded at commit 2bdddef, before the compiled build and the hot-path work of
issue 7 (``fixtures/trace_hashes.json``): every bundled scenario under every policy with and
without its witness, and random, PCT and grid schedules, each also replayed from its schedule.
A change that only means to be faster cannot change a trace unnoticed; a change that *means*
to change the model or the trace format updates the fixture in the same commit and says why.

Those hashes were recorded before racesim had vLLM version profiles: they are the ``0.8``
profile's, so every run here names it (``test_trace_pins_033.py`` pins the default profile).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from racesim.runner import run_scenario
from racesim.scenarios import Scenario, bundled_names, load_scenario
from racesim.sim.strategies import StrategyConfig, make_strategy

_RECORDED: dict[str, str] = json.loads(
    (Path(__file__).parent / "fixtures" / "trace_hashes.json").read_text())["runs"]


@cache
def _scenario(name: str) -> Scenario:
    return load_scenario(name).with_vllm("0.8")


@cache
def _config(name: str) -> StrategyConfig:
    """The strategy configuration the hashes were recorded with: buggy's baseline, seed 0."""
    scenario = _scenario(name)
    base = run_scenario(scenario, "buggy", retain_trace=False)
    return StrategyConfig(occurrences=base.occurrences,
                          scale=scenario.workload.engine.step_time, seed=0)


def test_the_fixture_covers_every_scenario_bundled_when_it_was_recorded() -> None:
    assert {key.split()[0] for key in _RECORDED} <= set(bundled_names())
    assert len({key.split()[0] for key in _RECORDED}) == 8
    assert len(_RECORDED) == 192


@pytest.mark.parametrize("key", sorted(_RECORDED))
def test_trace_hash_matches_the_recorded_one(key: str) -> None:
    name, policy, tag = key.split()
    scenario = _scenario(name)
    if tag.startswith("witness="):
        result = run_scenario(scenario, policy, witness=tag == "witness=True")
    else:
        strategy, run = tag.split("#")
        decider = make_strategy(strategy, _config(name)).decider(int(run))
        result = run_scenario(scenario, policy, decider=decider, retain_trace=False)
        replayed = run_scenario(scenario, policy, schedule=result.schedule)
        assert replayed.trace_hash == result.trace_hash, "a schedule replays its run"
    assert result.trace_hash == _RECORDED[key]
