"""The acceptance case of issue 25 item 5: a patch that inserts ``await asyncio.sleep(0)`` in
vLLM's own ``AsyncLLM.abort``, between the OutputProcessor's abort and the ABORT send
(v1/engine/async_llm.py:955-956 in 0.33.0, :712-713 in 0.20.0), opens a live race that
``racesim diff --vllm-patch`` reports shrunk and replayable; the unpatched tree opens nothing.

It needs vLLM's own AsyncLLM running in the World, selected with RACESIM_VLLM_FRONTEND=asyncllm
(not yet the vllm backend's default, docs/backends.md): with the model's AsyncLLM a patch to
async_llm.py changes nothing in a run. It runs on the installed release (0.33.0 in the main
venv, 0.20.0 in CI's second one: tests/conftest.py ``ANY_RELEASE``), whose own
``async_llm.py`` the patch is made from.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ASYNC_LLM = "vllm/v1/engine/async_llm.py"
SEND = "        all_request_ids = self.output_processor.abort_requests(request_ids, internal)\n"


def _installed() -> Path:
    from racesim.runner.vllm_tree import installed_package_dir

    found = installed_package_dir()
    assert found is not None
    return found


def _yield_in_abort(tmp_path: Path) -> Path:
    old = (_installed().parent / ASYNC_LLM).read_text()
    assert old.count(SEND) == 1, "AsyncLLM.abort changed shape in this release"
    new = old.replace(SEND, SEND + "        await asyncio.sleep(0)\n")
    assert "\nimport asyncio\n" in old
    path = tmp_path / "yield-in-abort.diff"
    path.write_text("".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                 f"a/{ASYNC_LLM}", f"b/{ASYNC_LLM}")))
    return path


def _racesim(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "racesim", *args], capture_output=True,
                          text=True, timeout=3000, cwd=tmp_path,
                          env={**os.environ, "RACESIM_CACHE": str(tmp_path / "cache"),
                               "RACESIM_VLLM_FRONTEND": "asyncllm"})


@pytest.mark.vllm
@pytest.mark.parametrize("patched", [True, False], ids=["yield-in-abort", "unpatched"])
def test_a_yield_in_asyncllm_abort_opens_a_live_race(tmp_path: Path, patched: bool) -> None:
    if patched:
        patch = _yield_in_abort(tmp_path)
    else:
        patch = tmp_path / "empty.diff"
        patch.write_text("")
    from racesim.runner.engines import installed_profile

    done = _racesim(["diff", "-s", "abort-reuse", "-p", "buggy", "--reach", "live",
                     "--budget", "100", "--vllm", str(installed_profile()),
                     "--vllm-patch", str(patch), "--out", "out", "--json"], tmp_path)
    doc = json.loads(done.stdout)
    opened = [c for cell in doc["cells"] for c in cell["opens"]]
    if not patched:
        assert done.returncode == 0 and opened == [], done.stderr[-2000:]
        return
    assert done.returncode == 1, done.stderr[-2000:]
    live = [c for c in opened if c["reach"] == "live" and c["verdict"] == "race"]
    assert live, opened
    assert live[0]["shrink_runs"] > 0
    words = shlex.split(live[0]["replay"])
    assert words[:2] == ["racesim", "replay"] and "--vllm-patch" in words
    replayed = _racesim(words[1:], tmp_path)
    assert replayed.returncode == 1 and live[0]["invariant"] in replayed.stdout
