"""vLLM's own OpenAI completions endpoint (``OpenAIServingCompletion``) on vLLM's own frontend:
requests with ``endpoint = "completions"`` go through the release's serving class over each API
server's AsyncLLM, without a tokenizer (racesim/engine_vllm/frontend/serving.py). Line numbers
are vLLM 0.33.0's.

Marked ``vllm``: they need vLLM 0.33.x and skip without it (fail under CI, tests/conftest.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from racesim.engine_model.events import ApiRequest, FeAbortIssue, FeAdd
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario
from racesim.scenarios.loader import Scenario, scenario_from_dict
from racesim.sim.errors import InputError

REPO = Path(__file__).resolve().parents[1]
ENV = "RACESIM_VLLM_FRONTEND"
pytestmark = pytest.mark.vllm


@pytest.fixture(autouse=True)
def insist(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's own frontend, or one line saying why not."""
    monkeypatch.setenv(ENV, "asyncllm")


def _scenario(*requests: dict[str, Any], **top: Any) -> Scenario:
    base = {"id": "X", "at": 0.0, "prompt_tokens": 32, "max_tokens": 10,
            "endpoint": "completions"}
    return scenario_from_dict({"name": "t", "engine": {"vllm": "0.33"}, **top,
                               "request": [{**base, **r} for r in requests]})


def _served(r: Any) -> list[str]:
    return [ev.detail.served for ev in r.trace if isinstance(ev.detail, ApiRequest)]


def _adds(r: Any) -> list[tuple[str, str]]:
    return [(ev.request, ev.detail.external) for ev in r.trace if isinstance(ev.detail, FeAdd)]


def test_the_header_names_the_request_cmpl_base_item() -> None:
    """X-Request-Id is the base ID (serve/engine/serving.py:133-142), and each prompt i of the
    completion is cmpl-{base}-{i} (openai/completion/serving.py:147, 183): AsyncLLM's external
    ID, whose internal ID gets assign_request_id's 8-hex suffix as shipped."""
    r = run_scenario(_scenario({}, {"id": "Y", "id_via": "body"}), "internal-id", engine="vllm")
    assert r.frontend == "vllm" and r.violated == ()
    assert _served(r) == ["cmpl-X-0", "cmpl-Y-0"]
    (x_int, x_ext), (y_int, y_ext) = _adds(r)
    assert (x_ext, y_ext) == ("cmpl-X-0", "cmpl-Y-0")
    assert re.fullmatch(r"cmpl-X-0-[0-9a-f]{8}", x_int) and re.fullmatch(
        r"cmpl-Y-0-[0-9a-f]{8}", y_int)
    assert [(q.id, q.finish_reason) for q in r.requests] == [("X", "length"), ("Y", "length")]
    assert _adds(run_scenario(_scenario({}), "buggy", engine="vllm")) == [("cmpl-X-0",
                                                                           "cmpl-X-0")]


def test_the_served_id_is_what_vllms_serving_class_computes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Change vLLM's own _base_request_id and the ID AsyncLLM is given changes with it: the
    name is not racesim's."""
    from racesim.engine_vllm.frontend import endpoints

    cls = endpoints.names("completions").cls
    assert cls.__module__ == "vllm.entrypoints.openai.completion.serving"
    monkeypatch.setattr(cls, "_base_request_id",
                        staticmethod(lambda raw, default=None: "patched"))
    r = run_scenario(_scenario({}), "buggy", engine="vllm")
    assert _served(r) == ["cmpl-patched-0"]


def test_without_an_id_vllm_draws_its_16_hex_random_uuid_seeded() -> None:
    """No header, no body request_id: the body's default is vllm.utils.random_uuid(), the low
    64 bits of a uuid4 (utils/__init__.py:11-12), drawn from the run's seeded stream."""
    scen = _scenario({"id_via": "none"}, {"id": "Y", "id_via": "none"})
    a = _served(run_scenario(scen, "buggy", engine="vllm"))
    assert len(a) == 2 and a[0] != a[1]
    assert all(re.fullmatch(r"cmpl-[0-9a-f]{16}-0", s) for s in a)
    assert _served(run_scenario(scen, "buggy", engine="vllm")) == a


@pytest.mark.parametrize("stream", [True, False])
def test_a_disconnect_and_a_router_abort_end_the_request(
        monkeypatch: pytest.MonkeyPatch, stream: bool) -> None:
    """A cancelled handler (streaming: the stream's task) delivers CancelledError into
    AsyncLLM.generate, which aborts by the internal ID; a router's /abort_requests aborts the
    served external ID. Without streaming the client reads one CompletionResponse at the end
    (the router's abort still answers with the tokens so far and finish reason 'abort')."""
    from racesim.engine_vllm.frontend import serving

    monkeypatch.setattr(serving.ServingClient, "stream", stream)
    r = run_scenario(_scenario({"cancel_at": 0.035}, {"id": "Y", "abort_at": 0.05},
                               {"id": "Z"}), "internal-id", engine="vllm")
    issued = [(ev.request, ev.detail.ids) for ev in r.trace if isinstance(ev.detail, FeAbortIssue)]
    (x_req, x_ids), (y_req, y_ids) = issued
    assert x_req.startswith("cmpl-X-0-") and x_ids == [x_req]  # generate()'s internal abort
    assert y_req == "cmpl-Y-0" and y_ids[0].startswith("cmpl-Y-0-")  # by external ID
    assert [(q.id, q.finish_reason) for q in r.requests] == [
        ("X", "abort"), ("Y", "abort"), ("Z", "length")]
    outputs = [ev for ev in r.trace if ev.kind == "client.output" and ev.request == "Z"]
    assert len(outputs) == (10 if stream else 1)


