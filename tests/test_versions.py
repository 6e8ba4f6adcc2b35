"""vLLM version profiles: each 0.33 behaviour, the widths of the await points, and the reach
of what a run finds. Read each test as the sequence of events in vLLM 0.33.0 it describes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from racesim.documents import Counterexample, read_counterexample, write_counterexample
from racesim.engine_model import POINTS
from racesim.engine_model.versions import PROFILES, WIDTHS, get_profile
from racesim.explore import explore
from racesim.runner import run_scenario
from racesim.scenarios import Scenario, load_scenario, scenario_from_dict
from racesim.sim import InputError

NO_SUFFIX = {"suffix_hex": "0"}  # VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1


def _kinds(result: object, kind: str) -> list[object]:
    return [e for e in result.trace if e.kind == kind]  # type: ignore[attr-defined]


def test_every_point_has_a_width_in_every_profile() -> None:
    for profile in PROFILES.values():
        assert {profile.width(p.name) for p in POINTS} <= set(WIDTHS)
        assert profile.width("frontend.abort:after_pop") == "latent"
        assert profile.width("ipc.input:transit") == "live"
        assert profile.width("frontend.output_handler:between_chunks") == "yield"
    with pytest.raises(InputError, match=r"unknown vLLM version '0\.7'"):
        get_profile("0.7")


def test_the_default_profile_is_033_and_a_scenario_can_name_another() -> None:
    assert load_scenario("abort-reuse").vllm == "0.33"
    assert load_scenario("abort-reuse").with_vllm("0.8").vllm == "0.8"
    with pytest.raises(InputError, match=r"engine\.vllm"):
        scenario_from_dict({"name": "x", "engine": {"vllm": "7"}, "request": [{"id": "X"}]})


def test_a_duplicate_in_flight_kills_the_033_engine_with_no_delay() -> None:
    """X is re-sent while the first X runs; with equal internal IDs the OutputProcessor ends
    the first stream and the scheduler's 'duplicate request id' assert kills the engine."""
    scen = load_scenario("duplicate-in-flight")
    result = run_scenario(scen, "internal-id", options=NO_SUFFIX)
    assert result.schedule == ()
    assert {"engine-alive", "no-hang"} <= set(result.violated)
    assert result.reach().reach == "live"
    assert [r.finish_reason for r in result.requests] == ["stream_finished", None]
    fatal = _kinds(result, "engine.fatal")
    assert "duplicate request id" in fatal[0].detail.error  # type: ignore[attr-defined]
    # with the default 8-hex suffix the IDs differ and both finish
    clean = run_scenario(scen, "internal-id")
    assert clean.violated == () and [r.finish_reason for r in clean.requests] == ["length"] * 2
    # on 0.8 the same workload is refused by the frontend ("already running")
    old = run_scenario(scen.with_vllm("0.8"), "internal-id", options=NO_SUFFIX)
    assert [r.finish_reason for r in old.requests] == ["length", "rejected"]


def test_the_eager_abort_copy_ends_the_re_added_request_on_033_only() -> None:
    scen = load_scenario("eager-abort-reuse")
    new = run_scenario(scen, "internal-id", options=NO_SUFFIX, witness=True)
    assert {"abort-precision", "no-hang"} <= set(new.violated)
    assert new.reach().reach == "live"  # update_from_output takes real time
    causes = [e.detail.cause for e in _kinds(new, "sched.finish")]  # type: ignore[attr-defined]
    assert "abort(eager)" in causes
    old = run_scenario(scen.with_vllm("0.8"), "internal-id", options=NO_SUFFIX, witness=True)
    assert "abort-precision" not in old.violated and "no-hang" not in old.violated


def test_return_path_crosstalk_needs_no_delay_on_one_api_server() -> None:
    result = run_scenario(load_scenario("return-path-crosstalk"), "buggy")
    assert result.schedule == () and "no-crosstalk" in result.violated
    assert result.reach().reach == "live"
    assert "no-crosstalk" not in run_scenario(load_scenario("return-path-crosstalk"),
                                              "internal-id").violated


def test_the_seeds_race_is_latent_and_names_the_point_it_needs() -> None:
    result = run_scenario(load_scenario("abort-reuse"), "buggy", witness=True)
    assert "engine-alive" in result.violated
    reach = result.reach()
    assert (reach.reach, reach.needs) == ("latent", ("frontend.abort:after_pop",))
    assert reach.describe("0.33") == ("latent hazard: needs a delay at frontend.abort:after_pop, "
                                      "which does not yield in vLLM 0.33")
    # a violation before the latent delay was taken does not need it
    first = result.violations[0]
    assert result.reach(first).reach == "latent"


def _pd(vllm: str, **request: object) -> Scenario:
    return scenario_from_dict({"name": "pd", "topology": "pd", "horizon": 200.0,
                               "engine": {"vllm": vllm},
                               "request": [{"id": "X", "prompt_tokens": 32, "max_tokens": 5,
                                            **request}]})


def test_heartbeats_keep_the_033_lease_through_a_slow_read() -> None:
    """A 100 s KV read: 0.33's 30 s lease is renewed every 5 s by the decode side and the
    blocks go when the read is done; a 30 s fixed timeout (0.8 style) frees them under it."""
    slow = [("pd.kv:read", 0, 100.0)]
    leased = run_scenario(_pd("0.33"), "internal-id", delays=slow)
    assert leased.violated == ()
    assert len(_kinds(leased, "pd.heartbeat")) >= 19
    assert [e.detail.cause for e in _kinds(leased, "pd.release")] == ["notify"]  # type: ignore[attr-defined]
    timeout = _pd("0.8")
    timeout = scenario_from_dict({**timeout.to_dict(), "pd": {"hold_timeout": 30.0}})
    expired = run_scenario(timeout, "internal-id", delays=slow)
    assert [e.detail.cause for e in _kinds(expired, "pd.release")] == ["timeout"]  # type: ignore[attr-defined]
    assert "kv-ownership" in expired.violated  # D reads blocks P already freed


