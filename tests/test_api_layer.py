"""The API layer in front of AsyncLLM (vLLM 0.33.0 entrypoints/): endpoint prefixes, the
header/body ID, the routers' aborts, and the two invariants that judge whose abort ends whose
request (abort-isolation, orphan-run). Line numbers are vLLM 0.33.0's; see
racesim/engine_model/api_server.py."""

from __future__ import annotations

from typing import Any

import pytest

from racesim.engine_model.events import ApiCancel, ApiRequest, ApiStore, FeAdd, SchedFinish
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario
from racesim.scenarios.loader import Scenario, scenario_from_dict
from racesim.sim.errors import InputError


def _scenario(*requests: dict[str, Any], **top: Any) -> Scenario:
    base = {"id": "X", "at": 0.0, "prompt_tokens": 32, "max_tokens": 40}
    return scenario_from_dict({"name": "t", "engine": {"vllm": "0.33"}, **top,
                               "request": [{**base, **r} for r in requests]})


def _served(result: Any) -> list[str]:
    return [ev.detail.served for ev in result.trace if isinstance(ev.detail, ApiRequest)]


@pytest.mark.parametrize(("endpoint", "served"), [
    ("chat", "chatcmpl-X"),              # openai/chat_completion/serving.py:320-322
    ("completions", "cmpl-X-0"),         # openai/completion/serving.py:147, 183
    ("generate-tokens", "generate-tokens-X"),  # scale_out/token_in_token_out/serving.py:202-204
])
def test_each_endpoint_prefixes_the_client_id(endpoint: str, served: str) -> None:
    r = run_scenario(_scenario({"endpoint": endpoint}), "buggy")
    assert _served(r) == [served]
    adds = [ev.request for ev in r.trace if isinstance(ev.detail, FeAdd)]
    assert adds == [served]  # the ID AsyncLLM registered (randomization off)
    assert r.violations == ()


def test_header_and_body_ids_are_honoured_and_none_draws_a_uuid() -> None:
    for via in ("header", "body"):
        r = run_scenario(_scenario({"endpoint": "chat", "id_via": via}), "buggy")
        assert _served(r) == ["chatcmpl-X"]
    r = run_scenario(_scenario({"endpoint": "chat", "id_via": "none"},
                               {"endpoint": "chat", "id_via": "none"}), "buggy")
    a, b = _served(r)
    # random_uuid() is 16 hex characters (0.33.0 utils/__init__.py:11-12)
    assert a != b and a.startswith("chatcmpl-") and len(a) == len("chatcmpl-") + 16
    again = run_scenario(_scenario({"endpoint": "chat", "id_via": "none"},
                                   {"endpoint": "chat", "id_via": "none"}), "buggy")
    assert _served(again) == [a, b]  # seeded: the same uuids in every run


@pytest.mark.parametrize("policy", ["buggy", "internal-id"])
def test_a_bare_id_abort_aborts_nothing_and_the_request_runs_on(policy: str) -> None:
    r = run_scenario(load_scenario("api-bare-id-abort"), policy)
    assert r.violated == ("orphan-run",)
    assert r.requests[0].finish_reason == "length"  # ran to max_tokens
    assert r.reach().reach == "live"


@pytest.mark.parametrize("policy", ["buggy", "internal-id"])
def test_an_abort_naming_the_served_id_ends_the_request(policy: str) -> None:
    scen = _scenario({"endpoint": "chat", "abort_at": 0.05, "abort_names": "served"})
    r = run_scenario(scen, policy, skip=["metrics-exact"])
    assert r.violations == ()
    assert r.requests[0].finish_reason == "abort"


def test_a_disconnect_aborts_by_internal_id_and_orphans_nothing() -> None:
    scen = _scenario({"endpoint": "chat", "disconnect_after_tokens": 3})
    r = run_scenario(scen, "internal-id", skip=["metrics-exact"])
    assert r.violations == ()


def test_one_clients_abort_ends_anothers_request_under_unique_internal_ids() -> None:
    r = run_scenario(load_scenario("api-cross-client-abort"), "internal-id")
    assert "abort-isolation" in r.violated
    assert "abort-precision" not in r.violated  # both were live under the ID it named
    assert [q.finish_reason for q in r.requests] == ["abort", "abort"]
    v = next(v for v in r.violations if v.invariant == "abort-isolation")
    assert r.reach(v).reach == "live"


def test_distinct_ids_keep_aborts_isolated() -> None:
    scen = _scenario({"endpoint": "chat", "abort_at": 0.05},
                     {"id": "Y", "at": 0.01, "endpoint": "chat"})
    r = run_scenario(scen, "internal-id", skip=["metrics-exact"])
    assert r.violations == ()
    assert [q.finish_reason for q in r.requests] == ["abort", "length"]


def test_the_api_keys_need_an_endpoint_and_a_single_topology() -> None:
    with pytest.raises(InputError, match=r"id_via: needs request\.endpoint"):
        _scenario({"id_via": "body"})
    with pytest.raises(InputError, match="endpoint: must be one of"):
        _scenario({"endpoint": "responses-v2"})
    with pytest.raises(InputError, match='topology = "single" only'):
        _scenario({"endpoint": "chat"}, topology="pd")


# -- the Responses API's background mode (openai/responses/serving.py) --------------------------

