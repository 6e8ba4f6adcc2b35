"""RACESIM_VLLM_RUNNER=model: the vllm backend steps racesim's model of the runner (the fake
executor 0.9.2 steps) under vLLM's own frontend and engine, read once with the backend.

The runs are marked ``vllm``: they need vLLM 0.33.x and skip without it (fail under CI).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import cli, one_line_error

from racesim.runner import Backend, RunSpec, as_backend, run_scenario
from racesim.scenarios import load_scenario
from racesim.sim import InputError

REPO = Path(__file__).resolve().parents[1]
ENV = "RACESIM_VLLM_RUNNER"


def test_the_runner_asked_for_is_read_once_with_the_backend_and_pickles(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert as_backend("vllm").runner is None
    monkeypatch.setenv(ENV, "model")
    chosen = as_backend("vllm")
    assert chosen.runner == "model" and as_backend("model").runner is None
    monkeypatch.delenv(ENV)
    spec = RunSpec.of(load_scenario("abort-reuse"), "buggy", engine=chosen)
    assert pickle.loads(pickle.dumps(spec)).backend.runner == "model"
    monkeypatch.setenv(ENV, "vllm")
    with pytest.raises(InputError, match=f"{ENV}='vllm': expected model"):
        as_backend("vllm")


def test_a_bad_runner_value_exits_2_with_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ENV, "fake")
    one_line_error(*cli(capsys, "run", "abort-reuse", "--engine", "vllm")[::2], ENV, "'fake'")


def test_conform_and_corpus_keep_vllms_runner(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV, "model")
    one_line_error(*cli(capsys, "conform", "abort-reuse", "--budget", "1")[::2],
                   f"{ENV}=model: racesim conform")
    one_line_error(*cli(capsys, "corpus", "--budget", "1")[::2], f"{ENV}=model: racesim corpus")


def test_the_reproduce_command_sets_the_runner() -> None:
    from racesim.reports.commands import run_command

    line = run_command("abort-reuse", "buggy", {}, 0, (), engine="vllm", runner="model")
    assert line.startswith(f"{ENV}=model racesim run abort-reuse")
    assert ENV not in run_command("abort-reuse", "buggy", {}, 0, (), engine="vllm")


def _plain(events: tuple) -> list[tuple]:  # type: ignore[type-arg]
    return [(e.time, e.component, e.kind, e.request, e.inc, repr(e.detail)) for e in events]


@pytest.mark.vllm
def test_the_model_runner_differs_only_in_the_runners_own_events(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """abort-reuse on vLLM's frontend and engine: the model's runner adds its sampled-token
    events and changes nothing else (the tokens are the same fake network's); provenance names
    the runner as simulated, with the switch."""
    from racesim.reports.provenance import run_components, violation_provenance

    monkeypatch.delenv(ENV, raising=False)
    scen = load_scenario("abort-reuse")
    real = run_scenario(scen, "buggy", engine=Backend("vllm"))
    fake = run_scenario(scen, "buggy", engine=Backend("vllm", runner="model"))
    assert (real.runner, fake.runner) == ("", "model")
    assert real.frontend == fake.frontend == "vllm"
    assert real.trace_hash != fake.trace_hash
    own = [e for e in fake.trace if e.component.endswith(".runner")]
    assert own and {e.kind for e in own} == {"runner.sample"}
    assert not [e for e in real.trace if e.component.endswith(".runner")]
    seqs = {e.seq for e in own}
    assert _plain(real.trace) == _plain(tuple(e for e in fake.trace if e.seq not in seqs))
    assert real.violated == fake.violated
    assert "input-integrity" in real.evaluated and "input-integrity" not in fake.evaluated
    doc = run_components(fake)
    assert "runner" not in doc["vllm_code"] and "runner" in run_components(real)["vllm_code"]
    assert doc["simulated"]["runner"].endswith(f": {ENV}=model")
    assert doc["model_runner_because"] == f"{ENV}=model"
    assert "model_runner_because" not in run_components(real)
    books = violation_provenance(fake, {"invariant": "input-integrity"})
    assert books["by"] == "simulated" and books["simulated"] == ["runner"]


@pytest.mark.vllm
def test_same_hash_in_two_fresh_processes() -> None:
    code = ("from racesim.runner import run_scenario; from racesim.scenarios import "
            "load_scenario as l; r = run_scenario(l('abort-reuse'), 'buggy', "
            "engine='vllm'); print(r.runner, r.trace_hash)")
    env = {k: v for k, v in os.environ.items() if k != "RACESIM_VLLM_FRONTEND"}
    outs = []
    for seed in ("1", "2"):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**env, ENV: "model", "PYTHONHASHSEED": seed}, cwd=REPO,
                           timeout=600, check=False)
        outs.append(p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr)
    assert outs[0].startswith("model ") and outs[0] == outs[1]


@pytest.mark.vllm
def test_a_file_found_on_the_model_runner_records_it_and_replays_there(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from racesim.documents import Counterexample, violation_dicts, write_counterexample

    monkeypatch.setenv(ENV, "model")
    scen = load_scenario("abort-reuse")
    code, out, _err = cli(capsys, "run", "abort-reuse", "-p", "buggy", "--engine", "vllm")
    assert f"reproduce: {ENV}=model racesim run abort-reuse" in out, out
    r = run_scenario(scen, "buggy", engine="vllm")
    monkeypatch.delenv(ENV)
    cx = Counterexample(scen, "buggy", {}, 0, r.schedule, (), tuple(violation_dicts(r)),
                        r.trace_hash, engine="vllm", ids="given", frontend=r.frontend,
                        runner=r.runner)
    path = write_counterexample(tmp_path / "cx.json", cx)
    assert json.loads(path.read_text(encoding="utf-8"))["runner"] == "model"
    _code, out, _err = cli(capsys, "replay", str(path), "--engine", "vllm", "--json")
    doc = json.loads(out)
    assert doc["trace_hash"] == r.trace_hash
    assert doc["components"]["model_runner_because"] == f"{ENV}=model"
    # repro writes a script for vLLM's own classes: it refuses the model's runner in one line
    code, _out, err = cli(capsys, "repro", str(path), "--out", str(tmp_path / "r.py"))
    one_line_error(code, err, "RACESIM_VLLM_RUNNER=model")
