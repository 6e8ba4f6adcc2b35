"""Corrections from the 0.33 source audit: #57061's symptom through encode's TypeError, the
stop-string ABORT window's width as a function of the step's size, and the DP rank pin that
reqs_in_flight affinity overrides. Line numbers are vLLM 0.33.0's."""

from __future__ import annotations

import dataclasses
import json

from click.testing import CliRunner

from racesim.cli import cli
from racesim.engine_model.events import DpRoute, FeEncodeError
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario
from racesim.scenarios.loader import Scenario

STOP = "frontend.output_handler:before_abort_send"


def _requests(scen: Scenario, *specs: object) -> Scenario:
    return dataclasses.replace(scen, workload=dataclasses.replace(scen.workload,
                                                                  requests=tuple(specs)))


# -- #57061 through encode (serial_utils.py:220-225, async_llm.py:838-851) ---------------------

def test_an_encode_error_after_registration_leaks_the_state_and_the_dp_entry() -> None:
    r = run_scenario(load_scenario("encode-error-leak"), "internal-id")
    assert r.violated == ("no-leak",)
    leaks = sorted(v.detail.split(" still holds")[0] for v in r.violations)
    assert leaks == ["frontend0 DPLBAsyncMPClient.reqs_in_flight",
                     "frontend0 OutputProcessor.request_states"]
    assert [q.finish_reason for q in r.requests] == ["error", "length"]
    assert r.reach().reach == "live"
    assert any(isinstance(ev.detail, FeEncodeError) for ev in r.trace)


def test_without_the_unencodable_object_nothing_leaks() -> None:
    scen = load_scenario("encode-error-leak")
    x, y = scen.workload.requests
    r = run_scenario(_requests(scen, dataclasses.replace(x, unserializable=False), y),
                     "internal-id")
    assert r.violations == ()


def test_n_above_1_aborts_its_parent_on_the_encode_error() -> None:
    """The fan-out's except aborts the parent (async_llm.py:552-564): the OutputProcessor is
    clean. Under DP the first child, the one add_request_async routed before encode raised,
    keeps its reqs_in_flight entry: its ABORT reaches an engine that never had it, which never
    reports it finished (core_client.py:1874-1900, 1819-1825)."""
    scen = load_scenario("encode-error-leak")
    x, y = scen.workload.requests
    r = run_scenario(_requests(scen, dataclasses.replace(x, n=2), y), "internal-id",
                     skip=["metrics-exact"])
    assert [(v.invariant, v.request) for v in r.violations] == [("no-leak", "0_X-94d478f8")]
    assert "reqs_in_flight" in r.violations[0].detail
    assert r.requests[0].finish_reason == "error"
    w = scen.workload
    single = dataclasses.replace(scen, workload=dataclasses.replace(
        w, engine=dataclasses.replace(w.engine, data_parallel_size=None),
        requests=(dataclasses.replace(x, n=2), y)))
    assert run_scenario(single, "internal-id", skip=["metrics-exact"]).violations == ()


# -- the stop-string ABORT's width (async_llm.py:891-922) ----------------------------------------

def test_the_stop_string_window_is_live_in_a_step_of_more_than_128_outputs() -> None:
    r = run_scenario(load_scenario("stop-string-large-step"), "buggy", witness=True)
    assert {"engine-alive", "no-crosstalk"} <= set(r.violated)
    assert (STOP, 0) in r.widened
    assert r.reach().reach == "live"


def test_the_same_witness_is_latent_when_the_step_fits_one_chunk() -> None:
    small = run_scenario(load_scenario("stop-string-reuse"), "buggy", witness=True)
    assert small.widened == () and small.reach().reach == "latent"
    scen = load_scenario("stop-string-large-step")
    w = scen.workload
    one_chunk = dataclasses.replace(scen, workload=dataclasses.replace(
        w, frontend=dataclasses.replace(w.frontend, output_chunk_size=256)))
    r = run_scenario(one_chunk, "buggy", witness=True)
    assert "engine-alive" in r.violated
    assert r.widened == () and r.reach().reach == "latent"


def test_list_points_shows_the_mid_step_width() -> None:
    out = CliRunner().invoke(cli, ["list", "points", "--vllm", "0.33", "--json"])
    assert out.exit_code == 0, out.output
    points = {p["name"]: p for p in json.loads(out.output)["points"]}
    assert points[STOP]["width"] == "latent" and points[STOP]["width_mid_step"] == "yield"
    text = CliRunner().invoke(cli, ["list", "points", "--vllm", "0.33"]).output
    assert "[latent; yield mid-step]" in text


# -- the DP rank pin (core_client.py:1758-1763) ------------------------------------------------

def _routes(result: object) -> list[tuple[int, bool]]:
    return [(ev.detail.engine, ev.detail.affinity) for ev in result.trace  # type: ignore
            if isinstance(ev.detail, DpRoute)]


def test_affinity_overrides_the_pin_of_a_same_id_retry() -> None:
    r = run_scenario(load_scenario("dp-rank-pin-override"), "buggy")
    assert _routes(r) == [(0, False), (0, True)]  # pinned to 1, sent to 0
    assert "engine-alive" in r.violated


def test_with_unique_internal_ids_each_pin_holds() -> None:
    r = run_scenario(load_scenario("dp-rank-pin-override"), "internal-id")
    assert _routes(r) == [(0, False), (1, False)]
    assert r.violations == ()
