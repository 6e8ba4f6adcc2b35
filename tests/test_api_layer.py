"""The API layer in front of AsyncLLM (vLLM 0.33.0 entrypoints/): endpoint prefixes, the
header/body ID, the routers' aborts, and the two invariants that judge whose abort ends whose
request (abort-isolation, orphan-run). Line numbers are vLLM 0.33.0's; see
racesim/engine_model/api_server.py."""

from __future__ import annotations

from typing import Any

import pytest

from racesim.engine_model.events import ApiRequest, FeAdd
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
    assert a != b and a.startswith("chatcmpl-") and len(a) == len("chatcmpl-") + 32
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
