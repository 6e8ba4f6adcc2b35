"""Issue 3's table, computed by running every scenario's witness under every policy.

"race" means some invariant other than metrics-exact is violated by ``racesim run S -p P
--witness`` (metrics-exact is a gap still open upstream: vLLM 0.33
``v1/engine/output_processor.py``:599-651, ``abort_requests``, never counts the aborted request
as finished; README "A tour"). Nothing here
stores a verdict per cell: the expected pattern is stated once, as vLLM's history has it.
"""

from __future__ import annotations

from functools import cache

import pytest

from racesim.engine_model import RunResult
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario

TABLE_SCENARIOS = ("abort-reuse", "stop-string-reuse", "async-sched-reuse", "pd-reuse",
                   "multi-frontend")
TABLE_POLICIES = ("buggy", "abort-scope", "internal-id")
#: PR #15326's fix closes the two frontend windows only.
FRONTEND_WINDOWS = ("abort-reuse", "stop-string-reuse")


@cache
def _witness(scenario: str, policy: str) -> RunResult:
    return run_scenario(load_scenario(scenario).with_vllm("0.8"), policy, witness=True)


def _races(result: RunResult) -> bool:
    return any(v != "metrics-exact" for v in result.violated)


def _table() -> dict[str, dict[str, str]]:
    return {p: {s: "race" if _races(_witness(s, p)) else "safe" for s in TABLE_SCENARIOS}
            for p in TABLE_POLICIES}


def test_buggy_races_everywhere() -> None:
    assert set(_table()["buggy"].values()) == {"race"}


def test_abort_scope_closes_the_frontend_windows_only() -> None:
    row = _table()["abort-scope"]
    assert {s for s, verdict in row.items() if verdict == "safe"} == set(FRONTEND_WINDOWS)


def test_internal_id_is_safe_everywhere() -> None:
    assert set(_table()["internal-id"].values()) == {"safe"}


@pytest.mark.parametrize("scenario", TABLE_SCENARIOS)
def test_every_witness_opens_a_unique_live_id_race_under_buggy(scenario: str) -> None:
    # The races differ in their consequences but all start with one ID live twice.
    assert "unique-live-id" in _witness(scenario, "buggy").violated


def test_engine_final_is_safe_on_abort_reuse_and_alone_counts_its_aborts() -> None:
    verdicts = {p: _witness("abort-reuse", p).violated
                for p in ("buggy", "abort-scope", "engine-final", "internal-id")}
    assert not _races(_witness("abort-reuse", "engine-final"))
    assert [p for p, violated in verdicts.items() if "metrics-exact" not in violated] == \
        ["engine-final"]


@pytest.mark.parametrize("scenario", ["parallel-sampling-abort", "abort-storm"])
def test_the_other_bundled_witnesses_race_under_buggy(scenario: str) -> None:
    result = _witness(scenario, "buggy")
    assert _races(result), result.violated
    assert "unique-live-id" in result.violated


def test_the_witness_is_what_opens_the_race() -> None:
    # Without its schedule abort-reuse is benign even under buggy: the table measures witnesses.
    plain = run_scenario(load_scenario("abort-reuse").with_vllm("0.8"), "buggy")
    assert not _races(plain)
    assert _races(_witness("abort-reuse", "buggy"))
