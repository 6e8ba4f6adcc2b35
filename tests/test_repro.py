"""``racesim repro``: a counterexample found on vLLM's own classes as a script that runs on vLLM
alone (racesim/repro/, engine_vllm/journal.py). Each script is run the way a maintainer would:
by this venv's python with ``-I`` and ``racesim`` made unimportable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _cli import cli, one_line_error

from racesim.explore import explore
from racesim.scenarios import load_scenario

pytestmark = pytest.mark.vllm

_NO_RACESIM = ("import sys; sys.modules['racesim'] = None; path = sys.argv[1]; "
               "exec(compile(open(path).read(), path, 'exec'))")


def _counterexample(tmp_path: Path, name: str, policy: str, engine: str = "vllm",
                    budget: int = 40, **kw: object) -> str:
    res = explore(load_scenario(name), policy, budget=budget, seed=0, engine=engine,
                  out_dir=tmp_path, **kw)  # type: ignore[arg-type]
    assert res.counterexample_path is not None
    return res.counterexample_path


def _run_script(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-c", _NO_RACESIM, str(script)],
                          capture_output=True, text=True, timeout=600, cwd=script.parent)


def test_push_pairing_reproduces_on_vllm_alone(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The pairing vLLM 0.33.0's push writer makes, replayed call by call, is asserted on the
    Requests of vLLM's own Schedulers: P's request and D's differ in prompt."""
    path = _counterexample(tmp_path, "pd-push-pairing", "internal-id", reach="live",
                           skip=("metrics-exact",))
    script = tmp_path / "push_repro.py"
    code, out, err = cli(capsys, "repro", path, "--out", str(script))
    assert code == 0, err
    assert "vLLM 0.33.0" in out and "crosstalk" in out
    text = script.read_text()
    assert "import racesim" not in text and "from racesim" not in text
    done = _run_script(script)
    assert done.returncode != 0
    assert "AssertionError: crosstalk: P's push writer paired" in done.stderr
    assert "replay diverged" not in done.stderr


def test_duplicate_in_flight_reproduces_with_vllms_own_assert(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _counterexample(tmp_path, "duplicate-in-flight", "buggy", budget=2)
    script = tmp_path / "dup_repro.py"
    code, out, err = cli(capsys, "repro", path, "--out", str(script))
    assert code == 0, err
    assert "duplicate request id at vllm/v1/core/sched/scheduler.py:" in out
    done = _run_script(script)
    assert done.returncode != 0
    assert "AssertionError: duplicate request id" in done.stderr
    assert "vllm/v1/core/sched/scheduler.py" in done.stderr


def test_a_model_counterexample_is_refused(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = _counterexample(tmp_path, "duplicate-in-flight", "buggy", engine="model", budget=2)
    code, _out, err = cli(capsys, "repro", path, "--out", str(tmp_path / "x.py"))
    one_line_error(code, err, "racesim's model, a simulated part")
    assert not (tmp_path / "x.py").exists()


def test_pull_mode_p_d_is_refused_naming_the_simulated_transport(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _counterexample(tmp_path, "pd-reuse", "buggy", budget=2)
    code, _out, err = cli(capsys, "repro", path, "--out", str(tmp_path / "x.py"))
    one_line_error(code, err, "simulated part", "nixl-pull", "engine_vllm/connectors/nixl.py")


def test_a_missing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = cli(capsys, "repro", str(tmp_path / "none.json"))
    one_line_error(code, err, "no such counterexample file")


@pytest.mark.parametrize(("entry", "ops"), [
    ("46066-reset-running-spec-inflight", [("reset", [True, False])]),
    ("42043-pause-keep-clear-cache", [("pause", "PAUSED_ALL"), ("reset", [True, True]),
                                      ("pause", "UNPAUSED")])])
def test_a_pause_and_a_cache_reset_are_journaled_for_the_replay(
        entry: str, ops: list[tuple[str, object]]) -> None:
    """A reset with running requests preempts them and a pause keeps the Scheduler from
    scheduling: the journal records both, in order, so a repro script makes them too."""
    from racesim.conform import lifecycle
    from racesim.engine_vllm import journal
    from racesim.runner import run_scenario

    scen = load_scenario(entry).with_vllm("0.33")
    policy, options = lifecycle("0.33")
    with journal.recording() as j:
        run_scenario(scen, policy, options=options, engine="vllm")
    got = [(e["op"], e.get("args", e.get("state"))) for e in j.entries
           if e["op"] in ("reset", "pause")]
    assert got == ops
