"""Same inputs, same trace: in one process, across processes and PYTHONHASHSEEDs, and under
hypothesis (whose seeding of racesim's seed source comes through racesim's entry point)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import _profiles
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from racesim.runner import run_scenario
from racesim.scenarios import scenario_to_toml
from racesim.scenarios.strategies import scenarios, schedules
from racesim.sim.rng import SEED_SOURCE

POLICIES = st.sampled_from(["buggy", "abort-scope", "engine-final", "internal-id"])


@given(st.data(), POLICIES, st.integers(0, 2**63 - 1))
def test_same_inputs_give_the_same_trace_hash(data: st.DataObject, policy: str,
                                              seed: int) -> None:
    scen = data.draw(scenarios(), label="scenario")
    sched = data.draw(schedules(scen, policy=policy, seed=seed), label="schedule")
    first = run_scenario(scen, policy, seed=seed, schedule=sched)
    again = run_scenario(scen, policy, seed=seed, schedule=sched, retain_trace=False)
    assert again.trace_hash == first.trace_hash
    assert (again.events, again.sim_time, again.violations, again.requests) == \
           (first.events, first.sim_time, first.violations, first.requests)
    # The recorded schedule is the replay token: replaying it alone gives the same run.
    replayed = run_scenario(scen, policy, seed=seed, schedule=first.schedule)
    assert replayed.trace_hash == first.trace_hash


@settings(max_examples=2)
@given(data=st.data())
def test_trace_hash_is_the_same_in_another_process(
        data: st.DataObject, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each process gets a different PYTHONHASHSEED; the trace hash must not notice."""
    scen = data.draw(scenarios(min_requests=3), label="scenario")
    sched = data.draw(schedules(scen, policy="internal-id"), label="schedule")
    here = run_scenario(scen, "internal-id", seed=7, schedule=sched)
    path = tmp_path_factory.mktemp("scen") / "generated.toml"
    path.write_text(scenario_to_toml(scen), encoding="utf-8")
    args = [sys.executable, "-c", "from racesim.cli import main; main()", "run", str(path),
            "-p", "internal-id",
            "--seed", "7", "--json"]
    for d in sched:
        args += ["--delay", f"{d.point}#{d.occurrence}={d.delay!r}"]
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
        assert out.returncode in (0, 1), out.stderr
        assert json.loads(out.stdout)["trace_hash"] == here.trace_hash


# -- the World's seed source under hypothesis -----------------------------------------------------

def test_the_hypothesis_entry_point_is_racesims_register() -> None:
    points = importlib.metadata.entry_points(group="hypothesis")
    assert any(ep.name == "racesim" and ep.value == "_racesim_hypothesis:_register"
               for ep in points)


def test_hypothesis_seeds_the_seed_source_for_every_example() -> None:
    """hypothesis resets registered PRNGs to the same state before each example and restores
    them after the test, so a property drawing seeds from SEED_SOURCE is reproducible. Without
    the registration every example would draw a different seed."""
    SEED_SOURCE.random()  # whatever state the session left it in
    before = SEED_SOURCE.getstate()
    draws: list[float] = []

    @settings(max_examples=5, database=None, derandomize=True)
    @given(st.integers())
    def inner(_: int) -> None:
        draws.append(SEED_SOURCE.random())

    inner()
    assert len(draws) == 5 and len(set(draws)) == 1
    assert SEED_SOURCE.getstate() == before  # restored afterwards


def test_register_is_idempotent() -> None:
    from _racesim_hypothesis import _register

    _register()
    _register()  # a second call must neither raise nor double-register


# -- profiles -------------------------------------------------------------------------------------

def test_profile_choice() -> None:
    choose = _profiles.profile_name
    assert choose({}) == "dev"
    assert choose({"CI": "true"}) == "ci"
    assert choose({"CI": "true", "HYPOTHESIS_PROFILE": "nightly"}) == "nightly"
    assert choose({}, current="nightly") == "nightly"  # --hypothesis-profile wins over CI
    assert choose({"CI": "true"}, current="ci") == "ci"


def test_the_loaded_profile_matches_the_environment() -> None:
    assert settings.get_current_profile_name() == _profiles.profile_name(
        current=_profiles.PROFILE)
    ci = settings.get_profile("ci")
    assert ci.derandomize and ci.deadline is None and ci.print_blob and ci.database is None
    assert settings.get_profile("nightly").max_examples >= 10 * ci.max_examples
    if os.environ.get("CI", "").lower() == "true" and not os.environ.get("HYPOTHESIS_PROFILE"):
        assert settings.default.derandomize
