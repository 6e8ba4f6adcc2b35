"""``racesim corpus`` under faults (issue 28 item 5; ../shared/research/reliability.md D1-D5, D8):
Ctrl-C, a hostile current folder, a release venv that prints garbage or never exits, a half-made
install, a SIGKILL of corpus, and the ``--release``/``--venvs`` combinations.

A release venv here is a fake: ``DIR/<release>/bin/python`` is a shell script, so each fault
is exact and nothing imports vLLM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _cli import cli, one_line_error
from test_corpus import entry

import racesim.corpus.remote as remote
from racesim.corpus import corpus_entries, install_releases

_PY = [sys.executable, "-I", "-m", "racesim"]  # -I: the test's own folder is not imported


def _entry_file(tmp_path: Path, buggy: str = "0.9.2", fixed: str = "0.10.1.1") -> Path:
    path = tmp_path / "1-example.toml"
    path.write_text(entry(buggy=buggy, fixed=fixed), encoding="utf-8")
    return path


def _fake_python(venvs: Path, release: str, script: str, mode: int = 0o755) -> Path:
    python = venvs / release / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text("#!/bin/sh\n" + script, encoding="utf-8")
    python.chmod(mode)
    return python


def _answer(status: str = "found") -> str:
    doc = {"entries": [{"name": "1-example",
                        "buggy": {"release": "0.9.2", "status": status, "runs": 4,
                                  "first_find_run": 3, "first_find_s": 0.5},
                        "fixed": {"release": "0.10.1.1", "status": "not run"}}]}
    return f"cat <<'EOF'\n{json.dumps(doc)}\nEOF\n"


def _terminal_env() -> dict[str, str]:
    """The environment a user's shell gives racesim: without what vLLM, imported into this
    test process by earlier tests, put into os.environ (LD_PRELOAD, VLLM_*, torch's)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("VLLM_", "LD_PRELOAD", "TORCH", "AITER_", "NUMEXPR_",
                                 "LOCAL_WORLD_SIZE", "TRITON_", "TILELANG_", "PYTORCH_"))}


