"""vLLM's own frontend (the default on --engine vllm where it runs; RACESIM_VLLM_FRONTEND=model
opts out, =asyncllm insists): vLLM 0.33's AsyncLLM, AsyncMPClient and OutputProcessor on the
World's asyncio loop, driving the vllm backend's engine.

Marked ``vllm``: they need vLLM 0.33.x and skip without it (fail under CI, tests/conftest.py).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from racesim.cli import cli
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario
from racesim.sim.errors import InputError

REPO = Path(__file__).resolve().parents[1]
ENV = "RACESIM_VLLM_FRONTEND"


def _window():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("w", REPO / "scripts" / "window-15326.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.reached


@pytest.fixture
def real(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default: vLLM's own frontend, with nothing in the environment."""
    monkeypatch.delenv(ENV, raising=False)


@pytest.mark.vllm
def test_abort_reuse_runs_vllm_asyncllm(real: None) -> None:
    r = run_scenario(load_scenario("abort-reuse"), "buggy", engine="vllm")
    assert (r.frontend, r.frontend_note) == ("vllm", "")
    # the client's abort pops X and sends an eager ABORT: the re-added X finishes normally
    assert [(q.id, q.finish_reason) for q in r.requests] == [("X", "abort"), ("X", "length")]
    assert r.violated == ("metrics-exact",)
    assert not _window()(r.trace)
    assert r.occurrences.get("send:v1.engine.async_llm.AsyncLLM.abort:ABORT") == 1


@pytest.mark.vllm
def test_a_delay_at_the_eager_abort_send_opens_15326_as_latent(real: None) -> None:
    from racesim.sim.points import delay_entry

    point = "send:v1.engine.async_llm.AsyncLLM.abort:ABORT"
    r = run_scenario(load_scenario("abort-reuse"), "buggy", engine="vllm",
                     delays=[delay_entry(point, None, 0.05, None, "test")])
    assert _window()(r.trace)
    assert "engine-alive" in r.violated  # vLLM's duplicate-request-id assert
    assert r.reach().reach == "latent"


@pytest.mark.vllm
def test_same_seed_same_hash_under_other_hash_seeds() -> None:
    """The default path (nothing in the environment) runs vLLM's own frontend, and its trace
    is the same in fresh processes whose str hashes differ."""
    code = ("from racesim.runner import run_scenario; from racesim.scenarios import "
            "load_scenario as l; r = run_scenario(l('abort-reuse'), 'buggy', "
            "engine='vllm'); print(r.frontend, r.trace_hash)")
    env = {k: v for k, v in os.environ.items() if k != ENV}
    outs = []
    for seed in ("1", "2"):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**env, "PYTHONHASHSEED": seed}, cwd=REPO, timeout=600)
        outs.append(p.stdout.strip())
    assert outs[0].startswith("vllm ") and outs[0] == outs[1]


@pytest.mark.vllm
def test_where_vllms_frontend_cannot_run_the_models_does_and_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """api-bare-id-abort's chat endpoint needs a tokenizer in vLLM's serving layer: by default
    the model's frontend runs on vLLM's engine, and the run's provenance names it with the one
    reason; insisting on vLLM's own is one line naming that reason; =model opts out with no
    reason to give."""
    from racesim.reports.provenance import run_components

    monkeypatch.delenv(ENV, raising=False)
    scen = load_scenario("api-bare-id-abort")
    r = run_scenario(scen, "buggy", engine="vllm")
    doc = run_components(r)
    assert r.frontend == "model" and "frontend" not in doc["vllm_code"]
    assert "OpenAI serving layer" in doc["model_frontend_because"]
    witness = run_scenario(load_scenario("abort-reuse"), "buggy", engine="vllm", witness=True)
    assert witness.frontend == "model" and "frontend.abort:after_pop" in witness.frontend_note
    monkeypatch.setenv(ENV, "asyncllm")
    with pytest.raises(InputError, match=f"^{ENV}=asyncllm: .*OpenAI serving layer"):
        run_scenario(scen, "buggy", engine="vllm")
    monkeypatch.setenv(ENV, "model")
    plain = run_scenario(load_scenario("abort-reuse"), "buggy", engine="vllm")
    assert (plain.frontend, plain.frontend_note) == ("model", "")
    assert "model_frontend_because" in run_components(plain)
    assert run_components(plain)["model_frontend_because"] is None


