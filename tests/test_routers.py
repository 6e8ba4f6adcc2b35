"""The routers' abort endpoints (vLLM 0.33.0 entrypoints/rl/online/api_router.py:97-131,
entrypoints/scale_out/token_in_token_out/api_router.py:79-104): aborts by external ID, and the
RL router's abort-all by internal ID, which sweeps the n > 1 parent an external abort leaks."""

from __future__ import annotations

import dataclasses

from racesim.engine_model.events import ApiRouterAbort
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario
from racesim.scenarios.loader import Scenario


def _without_abort_all(scen: Scenario) -> Scenario:
    w = scen.workload
    return dataclasses.replace(scen, workload=dataclasses.replace(
        w, frontend=dataclasses.replace(w.frontend, abort_all_at=None)))


def test_the_external_abort_leaks_the_parent_and_abort_all_sweeps_it() -> None:
    scen = load_scenario("router-abort-all")
    leaky = run_scenario(_without_abort_all(scen), "internal-id", skip=["metrics-exact"])
    assert leaky.violated == ("no-leak",)
    swept = run_scenario(scen, "internal-id", skip=["metrics-exact"])
    assert swept.violations == ()
    # Y was still running: the operator's abort-all ends it, which is no client's abort
    assert [r.finish_reason for r in swept.requests] == ["abort", "abort"]
    (sweep,) = [ev.detail for ev in swept.trace
                if isinstance(ev.detail, ApiRouterAbort) and ev.detail.all]
    assert any(i.startswith("generate-tokens-X") for i in sweep.ids)  # the leaked parent
    assert any(i.startswith("generate-tokens-Y") for i in sweep.ids)


def test_the_scale_out_routers_abort_names_the_external_id() -> None:
    r = run_scenario(load_scenario("router-abort-all"), "internal-id", skip=["metrics-exact"])
    aborts = [ev.detail for ev in r.trace
              if isinstance(ev.detail, ApiRouterAbort) and not ev.detail.all]
    assert [(a.router, a.ids) for a in aborts] == [("scale-out", ["generate-tokens-X"])]


def test_abort_all_of_a_running_parent_ends_its_children_and_leaves_nothing() -> None:
    scen = load_scenario("router-abort-all")
    w = scen.workload
    x = dataclasses.replace(w.requests[0], abort_at=None, max_tokens=40)
    scen = dataclasses.replace(scen, workload=dataclasses.replace(w, requests=(x,)))
    r = run_scenario(scen, "internal-id", skip=["metrics-exact"])
    assert r.violations == ()
    assert r.requests[0].finish_reason == "abort"