def test_an_aborted_033_request_waiting_for_remote_kv_keeps_its_blocks_until_the_read() -> None:
    slow = [("pd.kv:read", 0, 0.2)]
    for vllm, freed_at_abort in (("0.8", True), ("0.33", False)):
        result = run_scenario(_pd(vllm, abort_at=0.03), "internal-id", delays=slow)
        frees = [e.time for e in _kinds(result, "kv.free")
                 if e.component == "decode.kv"]  # type: ignore[attr-defined]
        # the ABORT reaches D at 0.0305; the read ends at 0.2115
        assert len(frees) == 1 and (frees[0] < 0.1) == freed_at_abort
        # 0.8 frees them at once, so the read then completes into free blocks (#32255)
        expect = {"metrics-exact", "kv-destination"} if freed_at_abort else {"metrics-exact"}
        assert set(result.violated) == expect


def test_explore_reach_live_delays_only_live_and_yield_points(tmp_path: Path) -> None:
    scen = load_scenario("abort-reuse")
    res = explore(scen, "buggy", budget=60, workers=1, reach="live", out_dir=tmp_path)
    profile = get_profile("0.33")
    assert res.coverage and all(profile.width(p) != "latent" for p in res.coverage)
    doc = res.document()
    assert doc["search"] == "live" and doc["vllm"] == "0.33"


def test_a_counterexample_without_a_profile_replays_on_08(tmp_path: Path) -> None:
    scen = load_scenario("abort-reuse").with_vllm("0.8")
    data = scen.to_dict()
    del data["engine"]["vllm"]
    old = {"format": "racesim-counterexample/1", "scenario": data, "policy": "buggy",
           "policy_options": {}, "seed": 0, "skip": [], "violations": [], "trace_hash": "",
           "schedule": [{"point": "frontend.abort:after_pop", "occurrence": 0, "delay": 0.05}]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old), encoding="utf-8")
    cx = read_counterexample(str(path))
    assert cx.vllm == "0.8"
    result = run_scenario(cx.scenario, cx.policy, schedule=cx.schedule)
    assert "unique-live-id" in result.violated  # the seed-era overwrite, not 0.33's assert


def test_internal_id_on_033_has_no_live_race_in_the_abort_storm_but_abort_isolation(
        tmp_path: Path) -> None:
    """Issue 12's third "done when": vLLM 0.33 as shipped (random internal IDs), searched
    only at points that are live or yield there, shows nothing beyond the stats gap and
    abort-isolation, which its unperturbed run already shows (an abort by external ID ends the
    other clients' requests under that ID, output_processor.py:627-629)."""
    scen = load_scenario("abort-storm")
    res = explore(scen, "internal-id", budget=300, workers=1, reach="live",
                  skip=("metrics-exact", "abort-isolation"), out_dir=tmp_path)
    assert res.runs == 300 and res.violating_runs == 0
    assert run_scenario(scen, "internal-id", skip=["metrics-exact"]).violated == \
        ("abort-isolation",)


def test_replay_says_in_one_line_when_a_file_no_longer_reproduces(tmp_path: Path) -> None:
    import subprocess
    import sys

    scen = load_scenario("abort-reuse").with_vllm("0.8")
    result = run_scenario(scen, "abort-scope", witness=True)
    assert result.violated == ("metrics-exact",)
    cx = Counterexample(scen, "abort-scope", {}, 0, result.schedule, (),
                        tuple(v.as_dict() for v in result.violations), result.trace_hash)
    path = write_counterexample(tmp_path / "cx.json", cx)
    same = subprocess.run([sys.executable, "-m", "racesim", "replay", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert same.returncode == 0 and "no longer reproduces" not in same.stderr
    moved = subprocess.run([sys.executable, "-m", "racesim", "replay", str(path), "--vllm",
                            "0.33", "--strict", "--json"],
                           capture_output=True, text=True, timeout=120)
    lines = moved.stderr.splitlines()
    assert len(lines) == 1 and "no longer reproduces on vLLM 0.33" in lines[0], moved.stderr
    assert json.loads(moved.stdout)["vllm"] == "0.33"


def test_an_idle_033_engine_drops_the_eager_copy_of_a_stale_abort() -> None:
    """X finishes in the engine, but its last output is slow to reach the frontend, so the
    client's abort at 0.5 s still sends an ABORT; the engine, idle by then, applies the
    input-queue copy (a miss) and drops the aborts-queue copy on its next idle pass
    (0.33 core.py:1650-1666). The new X sent at 2 s must run to the end."""
    scen = scenario_from_dict({"name": "stale", "engine": {"vllm": "0.33"}, "request": [
        {"id": "X", "at": 0.0, "prompt_tokens": 16, "max_tokens": 3, "abort_at": 0.5},
        {"id": "X", "at": 2.0, "prompt_tokens": 16, "max_tokens": 3}]})
    slow = [("ipc.output:transit", 2, 1.0)]
    result = run_scenario(scen, "internal-id", options=NO_SUFFIX, delays=slow)
    assert result.requests[1].finish_reason == "length"
    assert "abort-precision" not in result.violated and "no-hang" not in result.violated
