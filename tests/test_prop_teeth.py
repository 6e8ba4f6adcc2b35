"""The harness has teeth: buggy is caught on every generated abort-then-reuse workload.

Each example is #15326's race with generated parameters: client 0 sends X and aborts it at
``abort_at``; client 1 sends X again ``gap`` seconds later on the same API server; the ABORT
is held at ``frontend.abort:after_pop`` (the BUG point) for longer than ``gap``. Unrelated
clients with their own IDs run alongside. Under buggy the frontend has already forgotten the
old X, so the new ADD overtakes the held ABORT. The fixed policies get the very same inputs and
must keep every safety invariant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import _profiles  # noqa: F401  (loads the ci/dev/nightly profile before @settings below)
import pytest
from hypothesis import given
from hypothesis import strategies as st

from racesim.engine_model import SAFETY_INVARIANTS
from racesim.runner import run_scenario
from racesim.scenarios import Scenario, scenario_from_dict

TICK = 0.005  # half an engine step
BUG_POINT = "frontend.abort:after_pop"

Inputs = tuple[Scenario, list[tuple[str, int | None, float]]]


@st.composite
def abort_then_reuse(draw: Callable[..., Any]) -> Inputs:
    """An abort-then-reuse scenario and the delay that holds its ABORT past the reuse.

    Shrinks towards: abort early, reuse at once, the shortest hold, one API server, sync
    scheduling, no other clients.
    """
    abort_at = draw(st.integers(2, 16)) * TICK        # X has run a few steps
    gap = draw(st.integers(0, 8)) * TICK              # the client re-sends X this much later
    hold = gap + draw(st.integers(1, 6)) * TICK       # ...while the ABORT is still held
    frontends = draw(st.integers(1, 2))
    frontend = draw(st.integers(0, frontends - 1))
    old = {"id": "X", "at": 0.0, "prompt_tokens": draw(st.integers(1, 32)),
           "max_tokens": 40, "abort_at": abort_at, "frontend": frontend}  # still running then
    new = {"id": "X", "at": round(abort_at + gap, 6),
           "prompt_tokens": draw(st.integers(1, 32)), "max_tokens": draw(st.integers(1, 12)),
           "frontend": frontend}
    others = [{"id": f"N{i}", "at": draw(st.integers(0, 30)) * TICK,
               "prompt_tokens": draw(st.integers(1, 32)), "max_tokens": draw(st.integers(1, 12)),
               "frontend": draw(st.integers(0, frontends - 1))}
              for i in range(draw(st.integers(0, 3)))]
    scenario = scenario_from_dict({
        "name": "abort-then-reuse", "frontends": frontends,
        "engine": {"async_scheduling": draw(st.booleans()), "vllm": "0.8"},
        "request": [old, new, *others]})
    return scenario, [(BUG_POINT, None, round(hold, 6))]


def _safety(scenario: Scenario, policy: str,
            delays: list[tuple[str, int | None, float]]) -> list[str]:
    result = run_scenario(scenario, policy, delays=delays)
    return [v.invariant for v in result.violations if v.invariant in SAFETY_INVARIANTS]


@given(abort_then_reuse())
def test_buggy_is_caught(inputs: Inputs) -> None:
    scenario, held = inputs
    broken = _safety(scenario, "buggy", held)
    assert broken, "buggy survived an ABORT held past the reuse of its ID"
    # The overtaking ADD reaches an engine that still runs the old X, or the late ABORT
    # ends the new X; either way the engine-side invariants notice, not only the client's.
    assert {"unique-live-id", "abort-precision"} & set(broken), broken


@pytest.mark.parametrize("policy", ["abort-scope", "engine-final", "internal-id"])
@given(inputs=abort_then_reuse())
def test_fixed_policies_hold_on_the_same_inputs(policy: str, inputs: Inputs) -> None:
    scenario, held = inputs
    assert _safety(scenario, policy, held) == []


def test_without_the_hold_buggy_is_clean_too() -> None:
    """The race needs the held ABORT: with no delay the ABORT leaves before the re-ADD (the
    re-use comes three steps later, after the old X's last step in flight has drained)."""
    scenario = scenario_from_dict({"name": "abort-then-reuse", "engine": {"vllm": "0.8"},
                                  "request": [
        {"id": "X", "at": 0.0, "max_tokens": 40, "abort_at": 0.05},
        {"id": "X", "at": 0.08, "max_tokens": 8}]})
    assert _safety(scenario, "buggy", []) == []
    assert _safety(scenario, "buggy", [(BUG_POINT, None, 0.04)]) != []
