"""Lifecycle policies: internal-id's request IDs and options, and third-party policies."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from racesim.engine_model import (
    EngineConfig,
    LifecyclePolicy,
    RequestSpec,
    RunResult,
    Workload,
    load_policy,
    run_workload,
)
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario
from racesim.sim import DelayPlan, InputError

FIXTURES = Path(__file__).parent / "fixtures"

TWO_X = Workload(engine=EngineConfig(vllm="0.8", step_time=0.01), requests=(
    RequestSpec("X", at=0.0, max_tokens=3),
    RequestSpec("X", at=0.0, max_tokens=3),
    RequestSpec("Y", at=0.0, max_tokens=3)))


def _run(workload: Workload, policy: str = "internal-id", *, seed: int = 0,
         **options: str) -> RunResult:
    return run_workload(workload, load_policy(policy, options), seed=seed, plan=DelayPlan())


def _engine_ids(result: RunResult) -> list[str]:
    return [e.request or "" for e in result.trace if e.kind == "sched.add"]


# -- internal-id -----------------------------------------------------------------------------------

def test_internal_id_appends_eight_random_hex_chars_to_the_external_id() -> None:
    result = _run(TWO_X)
    ids = _engine_ids(result)
    assert [i.split("-")[0] for i in ids] == ["X", "X", "Y"]
    assert all(re.fullmatch(r"[XY]-[0-9a-f]{8}", i) for i in ids), ids
    assert len(set(ids)) == 3, "two clients may share X; the engine never sees it twice"
    external = [e.detail.external for e in result.trace if e.kind == "fe.add"]
    assert external == ["X", "X", "Y"]
    assert [(r.id, r.finish_reason) for r in result.requests] == \
        [("X", "length"), ("X", "length"), ("Y", "length")]
    assert not result.violations


def test_internal_ids_come_from_the_world_rng_so_the_seed_decides_them() -> None:
    random.seed(1)
    first = _engine_ids(_run(TWO_X, seed=5))
    random.seed(2)                       # the global RNG plays no part in a run
    again = _engine_ids(_run(TWO_X, seed=5))
    other = _engine_ids(_run(TWO_X, seed=6))
    assert first == again
    assert other != first


@pytest.mark.parametrize(("suffix_hex", "pattern"), [("4", r"X-[0-9a-f]{4}"),
                                                     ("16", r"X-[0-9a-f]{16}"),
                                                     ("0", r"X")])
def test_suffix_hex_sets_the_suffix_length(suffix_hex: str, pattern: str) -> None:
    workload = Workload(engine=EngineConfig(vllm="0.8"), requests=(RequestSpec("X", max_tokens=2),))
    (rid,) = _engine_ids(_run(workload, suffix_hex=suffix_hex))
    assert re.fullmatch(pattern, rid), rid


def test_suffix_hex_0_is_randomization_disabled_and_reopens_the_abort_race() -> None:
    # VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1: the engine sees the client's IDs again.
    scenario = load_scenario("abort-reuse").with_vllm("0.8")
    on = run_scenario(scenario, "internal-id", witness=True)
    off = run_scenario(scenario, "internal-id", options={"suffix_hex": "0"}, witness=True)
    assert on.violated == ("metrics-exact",)
    assert "unique-live-id" in off.violated and "abort-precision" in off.violated


@pytest.mark.parametrize(("options", "message"), [
    ({"suffix_hex": "abc"}, "suffix_hex must be a whole number 0..32, got 'abc'"),
    ({"suffix_hex": "33"}, "suffix_hex must be a whole number 0..32, got '33'"),
    ({"suffix_hex": "-1"}, "suffix_hex must be a whole number 0..32, got '-1'"),
    ({"suffix": "8"}, "policy 'internal-id' has no option 'suffix'"),
])
def test_bad_internal_id_options_are_input_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        load_policy("internal-id", options)


def test_options_on_a_policy_without_options_are_input_errors() -> None:
    with pytest.raises(InputError, match="policy 'buggy' has no option 'suffix_hex'"):
        load_policy("buggy", {"suffix_hex": "8"})


def test_abort_by_external_id_ends_every_internal_id_under_it() -> None:
    workload = Workload(engine=EngineConfig(vllm="0.8", step_time=0.01), requests=(
        RequestSpec("X", at=0.0, max_tokens=20, abort_at=0.05),
        RequestSpec("X", at=0.0, max_tokens=20),
        RequestSpec("Y", at=0.0, max_tokens=20)))
    result = _run(workload)
    (issue,) = [e for e in result.trace if e.kind == "fe.abort_issue"]
    assert sorted(issue.detail.ids) == sorted(_engine_ids(result)[:2])
    finished = [(e.request, e.detail.status) for e in result.trace if e.kind == "sched.finish"]
    assert sorted(finished[:2]) == sorted((rid, "FINISHED_ABORTED")
                                          for rid in _engine_ids(result)[:2])
    assert [(r.id, r.finish_reason) for r in result.requests] == \
        [("X", "abort"), ("X", "abort"), ("Y", "length")]
    # the first client's abort ended the second client's X too: intended by the ID it named
    # (abort-precision holds), reported as abort-isolation (output_processor.py:627-629)
    assert result.violated == ("abort-isolation", "metrics-exact")


# -- third-party policies --------------------------------------------------------------------------

def test_a_third_party_policy_loads_by_module_and_class(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))
    policy = load_policy("racesim_thirdparty_policy:SendThenDrop", {"note": "hello"})
    assert isinstance(policy, LifecyclePolicy)
    assert (policy.name, policy.opts) == ("send-then-drop", {"note": "hello"})

    # It is really used: sending the ABORT before dropping the state closes #15326's window.
    scenario = load_scenario("abort-reuse").with_vllm("0.8")
    result = run_scenario(scenario, "racesim_thirdparty_policy:SendThenDrop", witness=True)
    assert result.policy == "send-then-drop"
    assert result.violated == ("metrics-exact",)
    assert [r.finish_reason for r in result.requests] == ["abort", "rejected"]
    assert "unique-live-id" in run_scenario(scenario, "buggy", witness=True).violated


def test_a_third_party_policy_may_keep_state_and_pass_tuples(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What a user's policy does runs the same in the compiled build (native classes check the
    argument types of their methods) as in the source one."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    scenario = load_scenario("abort-reuse").with_vllm("0.8")
    mine = run_scenario(scenario, "racesim_thirdparty_policy:CountingBuggy", witness=True)
    buggy = run_scenario(scenario, "buggy", witness=True)
    assert mine.violated == buggy.violated
    assert [r.finish_reason for r in mine.requests] == [r.finish_reason for r in buggy.requests]


def test_third_party_policy_options_are_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))
    with pytest.raises(InputError, match="note must not be 'bad'"):
        load_policy("racesim_thirdparty_policy:SendThenDrop", {"note": "bad"})
    with pytest.raises(InputError, match="has no option 'colour'"):
        load_policy("racesim_thirdparty_policy:SendThenDrop", {"colour": "red"})


@pytest.mark.parametrize(("spec", "message"), [
    ("no_such_racesim_module:Policy", "cannot import module 'no_such_racesim_module'"),
    ("racesim_thirdparty_policy:Missing", "'Missing' is not a LifecyclePolicy subclass"),
    ("racesim_thirdparty_policy:NotAPolicy", "'NotAPolicy' is not a LifecyclePolicy subclass"),
    ("no-such-policy", "unknown policy 'no-such-policy'"),
])
def test_unknown_policy_module_or_class_is_an_input_error(
        monkeypatch: pytest.MonkeyPatch, spec: str, message: str) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))
    with pytest.raises(InputError, match=re.escape(message)):
        load_policy(spec)
