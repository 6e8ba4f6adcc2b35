"""stale-abort-reuse: an ABORT held past its request's own finish kills the next request with
that ID under every policy that keys the engine by the client's ID; internal-id closes it."""

from __future__ import annotations

import pytest

from racesim.runner import run_scenario
from racesim.scenarios import load_scenario


@pytest.mark.parametrize("policy", ["abort-scope", "engine-final"])
def test_a_stale_abort_kills_the_reused_id_under_the_frontend_fixes(policy: str) -> None:
    scen = load_scenario("stale-abort-reuse")
    clean = run_scenario(scen, policy, skip=["metrics-exact"])
    assert clean.violations == ()
    raced = run_scenario(scen, policy, witness=True, skip=["metrics-exact"])
    assert "abort-precision" in raced.violated
    first, second = raced.requests
    assert first.finish_reason == "length"          # X finished on its own ...
    assert second.finish_reason == "abort"          # ... and its ABORT ended the next X


def test_under_buggy_the_reused_request_hangs_and_internal_id_is_safe() -> None:
    scen = load_scenario("stale-abort-reuse")
    buggy = run_scenario(scen, "buggy", witness=True)
    assert {"abort-precision", "no-hang"} <= set(buggy.violated)
    assert buggy.requests[1].finish_reason is None  # generate() never returns (#23697)
    fixed = run_scenario(scen, "internal-id", witness=True, skip=["metrics-exact"])
    assert fixed.violations == ()
    assert [r.finish_reason for r in fixed.requests] == ["abort", "length"]