@pytest.mark.vllm
def test_the_cli_says_nothing_extra_when_the_models_frontend_stands_in(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from _cli import cli as run_cli
    from _cli import one_line_error

    monkeypatch.delenv(ENV, raising=False)
    args = ("run", "api-bare-id-abort", "-p", "buggy", "--engine", "vllm")
    _code, out, err = run_cli(capsys, *args)
    assert "frontend does not run" not in out + err and "serving layer" not in out + err
    monkeypatch.setenv(ENV, "asyncllm")
    one_line_error(*run_cli(capsys, *args)[::2], f"{ENV}=asyncllm", "OpenAI serving layer")


@pytest.mark.vllm
def test_a_model_policy_is_refused_with_the_patch_hint(real: None) -> None:
    with pytest.raises(InputError, match="--vllm-patch"):
        run_scenario(load_scenario("abort-reuse"), "abort-scope", engine="vllm")


def test_a_bad_frontend_value_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "nope")
    from racesim.engine_vllm.frontend.select import requested

    with pytest.raises(InputError, match=ENV):
        requested()


@pytest.mark.vllm
def test_list_points_reads_the_release_code() -> None:
    out = CliRunner().invoke(cli, ["list", "points", "--engine", "vllm", "--json"]).output
    assert "output_handler: await asyncio.sleep(0)" in out
    assert "AsyncLLM.abort: await self.engine_core.abort_requests_async(...)" in out


@pytest.mark.vllm
def test_a_preprocessing_fault_is_the_engines_on_vllms_frontend(real: None) -> None:
    """The scripted fault rides beside the ADD's frames; the engine's input thread answers it
    with an ERROR output. With equal IDs vLLM's OutputProcessor takes the retry as the first
    stream's update and drops the ERROR: the retry hangs, as on the model's frontend."""
    scen = load_scenario("preprocess-error-reuse")
    r = run_scenario(scen, "buggy", engine="vllm")
    assert "no-hang" in r.violated and r.reach().reach == "live"
    assert not run_scenario(scen, "internal-id", engine="vllm").violated


@pytest.mark.vllm
def test_pause_generation_is_vllms_own_call_and_reply(real: None) -> None:
    """A trainer task awaits vLLM's AsyncLLM.pause_generation(mode="abort"): its UTILITY call
    reaches the engine's busy loop and its reply comes back; the retry of X during the pause
    hangs with equal IDs, as on the model's frontend (pause-abort-reuse)."""
    scen = load_scenario("pause-abort-reuse")
    r = run_scenario(scen, "buggy", engine="vllm")
    assert "no-hang" in r.violated and r.reach().reach == "live"
    assert [q.finish_reason for q in r.requests] == ["stream_finished", None, "length"]
    assert r.occurrences.get("send:v1.engine.async_llm.AsyncLLM.pause_generation:UTILITY") == 1
    utilities = [e for e in r.trace if e.kind == "engine.utility"]
    assert [e.detail.method for e in utilities] == ["pause_generation", "resume_scheduler"]
    assert not run_scenario(scen, "internal-id", engine="vllm").violated


@pytest.mark.vllm
def test_a_keep_pause_agrees_with_the_models_frontend(tmp_path: Path) -> None:
    """pause_generation(mode="keep") freezes X instead of aborting it (PAUSED_ALL, no
    rejections): with equal IDs the retry of X is a duplicate vLLM's Scheduler asserts on,
    on both frontends; vLLM's pause call is answered only once the engine is idle."""
    from racesim.conform import conform
    from racesim.conform.frontend import SIDES

    text = (REPO / "scenarios" / "bundled" / "pause-abort-reuse.toml").read_text()
    assert 'pause_mode = "abort"' in text
    path = tmp_path / "keep.toml"
    path.write_text(text.replace('pause_mode = "abort"', 'pause_mode = "keep"'))
    scen = load_scenario(str(path))
    res = conform([scen], [("buggy", {}), ("internal-id", {})], budget=4, workers=1,
                  engines=SIDES)
    assert res.runs == 8 and not res.mismatches
    assert res.cells[0]["engine_death_runs"] == 4 and res.cells[1]["violating_runs"] == 0