def _terminal_signals() -> None:
    """Ctrl-C as a terminal delivers it: SIGINT at its default, not blocked, whatever this
    test process inherited or set up (the child starts from here)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def test_ctrl_c_stops_the_corpus_with_exit_130(tmp_path: Path) -> None:
    """D1: SIGINT stops the exploration running, nothing more starts (the fixed side's
    100,000 model runs would take minutes), exit 130, and the document says what finished."""
    path = _entry_file(tmp_path)
    proc = subprocess.Popen([*_PY, "corpus", str(path), "--json", "--model-budget", "100000",
                             "--venvs", str(tmp_path / "none"), "--out", str(tmp_path / "o")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=_terminal_env(), preexec_fn=_terminal_signals)
    time.sleep(6.0)  # past the imports, into the buggy side's model exploration
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("corpus ran on for a minute after Ctrl-C")
    assert proc.returncode == 130, (err, out[-2000:])
    assert "interrupted" in err and "Traceback" not in err
    doc = json.loads(out)
    assert doc["interrupted"] is True
    (e,) = doc["entries"]
    assert e["fixed"]["status"] == "not run"  # never started
    assert e["buggy"]["model"]["status"] == "interrupted"


def test_release_processes_do_not_import_the_current_folder(tmp_path: Path) -> None:
    """D2: the release's process runs ``python -I``: a ``rich.py`` in the folder where the
    user typed the command never runs (nor in the release's racesim, a real one here)."""
    work = tmp_path / "w"
    work.mkdir()
    canary = tmp_path / "CANARY"
    for mod in ("rich", "click", "simpy"):
        (work / f"{mod}.py").write_text(f"open({str(canary)!r}, 'a').write('{mod}')\n")
    path = _entry_file(tmp_path)
    _fake_python(tmp_path / "v", "0.9.2", f'exec {sys.executable} "$@"\n')
    proc = subprocess.run([*_PY, "corpus", str(path), "--json", "--budget", "2",
                           "--model-budget", "2", "--venvs", str(tmp_path / "v"),
                           "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, cwd=work, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    assert not canary.exists(), canary.read_text()
    (e,) = json.loads(proc.stdout)["entries"]
    assert e["buggy"]["status"] == "skipped"  # that python has vLLM 0.33.0, not 0.9.2
    assert e["buggy"]["model"]["status"] in ("found", "not found")


def test_bench_children_do_not_import_the_current_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """D2 in ``racesim bench``: its fresh processes start isolated too."""
    from racesim.bench.scale import in_fresh_process

    canary = tmp_path / "CANARY"
    (tmp_path / "json.py").write_text(f"open({str(canary)!r}, 'w')\n")
    monkeypatch.chdir(tmp_path)
    row = in_fresh_process("racesim.bench.features", "_feature_child", 0, 2)
    assert isinstance(row, dict)
    assert not canary.exists()


@pytest.mark.parametrize(("script", "needle"), [
    ("printf '\\377'\n", "not UTF-8"),
    ("echo '[1, 2]'\n", "not a corpus document"),
    ("echo '{\"entries\": [1]}'\n", "entries[0]"),
    ("echo '{\"entries\": [{\"name\": \"1-example\", \"buggy\": 5}]}'\n", "entries[0].buggy"),
    ("echo '{\"entries\": [{\"name\": \"1-example\", \"buggy\": {\"first_find_s\": \"x\"}}]}'\n",
     "first_find_s"),
    ("echo '{\"entries\": [{\"name\": \"1-example\", \"buggy\": {\"runs\": [1]}}]}'\n", "runs"),
    (f"{sys.executable} -c \"print('[' * 100000)\"\n", "JSON document"),
    ("exec yes\n", "more than"),
])
def test_malformed_release_output_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], script: str, needle: str) -> None:
    """D3: whatever the release's process prints, racesim reads at most MAX_OUTPUT bytes and
    checks the document: garbage is one line naming the venv, exit 2, no traceback (exit 1
    would read as "a race")."""
    path = _entry_file(tmp_path)
    _fake_python(tmp_path / "v", "0.9.2", script)
    code, _, err = cli(capsys, "corpus", str(path), "--budget", "2", "--model-budget", "2",
                       "--venvs", str(tmp_path / "v"), "--out", str(tmp_path / "o"))
    one_line_error(code, err, "0.9.2", needle)


def test_a_release_that_never_exits_is_killed_at_its_time_limit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """D3: the release's process gets the explorations' --time-limit (plus STARTUP_S to import
    vLLM, shortened here): 2 explorations × 0.5 s + 1 s; then it is killed and the release skipped with one line."""
    monkeypatch.setattr(remote, "STARTUP_S", 1.0)
    path = _entry_file(tmp_path)
    _fake_python(tmp_path / "v", "0.9.2", "exec sleep 40\n")
    started = time.monotonic()
    code, out, _ = cli(capsys, "corpus", str(path), "--json", "--time-limit", "0.5",
                       "--model-budget", "2", "--venvs", str(tmp_path / "v"),
                       "--out", str(tmp_path / "o"))
    assert time.monotonic() - started < 25
    assert code == 0
    (e,) = json.loads(out)["entries"]
    assert e["buggy"]["status"] == "skipped"
    assert "still running after 2 s" in e["buggy"]["reason"]


def test_a_half_made_install_is_finished_not_taken_for_installed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """D4: a venv with bin/python but no vLLM (a failed or stopped install) is installed
    again (the script is idempotent); a finished one is "already in"."""
    from racesim.corpus import releases

    path = _entry_file(tmp_path, buggy="0.20.0", fixed="0.33.0")
    calls: list[str] = []
    monkeypatch.setattr(releases, "install", lambda folder, v, **kw: calls.append(v))
    monkeypatch.setattr("racesim.corpus.installed_vllm", lambda: "0.33.0")
    _fake_python(tmp_path / "v", "0.20.0", "exit 1\n")
    lines = install_releases(corpus_entries([str(path)]), tmp_path / "v")
    assert calls == ["0.20.0"] and "installed in" in lines[0]
    site = tmp_path / "v" / "0.20.0" / "lib" / "python3.11" / "site-packages"
    (site / "vllm-0.20.0.dist-info").mkdir(parents=True)
    (site / "vllm-0.20.0.dist-info" / "METADATA").write_text("Name: vllm\n")
    (site / "racesim-0.1.0.dist-info").mkdir()
    calls.clear()
    lines = install_releases(corpus_entries([str(path)]), tmp_path / "v")
    assert calls == [] and "already in" in lines[0]


def _pids_with(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes().decode("utf-8", "replace"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_release_process_dies_with_corpus(tmp_path: Path) -> None:
    """D5: SIGKILL of corpus leaves no release process running on alone."""
    marker = f"racesim-orphan-{os.getpid()}-{tmp_path.name}"
    path = _entry_file(tmp_path)
    _fake_python(tmp_path / "v", "0.9.2",
                 f"exec {sys.executable} -c 'import time; time.sleep(120)' {marker}\n")
    parent = subprocess.Popen([*_PY, "corpus", str(path), "--json", "--venvs",
                               str(tmp_path / "v"), "--out", str(tmp_path / "o")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not _pids_with(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _pids_with(marker), "the release process never started"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while _pids_with(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _pids_with(marker)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for pid in _pids_with(marker):  # only the processes this test started
            os.kill(pid, signal.SIGKILL)
    assert left == [], "the release process outlived corpus"


def test_release_with_venvs_runs_that_release_in_its_venv(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """D8: ``--release R --venvs DIR`` runs R from DIR (it used to ignore DIR)."""
    path = _entry_file(tmp_path)
    _fake_python(tmp_path / "v", "0.9.2", _answer())
    code, out, err = cli(capsys, "corpus", str(path), "--json", "--release", "0.9.2",
                         "--venvs", str(tmp_path / "v"), "--out", str(tmp_path / "o"))
    assert code == 0, err
    (e,) = json.loads(out)["entries"]
    assert e["buggy"]["status"] == "found" and e["buggy"]["first_find_run"] == 3
    assert e["fixed"]["status"] == "not run"


def test_release_no_entry_uses_is_exit_2(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """D8: ``--release`` naming a release none of the entries uses ran nothing, exit 0."""
    path = _entry_file(tmp_path)
    code, _, err = cli(capsys, "corpus", str(path), "--release", "0.20.0",
                       "--out", str(tmp_path / "o"))
    one_line_error(code, err, "--release 0.20.0", "0.9.2, 0.10.1.1")


def test_a_python_that_is_not_executable_skips_its_release(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """D8: a bin/python without the execute bit is one skipped release, not the corpus's end
    (like the other broken venvs)."""
    path = _entry_file(tmp_path)
    _fake_python(tmp_path / "v", "0.9.2", _answer(), mode=0o644)
    code, out, err = cli(capsys, "corpus", str(path), "--json", "--model-budget", "2",
                         "--venvs", str(tmp_path / "v"), "--out", str(tmp_path / "o"))
    assert code == 0, err
    (e,) = json.loads(out)["entries"]
    assert e["buggy"]["status"] == "skipped"
    assert "not an executable file" in e["buggy"]["reason"]
    assert e["buggy"]["model"]["status"] in ("found", "not found")


def test_a_release_no_adapter_supports_is_not_offered_an_install(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """D8: 0.9.0 (an entry's buggy release) has no vllm-backend adapter: the line says so
    rather than "racesim corpus --install DIR installs it", which it cannot."""
    path = _entry_file(tmp_path, buggy="0.9.0", fixed="0.9.2")
    code, out, err = cli(capsys, "corpus", str(path), "--json", "--model-budget", "2",
                         "--venvs", str(tmp_path / "none"), "--out", str(tmp_path / "o"))
    assert code == 0, err
    (e,) = json.loads(out)["entries"]
    assert "no adapter for vLLM 0.9.0" in e["buggy"]["reason"]
    assert "--install" not in e["buggy"]["reason"]
    assert "--install" in e["fixed"]["reason"]  # 0.9.2 can be installed
