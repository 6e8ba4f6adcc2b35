"""Speculative decoding on the vllm backend (``[engine] num_speculative_tokens``): vLLM's own
Scheduler schedules the drafts and reserves their placeholders, vLLM's own runner drafts them and
corrects its positions for the rejected ones; the fake network only answers and accepts
(racesim.engine_vllm.runner.spec). The model refuses such scenarios.

The ``vllm`` tests run on the installed release (0.33.0 in the main venv, 0.20.0 in CI's second
one: tests/conftest.py ``ANY_RELEASE``): skipped locally without vLLM, a failure under CI.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _cli import cli, one_line_error

from racesim.runner import run_scenario
from racesim.runner.engines import installed_profile, why_not_run
from racesim.scenarios import load_scenario, parse_scenario
from racesim.sim import InputError

K = 2

SPEC = f"""
name = "spec-probe"
summary = "two requests decoding with {K} drafts a step under async scheduling"
topology = "single"
frontends = 1
horizon = 10.0

[engine]
num_blocks = 64
block_size = 16
step_time = 0.01
async_scheduling = true
num_speculative_tokens = {K}

[ipc]
latency = 0.0005

[[request]]
id = "A"
at = 0.0
prompt_tokens = 24
max_tokens = 30

[[request]]
id = "B"
at = 0.004
prompt_tokens = 12
max_tokens = 20
"""


def _scenario(text: str = SPEC) -> Any:
    scen = parse_scenario(text, "spec-probe.toml")
    profile = installed_profile()
    return scen.with_vllm(profile) if profile else scen


def _runs_here(scen: Any) -> Any:
    """``scen`` on the installed release's profile."""
    return scen.with_vllm(installed_profile())


def test_the_model_refuses_speculative_decoding() -> None:
    scen = _scenario()
    with pytest.raises(InputError, match="vllm backend only"):
        run_scenario(scen, "buggy")
    assert "vllm backend only" in (why_not_run(scen.workload, "model") or "")
    assert why_not_run(scen.workload, "vllm") is None


def test_conform_refuses_a_speculative_scenario_in_one_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # conform always runs the model's side, so "run it with --engine vllm" would not help;
    # refused before its --out folder is made
    monkeypatch.chdir(tmp_path)
    code, _out, err = cli(capsys, "conform", "30142-preempt-async-inflight", "--budget", "1")
    one_line_error(code, err, "conform compares the model with vLLM", "num_speculative_tokens")
    assert not list(tmp_path.iterdir())


def test_num_speculative_tokens_must_be_positive() -> None:
    with pytest.raises(InputError, match="num_speculative_tokens"):
        parse_scenario(SPEC.replace(f"num_speculative_tokens = {K}",
                                    "num_speculative_tokens = 0"), "bad.toml")


def test_the_30142_entry_decodes_speculatively() -> None:
    assert load_scenario("30142-preempt-async-inflight").workload.engine \
        .num_speculative_tokens == K