def test_two_api_servers_with_one_x_request_id_meet_in_the_engine() -> None:
    """#27711 through vLLM's own endpoint: both servers name it cmpl-bench-0-0; without
    randomization 0.33's Scheduler asserts on the duplicate, as shipped both are served."""
    scen = load_scenario("completions-shared-request-id")
    buggy = run_scenario(scen, "buggy", engine="vllm")
    assert buggy.frontend == "vllm" and buggy.violated == ("engine-alive",)
    assert "duplicate request id at vllm/v1/core/sched/scheduler.py" in \
        buggy.violations[0].detail
    assert _served(buggy) == ["cmpl-bench-0-0"] * 2
    shipped = run_scenario(scen, "internal-id", engine="vllm")
    assert shipped.violated == () and {q.finish_reason for q in shipped.requests} == {"length"}
    model = run_scenario(scen, "buggy")
    assert model.violated == buggy.violated and _served(model) == _served(buggy)


def test_endpoints_that_need_a_tokenizer_run_the_models_frontend_and_say_why() -> None:
    with pytest.raises(InputError, match=r"asyncllm: .*chat endpoint .*tokenizer"):
        run_scenario(_scenario({"endpoint": "chat"}), "buggy", engine="vllm")
    with pytest.raises(InputError, match=r"asyncllm: .*stop string"):
        run_scenario(_scenario({"stop_string_at": 2}), "buggy", engine="vllm")


def test_same_seed_same_hash_under_other_hash_seeds() -> None:
    code = ("from racesim.runner import run_scenario; from racesim.scenarios.loader import "
            "scenario_from_dict as d; r = run_scenario(d({'name': 't', 'frontends': 2, "
            "'engine': {'vllm': '0.33'}, 'request': [{'id': 'X', 'at': 0.0, "
            "'prompt_tokens': 32, 'max_tokens': 10, 'endpoint': 'completions', "
            "'id_via': via, 'frontend': i} for i, via in enumerate(('none', 'header'))]}), "
            "'internal-id', engine='vllm'); print(r.frontend, r.trace_hash)")
    outs = []
    for seed in ("1", "2"):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}, cwd=REPO, timeout=600)
        outs.append(p.stdout.strip())
    assert outs[0].startswith("vllm ") and outs[0] == outs[1]


def test_the_scale_out_endpoint_and_routers_are_vllms_own() -> None:
    """router-abort-all on vLLM's own frontend: ServingTokens names X generate-tokens-X
    (scale_out/token_in_token_out/serving.py:202-204); the scale-out router's handler aborts
    it by external ID in a background task, which leaks the n = 2 parent; the RL router's
    abort-all sweeps it (rl/online/api_router.py:120-132)."""
    from racesim.engine_vllm.frontend import endpoints

    assert endpoints.names("generate-tokens").cls.__module__ == \
        "vllm.entrypoints.scale_out.token_in_token_out.serving"
    r = run_scenario(load_scenario("router-abort-all"), "buggy", engine="vllm")
    assert r.frontend == "vllm" and _served(r) == ["generate-tokens-X", "generate-tokens-Y"]
    routers = [(e.detail.router, e.detail.ids) for e in r.trace if e.kind == "api.router_abort"]
    assert routers == [("scale-out", ["generate-tokens-X"]), ("rl", ["generate-tokens-Y",
                                                                      "generate-tokens-X"])]
    assert "no-leak" not in r.violated
    assert [(q.id, q.finish_reason) for q in r.requests] == [("X", "abort"), ("Y", "abort")]


def test_n_2_through_an_endpoint_reads_one_chunk_per_choice_on_both_frontends(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """vLLM's stream generators send one SSE chunk per choice, so a client that hangs up after
    4 tokens can do so between the two choices of one step; the model's endpoint client reads
    the same chunks (engine_model/client.py ``_chunks``). Perturbed runs agree (without the
    per-choice reads, runs 4 and 7 of this search differed in the tokens received)."""
    from racesim.conform import conform
    from racesim.conform.frontend import SIDES

    monkeypatch.delenv(ENV)
    scen = _scenario({"n": 2, "max_tokens": 20, "abort_at": 0.05},
                     {"id": "Z", "n": 2, "max_tokens": 20, "endpoint": "generate-tokens",
                      "disconnect_after_tokens": 4})
    res = conform([scen], [("internal-id", {})], budget=8, workers=1, engines=SIDES,
                  out_dir=tmp_path)
    assert res.runs == 8 and not res.mismatches
