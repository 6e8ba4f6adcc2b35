"""``racesim replay`` and a file's release fields (issue 28; research/reliability.md D6): the
top-level ``vllm`` decides the profile, ``vllm_release`` is compared with the vLLM that
replays it, and the notes name what changed on the backend that ran."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _cli import cli, one_line_error

import racesim.runner.engines as engines
from racesim.cli.support import replay_note
from racesim.documents import COUNTEREXAMPLE_KEYS, Counterexample


def _file(tmp_path: Path, **top: Any) -> Path:
    """abort-reuse's witness as a counterexample file, its top-level fields changed."""
    from racesim.documents import write_counterexample
    from racesim.runner import RunSpec
    from racesim.scenarios import load_scenario

    scen = load_scenario("abort-reuse").with_vllm("0.33")
    spec = RunSpec.of(scen, "buggy")
    res = spec.run()
    cx = Counterexample(scen, "buggy", {}, 0, (), (), (), res.trace_hash)
    path = write_counterexample(tmp_path / "cx.json", cx)
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc.update(top)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_the_top_level_vllm_decides_the_profile(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The embedded scenario names 0.33, the file's ``vllm`` says 0.20: the file's word wins
    (it used to be ignored whenever the scenario named a profile)."""
    path = _file(tmp_path, vllm="0.20", vllm_release="0.20.0")
    code, out, err = cli(capsys, "replay", str(path), "--json")
    assert code in (0, 1), err
    assert json.loads(out)["vllm"] == "0.20"


def test_a_vllm_file_for_another_release_names_that_release(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 0.20.0 file on the vllm backend, no vLLM installed: the hint installs 0.20.0 (it named
    0.33.0, the embedded scenario's profile); with 0.33.0 installed it is refused, not run."""
    path = _file(tmp_path, vllm="0.20", vllm_release="0.20.0", engine="vllm")
    monkeypatch.setattr(engines, "installed_vllm", lambda: None)
    code, _, err = cli(capsys, "replay", str(path))
    one_line_error(code, err, "install-vllm-cpu 0.20.0")
    monkeypatch.setattr(engines, "installed_vllm", lambda: "0.33.0")
    code, _, err = cli(capsys, "replay", str(path))
    one_line_error(code, err, "profile 0.20 needs vLLM 0.20.0", "0.33.0 is installed")


def _note(cx_engine: str, cx_release: str, engine: str, same_hash: bool) -> str | None:
    cx = SimpleNamespace(violations=(), engine=cx_engine, vllm_release=cx_release,
                         trace_hash="a" * 64)
    result = SimpleNamespace(violated=(), engine=engine, vllm="0.33",
                             trace_hash="a" * 64 if same_hash else "b" * 64)
    return replay_note("cx.json", cx, result, as_json=False)


def test_a_hash_change_on_the_vllm_backend_blames_vllm_not_the_model(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines, "installed_vllm", lambda: "0.33.0")
    note = _note("vllm", "0.33.0", "vllm", same_hash=False)
    assert note is not None and "vLLM's behaviour or the backend changed" in note
    assert "the model changed" not in note
    note = _note("model", "0.33.0", "model", same_hash=False)
    assert note is not None and "the model changed" in note


def test_a_file_written_on_another_patch_release_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Same profile, another release installed: replay runs (the adapters follow the
    profile) and says which release wrote the file and which replayed it."""
    monkeypatch.setattr(engines, "installed_vllm", lambda: "0.33.0")
    note = _note("vllm", "0.33.1", "vllm", same_hash=True)
    assert note is not None and "vLLM 0.33.1" in note and "vLLM 0.33.0" in note
    assert _note("vllm", "0.33.0", "vllm", same_hash=True) is None


def test_every_key_a_file_is_written_with_is_a_known_key(tmp_path: Path) -> None:
    """Unknown top-level keys are refused (tests/test_bad_input.py); a key a newer writer adds
    must be added to COUNTEREXAMPLE_KEYS, or every file it writes would be refused."""
    doc = json.loads(_file(tmp_path).read_text(encoding="utf-8"))
    assert set(doc) <= COUNTEREXAMPLE_KEYS