def _cancels(result: Any) -> list[tuple[int, str, int, int]]:
    return [(ev.detail.uid, ev.detail.outcome, ev.detail.owner, ev.detail.task)
            for ev in result.trace if isinstance(ev.detail, ApiCancel)]


def test_a_cancel_of_a_reused_response_id_stops_the_other_clients_task() -> None:
    r = run_scenario(load_scenario("responses-cancel-reused-id"), "internal-id",
                     skip=["metrics-exact"])
    assert set(r.violated) == {"abort-isolation", "orphan-run"}
    assert _cancels(r) == [(1, "cancelled", 2, 2)]  # A's cancel: B's entry, B's task
    assert [q.finish_reason for q in r.requests] == ["length", "abort"]
    assert all(r.reach(v).reach == "live" for v in r.violations)


def test_after_the_first_finishes_the_second_cannot_cancel_its_own() -> None:
    first = {"id": "R", "endpoint": "responses", "id_via": "body", "max_tokens": 8}
    second = {"id": "R", "at": 0.02, "endpoint": "responses", "id_via": "body",
              "abort_at": 0.3}
    r = run_scenario(_scenario(first, second), "internal-id", skip=["metrics-exact"])
    stores = [(ev.detail.owner, ev.detail.status) for ev in r.trace
              if isinstance(ev.detail, ApiStore)]
    # A's finish overwrites B's queued entry (serving.py:944-949) and pops B's task entry
    assert stores == [(1, "queued"), (2, "queued"), (1, "completed"), (2, "completed")]
    assert _cancels(r) == [(2, "refused", 0, 0)]
    assert r.violated == ("orphan-run",)
    assert [q.finish_reason for q in r.requests] == ["length", "length"]


def test_a_cancel_of_an_own_response_id_stops_only_its_own_task() -> None:
    mine = {"id": "R1", "endpoint": "responses", "id_via": "body", "abort_at": 0.05}
    other = {"id": "R2", "at": 0.01, "endpoint": "responses", "id_via": "body"}
    r = run_scenario(_scenario(mine, other), "internal-id", skip=["metrics-exact"])
    assert r.violations == ()
    assert _cancels(r) == [(1, "cancelled", 1, 1)]
    assert [q.finish_reason for q in r.requests] == ["abort", "length"]


def test_the_responses_api_ignores_the_header() -> None:
    r = run_scenario(_scenario({"endpoint": "responses", "id_via": "header"}), "buggy")
    (served,) = _served(r)
    assert served.startswith("resp_") and served.endswith("_0")


# -- notify_kv_transfer_request_rejected's raw-ID ADD (async_llm.py:961-987) --------------------

def test_a_rejected_decode_request_adds_its_raw_id_and_can_kill_the_engine() -> None:
    scen = load_scenario("kv-reject-raw-id")
    r = run_scenario(scen, "buggy")
    assert r.violated == ("engine-alive",)  # the raw ID equals the running chatcmpl-X
    assert [q.finish_reason for q in r.requests] == ["error", "error"]
    raw = [ev.detail.served for ev in r.trace
           if isinstance(ev.detail, ApiRequest) and ev.detail.via == "kv-rejected"]
    assert raw == ["chatcmpl-X"]  # neither prefixed nor randomized


def test_the_raw_id_misses_a_randomized_request_and_is_aborted_at_once() -> None:
    r = run_scenario(load_scenario("kv-reject-raw-id"), "internal-id")
    assert r.violations == ()
    finishes = [(ev.request, ev.detail.cause) for ev in r.trace
                if isinstance(ev.detail, SchedFinish)]
    assert ("chatcmpl-X", "abort-immediately") in finishes
    assert [q.finish_reason for q in r.requests] == ["length", "error"]


@pytest.mark.parametrize(("name", "expected"), [
    ("api-cross-client-abort", {"abort-isolation"}),
    ("api-bare-id-abort", {"orphan-run"}),
    ("responses-cancel-reused-id", {"abort-isolation", "orphan-run"}),
])
def test_explore_under_internal_id_reports_the_api_layer_invariants(
        name: str, expected: set[str], tmp_path: Any) -> None:
    from racesim.explore import explore
    res = explore(load_scenario(name), "internal-id", budget=20, workers=1,
                  skip=("metrics-exact",), out_dir=tmp_path)
    assert expected <= set(res.invariants) | set(res.baseline_violations)
    assert res.counterexample is not None
    assert expected <= {v["invariant"] for v in res.counterexample.violations}
    assert res.counterexample.reach == "live"


def test_an_endpoint_client_with_n_2_reads_one_chunk_per_choice() -> None:
    """vLLM's stream generators send each choice of a RequestOutput as its own SSE chunk
    (openai/completion/serving.py completion_stream_generator): the endpoint client's outputs
    hold one choice each, and only the last choice's finish ends the stream."""
    from racesim.engine_model.events import ClientOutput

    r = run_scenario(_scenario({"endpoint": "completions", "n": 2, "max_tokens": 3}), "buggy")
    outs = [ev.detail for ev in r.trace if isinstance(ev.detail, ClientOutput)]
    assert all(len({t[0] for t in o.tokens}) == 1 for o in outs)
    assert [o.finish for o in outs if o.finish] == ["length"]
    assert sum(len(o.tokens) for o in outs) == 6