@pytest.mark.vllm
def test_vllms_scheduler_reserves_one_plus_k_placeholders(
        vllm_backend: Any, vllm_systems: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """AsyncScheduler._update_after_schedule (0.33 async_scheduler.py) adds 1 + the step's
    scheduled drafts to ``num_output_placeholders``; the drafts are vLLM's own scheduling of
    ``num_speculative_tokens`` (-1 placeholders the runner fills)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    steps: list[tuple[str, int, int]] = []  # (request, drafts scheduled, placeholders added)
    orig = AsyncScheduler._update_after_schedule

    def spy(self: Any, so: Any) -> None:
        before = {rid: self.requests[rid].num_output_placeholders
                  for rid in so.num_scheduled_tokens}
        orig(self, so)
        for rid in so.num_scheduled_tokens:
            req = self.requests[rid]
            if not req.is_prefill_chunk:
                steps.append((rid, len(so.scheduled_spec_decode_tokens.get(rid, ())),
                              req.num_output_placeholders - before[rid]))

    monkeypatch.setattr(AsyncScheduler, "_update_after_schedule", spy)
    res = run_scenario(_scenario(), "buggy", engine="vllm")
    assert res.violations == ()
    assert {o.id: o.tokens for o in res.requests} == {"A": 30, "B": 20}
    assert steps and all(added == 1 + drafts for _rid, drafts, added in steps)
    assert sum(1 for _rid, drafts, _a in steps if drafts == K) >= 10
    (system,) = vllm_systems
    verifier = system.engines[0].runner.real.verifier
    # vLLM's runner sent drafts to verify (its ngram drafter proposed them), and the network
    # accepted some, not all
    assert verifier.verified
    assert any(a < n for n, a in verifier.verified) and any(a == n for n, a in verifier.verified)


@pytest.mark.vllm
def test_acceptance_is_the_runs_seeded_choice(vllm_backend: Any,
                                              vllm_systems: list[Any]) -> None:
    scen = _scenario()
    first = run_scenario(scen, "buggy", engine="vllm", seed=3)
    again = run_scenario(scen, "buggy", engine="vllm", seed=3)
    other = run_scenario(scen, "buggy", engine="vllm", seed=4)
    assert first.trace_hash == again.trace_hash
    runs = [s.engines[0].runner.real.verifier.verified for s in vllm_systems]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert other.violations == ()


def _two_batches(scen: Any) -> Any:
    """``scen`` without its pipeline parallelism: two batches in flight (async scheduling)."""
    w = scen.workload
    return replace(scen, workload=replace(w, engine=replace(w.engine,
                                                            pipeline_parallel_size=None)))


@pytest.mark.vllm
def test_the_30142_workload_preempts_with_a_speculative_step_in_flight(
        vllm_backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry's workload reaches what PRs #47900 and #48245 describe with two batches in
    flight already: vLLM's own ``_preempt_request`` under KV pressure, on a request whose
    decode step with K drafts (1 + K placeholders) has not returned yet; that step drains
    before the request resumes, and nothing breaks."""
    from vllm.v1.core.sched.scheduler import Scheduler

    in_flight: list[int] = []
    orig = Scheduler._preempt_request

    def spy(self: Any, request: Any, *args: Any, **kwargs: Any) -> None:
        in_flight.append(request.num_output_placeholders)
        orig(self, request, *args, **kwargs)

    monkeypatch.setattr(Scheduler, "_preempt_request", spy)
    res = run_scenario(_runs_here(_two_batches(load_scenario("30142-preempt-async-inflight"))),
                       "buggy", engine="vllm")
    assert res.violations == ()
    assert in_flight and max(in_flight) >= 1 + K


@pytest.mark.vllm
def test_the_30142_entry_resumes_a_request_with_a_stale_step_in_flight(
        vllm_backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three batches in flight (the entry's pipeline_parallel_size = 3). 0.20.0: a request is
    preempted with two steps in flight and resumed before the second returns; its
    ``num_output_tokens`` then counts that step's placeholders (scheduler.py:1102-1104), and
    vLLM's own runner rebuilds its output tokens from prompt tokens (input-integrity). 0.33.0's
    V1 runner refuses async scheduling with pipeline parallelism, and so does racesim."""
    scen = _runs_here(load_scenario("30142-preempt-async-inflight"))
    if installed_profile() == "0.33":
        assert "refuses" in (why_not_run(scen.workload, "vllm") or "")
        with pytest.raises(InputError, match="pipeline_parallel_size"):
            run_scenario(scen, "buggy", engine="vllm")
        return
    from vllm.v1.core.sched.scheduler import Scheduler

    stale_at_resume: list[int] = []
    orig = Scheduler._make_cached_request_data

    def spy(self: Any, running: Any, resumed: Any, *args: Any) -> Any:
        stale_at_resume.extend(r.num_output_placeholders for r in resumed)
        return orig(self, running, resumed, *args)

    monkeypatch.setattr(Scheduler, "_make_cached_request_data", spy)
    res = run_scenario(scen, "buggy", engine="vllm")
    assert res.violations and {v.invariant for v in res.violations} == {"input-integrity"}
    assert "position 20 is token" in res.violations[0].detail  # B's first output position
    assert max(stale_at_resume) == 1 + K
    # with two batches in flight every resumed request's steps have drained
    stale_at_resume.clear()
    assert run_scenario(_two_batches(scen), "buggy", engine="vllm").violations == ()
    assert stale_at_resume and max(stale_at_resume) == 0


@pytest.mark.vllm
def test_synchronous_scheduling_takes_the_runners_drafts(vllm_backend: Any,
                                                        vllm_systems: list[Any]) -> None:
    """Without async scheduling EngineCore.post_step hands the runner's drafts to the
    scheduler after each step (0.33 core.py:699-706); without that no draft is ever verified."""
    scen = _scenario(SPEC.replace("async_scheduling = true", "async_scheduling = false"))
    res = run_scenario(scen, "buggy", engine="vllm")
    assert res.violations == ()
    assert {o.id: o.tokens for o in res.requests} == {"A": 30, "B": 20}
    (system,) = vllm_systems
    verified = system.engines[0].runner.real.verifier.verified
    assert sum(n for n, _a in verified) >= 20 and any(a for _n, a in verified)


def _placeholders_probe() -> Any:
    path = Path(__file__).resolve().parents[1] / "scripts" / "placeholders-30142.py"
    spec = importlib.util.spec_from_file_location("placeholders_30142", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.vllm
def test_two_batches_in_flight_drain_a_preempted_requests_step_exactly(
        vllm_backend: Any) -> None:
    """#30142's window on the installed release's own AsyncScheduler
    (scripts/placeholders-30142.py): requests are preempted with a step of 1 + K placeholders in
    flight, and with two batches in flight (what vLLM runs under async scheduling) that step's
    output takes back exactly what it reserved before the request can resume: no underflow."""
    got = _placeholders_probe().measure(2, K, 20)
    assert got["underflows"] == []
    assert got["preempt_inflight"] >= 20 and got["drafts"] >= 1000
    assert got["finished"] == 3 * 20


@pytest.mark.vllm
def test_three_batches_in_flight_underflow_before_the_fix(vllm_backend: Any) -> None:
    """The probe is not blind: with a third batch queued a preempted request resumes while its
    stale step is in flight, and that step's output drives vLLM's own counter below zero
    (``assert request.num_output_placeholders >= 0``, async_scheduler.py) on releases before
    PR #48245, which delivers a preempted request's stale output without touching it (0.33)."""
    import vllm

    from racesim.engine_vllm._api import release_key

    got = _placeholders_probe().measure(3, K, 20)
    if release_key(vllm.__version__) >= (0, 33):
        assert got["underflows"] == [] and got["finished"] == 3 * 20
    else:
        assert got["underflows"]
        assert all("v1/core/sched/async_scheduler.py:" in u and
                   "num_output_placeholders >= 0" in u for u in got["underflows"])
