"""The public strategies: what they draw, what their options pin, how they shrink, and how
they reject bad arguments (at once, as hypothesis's own strategies do)."""

from __future__ import annotations

from typing import Any

import _profiles  # noqa: F401  (loads the ci/dev/nightly profile before @settings below)
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from racesim.engine_model import POINTS
from racesim.scenarios import Scenario, load_scenario
from racesim.scenarios.strategies import scenarios, schedules
from racesim.sim import Decision
from racesim.sim.strategies import delay_alphabet

QUIET = settings(database=None, suppress_health_check=list(HealthCheck))


@given(scenarios())
def test_every_drawn_scenario_is_small_and_reuses_a_tiny_id_pool(scen: Scenario) -> None:
    w = scen.workload
    assert 1 <= len(w.requests) <= 6 and w.topology in ("single", "pd") and w.frontends in (1, 2)
    for r in w.requests:
        assert r.id in ("X", "Y") and r.max_tokens <= 12 and 0 <= r.at <= 0.2
        assert r.frontend < w.frontends and r.n in (1, 2)
        assert r.abort_at is None or r.abort_at >= r.at
        assert not (w.topology == "pd" and r.n > 1)
        assert r.prompt in (None, "shared")


@given(scenarios(topology="pd", frontends=3, async_scheduling=True, id_pool=["a", "b", "c"],
                 min_requests=2, max_requests=4, allow_aborts=False, allow_disconnects=False,
                 allow_stop_strings=False, allow_eos=False, allow_n=False,
                 allow_shared_prompts=False, max_start=0.05))
def test_options_pin_what_they_name(scen: Scenario) -> None:
    w = scen.workload
    assert (w.topology, w.frontends, w.engine.async_scheduling) == ("pd", 3, True)
    assert 2 <= len(w.requests) <= 4
    for r in w.requests:
        assert r.id in ("a", "b", "c") and r.at <= 0.05 and r.n == 1 and r.prompt is None
        assert (r.abort_at, r.disconnect_after_tokens, r.stop_string_at, r.eos_at) == \
               (None, None, None, None)


def test_the_simplest_scenario_is_what_the_docstring_promises() -> None:
    simplest = find(scenarios(), lambda s: True, settings=QUIET)
    w = simplest.workload
    assert (w.topology, w.frontends, w.engine.async_scheduling) == ("single", 1, False)
    (r,) = w.requests
    assert (r.id, r.at, r.max_tokens, r.prompt_tokens, r.n) == ("X", 0.0, 1, 1, 1)
    assert (r.abort_at, r.disconnect_after_tokens, r.stop_string_at, r.eos_at) == \
           (None, None, None, None)


def test_a_failing_scenario_shrinks_to_the_race_alone() -> None:
    """What a user sees: the smallest workload that still races, and nothing else."""
    from racesim.runner import run_scenario

    held = [("frontend.abort:after_pop", None, 0.05)]

    def duplicate(s: Scenario) -> bool:
        return "unique-live-id" in run_scenario(s, "buggy", delays=held,
                                                retain_trace=False).violated

    # Two API servers each accept X (vLLM #27711): no abort, no delay, nothing else needed.
    search = settings(QUIET, max_examples=2000, derandomize=True)
    w = find(scenarios(id_pool=["X"], vllm="0.8"), duplicate, settings=search).workload
    assert (w.topology, w.frontends, w.engine.async_scheduling) == ("single", 2, False)
    assert [(r.id, r.at, r.frontend, r.abort_at) for r in w.requests] == \
           [("X", 0.0, 0, None), ("X", 0.0, 1, None)]


def test_the_simplest_schedule_is_one_short_early_delay() -> None:
    scen = load_scenario("abort-reuse").with_vllm("0.8")
    step = scen.workload.engine.step_time
    assert find(schedules(scen), lambda s: True, settings=QUIET) == ()
    (d,) = find(schedules(scen), lambda s: len(s) > 0, settings=QUIET)
    assert d == Decision(POINTS.names()[0], 0, delay_alphabet(step)[0])


@given(st.data())
def test_schedules_respect_points_and_max_delays(data: st.DataObject) -> None:
    scen = load_scenario("abort-reuse").with_vllm("0.8")
    points = ["frontend.abort:after_pop", "ipc.input:transit"]
    sched = data.draw(schedules(scen, max_delays=2, points=points, policy="abort-scope",
                                seed=5))
    assert len(sched) <= 2 and all(d.point in points for d in sched)
    assert data.draw(schedules(scen, max_delays=0)) == ()


@pytest.mark.parametrize("kwargs", [
    {"topology": "ring"}, {"topology": 1}, {"frontends": 0}, {"frontends": 5},
    {"frontends": True}, {"async_scheduling": "yes"}, {"max_requests": 0},
    {"min_requests": 0}, {"min_requests": 3, "max_requests": 2}, {"max_requests": 1.5},
    {"id_pool": ()}, {"id_pool": "XY"}, {"id_pool": ["X", ""]}, {"id_pool": [1]},
    {"allow_aborts": 1}, {"allow_n": None}, {"max_start": -1}, {"max_start": float("nan")},
])
def test_scenarios_rejects_bad_arguments_at_once(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        scenarios(**kwargs)


@pytest.mark.parametrize("args, kwargs", [
    (("abort-reuse",), {}), ((None,), {}),
    ((load_scenario("abort-reuse").with_vllm("0.8"),), {"max_delays": -1}),
    ((load_scenario("abort-reuse").with_vllm("0.8"),), {"max_delays": "4"}),
    ((load_scenario("abort-reuse").with_vllm("0.8"),), {"policy": "nosuch"}),
    ((load_scenario("abort-reuse").with_vllm("0.8"),), {"points": ["nosuch.point"]}),
    ((load_scenario("abort-reuse").with_vllm("0.8"),), {"points": "client.send"}),
    ((load_scenario("abort-reuse").with_vllm("0.8"),), {"seed": "0"}),
])
def test_schedules_rejects_bad_arguments_at_once(args: tuple[Any, ...],
                                                 kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        schedules(*args, **kwargs)