@pytest.mark.vllm
def test_an_add_before_the_engine_connects_is_dropped_on_vllms_frontend(real: None) -> None:
    """dropped-add: vLLM's own ROUTER send of X goes into a pipe with no engine yet (the
    model's gate), so X's client hangs; Y, sent after the engine connected, is served."""
    r = run_scenario(load_scenario("dropped-add"), "buggy", engine="vllm")
    assert r.violated == ("no-hang",) and r.reach().reach == "live"
    assert [(q.id, q.finish_reason) for q in r.requests] == [("X", None), ("Y", "length")]
    assert any(e.kind == "ipc.dropped" and e.request == "X" for e in r.trace)


@pytest.mark.vllm
def test_a_streaming_input_session_is_vllms_own_on_its_frontend(real: None) -> None:
    """streaming-input-session: the client hands AsyncLLM.generate an async generator of
    vLLM's StreamingInput chunks; vLLM's handle_inputs task adds each under the session's
    internal ID and then the final add. With equal IDs the second S ends session S early and
    hangs; under internal-id both sessions run every chunk and the duplicate completes."""
    scen = load_scenario("streaming-input-session")
    buggy = run_scenario(scen, "buggy", engine="vllm")
    assert "no-hang" in buggy.violated and buggy.reach().reach == "live"
    assert [(q.id, q.tokens) for q in buggy.requests][:2] == [("S", 10), ("S", 0)]
    safe = run_scenario(scen, "internal-id", engine="vllm")
    assert safe.violated == ()
    assert [(q.id, q.tokens, q.finish_reason) for q in safe.requests] == [
        ("S", 15, "length"), ("S", 5, "length"), ("T", 40, "length")]


@pytest.mark.vllm
def test_the_rl_routers_abort_all_sweeps_the_leaked_parent(real: None, tmp_path: Path) -> None:
    """router-abort-all without its endpoints (AsyncLLM alone; with them, vLLM's serving layer
    runs it: tests/test_serving_vllm.py): X (n = 2) aborted by its external ID leaks its parent
    in vLLM's OutputProcessor; the
    abort-all at 0.3 s names every request_states and parent_requests key and pops it, on
    both frontends."""
    from racesim.conform import conform
    from racesim.conform.frontend import SIDES

    text = (REPO / "scenarios" / "bundled" / "router-abort-all.toml").read_text()
    plain = "\n".join(line for line in text.splitlines() if not line.startswith("endpoint = "))
    assert len(plain.splitlines()) == len(text.splitlines()) - 2
    path = tmp_path / "abort-all.toml"
    path.write_text(plain + "\n")
    scen = load_scenario(str(path))
    r = run_scenario(scen, "buggy", engine="vllm")
    swept = [e.detail.ids for e in r.trace if e.kind == "api.router_abort"]
    assert swept == [["Y", "X"]]  # Y still runs; X is the parent its external abort left
    assert "no-leak" not in r.violated
    assert [(q.id, q.finish_reason) for q in r.requests] == [("X", "abort"), ("Y", "abort")]
    res = conform([scen], [("buggy", {}), ("internal-id", {})], budget=3, workers=1,
                  engines=SIDES)
    assert res.runs == 6 and not res.mismatches


@pytest.mark.vllm
def test_a_file_found_on_the_models_frontend_replays_there(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A schedule at points both frontends pass (an IPC delay) would run on vLLM's own
    frontend by default: the file records the model's, and replay keeps to it."""
    import json

    from _cli import cli as run_cli

    from racesim.documents import Counterexample, violation_dicts, write_counterexample
    from racesim.sim import Decision

    scen = load_scenario("abort-reuse")
    schedule = (Decision("ipc.input:transit", 1, 0.003),)
    monkeypatch.setenv(ENV, "model")
    r = run_scenario(scen, "buggy", engine="vllm", schedule=schedule)
    monkeypatch.delenv(ENV)
    assert run_scenario(scen, "buggy", engine="vllm", schedule=schedule).trace_hash \
        != r.trace_hash  # the default, vLLM's frontend, is another trace
    cx = Counterexample(scen, "buggy", {}, 0, r.schedule, (), tuple(violation_dicts(r)),
                        r.trace_hash, engine="vllm", ids="given", frontend=r.frontend)
    path = write_counterexample(tmp_path / "cx.json", cx)
    assert json.loads(path.read_text(encoding="utf-8"))["frontend"] == "model"
    _code, out, _err = run_cli(capsys, "replay", str(path), "--engine", "vllm", "--json")
    doc = json.loads(out)
    assert doc["trace_hash"] == r.trace_hash
    assert "frontend" not in doc["components"]["vllm_code"]
