"""kv-destination and stranded-hold (engine_model/monitors/pd.py): a schedule that breaks each,
and one that does not, on the model; the narratives of vLLM #32255, #19223 and #25067."""

from __future__ import annotations

from typing import Any

import pytest

from racesim.engine_model.invariants import ACCOUNTING_INVARIANTS, SAFETY_INVARIANTS
from racesim.reports.verdict import exit_status
from racesim.runner import run_scenario
from racesim.scenarios import Scenario, scenario_from_dict


def _pd(vllm: str, requests: list[dict[str, Any]], **engine: Any) -> Scenario:
    return scenario_from_dict({"name": "pd", "topology": "pd", "horizon": 60.0,
                               "engine": {"vllm": vllm, **engine}, "request": requests})


def _x(**more: Any) -> dict[str, Any]:
    return {"id": "X", "prompt_tokens": 32, "max_tokens": 5, **more}


def test_the_two_invariants_are_one_safety_and_one_accounting() -> None:
    assert "kv-destination" in SAFETY_INVARIANTS
    assert "stranded-hold" in ACCOUNTING_INVARIANTS and "stranded-hold" not in SAFETY_INVARIANTS
    assert exit_status(["stranded-hold"]) == 0 and exit_status(["stranded-hold"], strict=True)
    assert exit_status(["kv-destination"]) == 1


def test_a_read_that_completes_into_blocks_freed_by_an_abort_breaks_kv_destination() -> None:
    """#32255: D aborts X while its read is in flight (the read takes 0.2 s, the ABORT reaches
    D at 0.0305). 0.8 frees X's blocks at once, so the read completes into free blocks; 0.33
    keeps them until the read reports done (scheduler.py:3017-3025)."""
    slow = [("pd.kv:read", 0, 0.2)]
    buggy = run_scenario(_pd("0.8", [_x(abort_at=0.03)]), "internal-id", delays=slow)
    bad = [v for v in buggy.violations if v.invariant == "kv-destination"]
    assert len(bad) == 1
    ev = buggy.trace[bad[0].event]
    assert ev.kind == "pd.read" and ev.component == "decode.connector"
    freed = int(bad[0].detail.rsplit("event ", 1)[1].rstrip(")"))
    assert buggy.trace[freed].kind == "kv.free" and buggy.trace[freed].time < 0.1 < ev.time
    fixed = run_scenario(_pd("0.33", [_x(abort_at=0.03)]), "internal-id", delays=slow)
    assert "kv-destination" not in fixed.violated
    # no abort: the read lands in X's own blocks on either profile
    for vllm in ("0.8", "0.33"):
        assert "kv-destination" not in run_scenario(
            _pd(vllm, [_x()]), "internal-id", delays=slow).violated


def _queued_abort(vllm: str) -> Scenario:
    """#19223: D runs one request at a time; X waits in D's queue behind Y and is aborted
    there, before its read starts."""
    return _pd(vllm, [{"id": "Y", "prompt_tokens": 32, "max_tokens": 200},
                      _x(at=0.001, abort_at=0.5)], max_num_seqs=1)


def test_an_abort_in_the_decode_queue_strands_the_prefill_hold_without_the_notice() -> None:
    """0.8 (no #19223): nothing tells P, whose 480 s timeout would end the hold long after the
    run; stranded-hold names the event that left it stranded. 0.33 sends the notice with no
    blocks to read at the next schedule() (pull_scheduler.py:219-230): P releases at once."""
    buggy = run_scenario(_queued_abort("0.8"), "internal-id")
    bad = [v for v in buggy.violations if v.invariant == "stranded-hold"]
    assert len(bad) == 1 and bad[0].request is not None and bad[0].request.startswith("X")
    assert "would end it at t=480" in bad[0].detail
    assert buggy.trace[bad[0].event].time == bad[0].time > 0.5
    assert exit_status(buggy.violated) == 0  # accounting: the lease gives the blocks back
    fixed = run_scenario(_queued_abort("0.33"), "internal-id")
    assert "stranded-hold" not in fixed.violated
    releases = [(e.request, e.detail.cause) for e in fixed.trace  # type: ignore[attr-defined]
                if e.kind == "pd.release" and e.component == "prefill.scheduler"]
    assert ("notify" in dict(releases).values()) and len(releases) == 2


def test_a_disconnect_right_after_prefill_holds_p_until_the_lease() -> None:
    """#25067's window on 0.33: the client leaves while the proxy holds P's reply; the ABORT
    for the finished, held X is ignored and no decode request is ever sent, so P keeps X's
    blocks for the 30 s lease. Reported with how long it was held."""
    scen = _pd("0.33", [_x(abort_at=0.0115)])
    result = run_scenario(scen, "internal-id", delays=[("pd.proxy:after_prefill", 0, 0.01)])
    bad = [v for v in result.violations if v.invariant == "stranded-hold"]
    assert len(bad) == 1, result.violations
    assert "until its release (timeout) at t=30.01" in bad[0].detail
    assert result.trace[bad[0].event].kind == "client.done"
    # without the disconnect the decode side reads and notifies: nothing stranded
    assert "stranded-hold" not in run_scenario(_pd("0.33", [_x()]), "internal-id").violated


def test_before_25067_an_abort_frees_the_held_blocks_and_the_timeout_crashes_010() -> None:
    """0.10.1.1: the ABORT of a finished, held X re-finishes it (scheduler.py:999) and frees its
    blocks; the hold's end then does self.requests[X] and raises KeyError (:1161). An idle P
    takes no step before 0.33 (its held requests are no work, scheduler.py:1040-1044), so the
    timeout's end is seen at the step the next request Y brings. 0.11 warns instead (#25844);
    0.14 ignores the ABORT (#25067) and holds X until the timeout."""
    reqs = [{"id": "X", "prompt_tokens": 40, "max_tokens": 20, "abort_at": 0.0107},
            {"id": "Y", "at": 130.0, "prompt_tokens": 40, "max_tokens": 2}]

    def run(vllm: str) -> Any:
        scen = scenario_from_dict({"name": "pd", "topology": "pd", "horizon": 200.0,
                                   "engine": {"vllm": vllm}, "request": reqs,
                                   "pd": {"hold_timeout": 120.0}})
        return run_scenario(scen, "buggy")

    crash = run("0.10")
    (dead,) = [v for v in crash.violations if v.invariant == "engine-alive"]
    assert "KeyError: 'X'" in dead.detail and 130.0 < dead.time < 130.1
    assert [e.detail.cause for e in crash.trace if e.kind == "pd.release"] == ["abort"]
    assert "engine-alive" not in run("0.11").violated
    fixed = run("0.14")
    assert "engine-alive" not in fixed.violated and "stranded-hold" in fixed.violated
