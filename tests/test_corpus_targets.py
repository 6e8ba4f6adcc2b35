"""What each backend judges a corpus entry by, an entry for a bug still open upstream, and the
runner entries on vLLM's own model runner of their releases (README "The bug corpus").

vLLM's own runner can show a bug as another symptom than the model does (#29355: the model
sees the duplicate live ID, vLLM 0.11's runner the old request's token in the new one's
input), so an entry may name ``vllm_invariant``. The release checks at the end run a release's
own venv (``$RACESIM_VLLM_VENVS`` or ``~/.cache/racesim/vllm``) and are skipped where it is
not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_corpus import entry

import racesim.corpus as corpus
from racesim.corpus import CorpusOptions, release_lifecycle
from racesim.corpus.releases import default_folder, venv_python
from racesim.reports.corpus import invariant_cell
from racesim.scenarios import load_scenario, parse_scenario, scenario_to_toml
from racesim.sim import InputError

REPO = Path(__file__).resolve().parents[1]


def test_an_entry_may_name_the_invariant_the_vllm_backend_judges() -> None:
    scen = parse_scenario(entry(extra='vllm_invariant = "input-integrity"\n'), "e.toml")
    info = scen.corpus
    assert info is not None
    assert info.target("vllm") == ("input-integrity", "")
    assert info.target("model") == ("engine-alive", "")
    assert parse_scenario(scenario_to_toml(scen), "again.toml") == scen
    plain = parse_scenario(entry(extra='symptom = "boom"\n'), "e.toml").corpus
    assert plain is not None
    assert plain.target("vllm") == plain.target("model") == ("engine-alive", "boom")


@pytest.mark.parametrize(("extra", "needle"), [
    ('vllm_invariant = "alive"\n', "corpus.vllm_invariant: must be one of"),
    ('vllm_symptom = "boom"\n', "corpus.vllm_symptom: needs vllm_invariant"),
])
def test_a_bad_vllm_invariant_is_one_error(extra: str, needle: str) -> None:
    with pytest.raises(InputError, match=needle.replace(".", r"\.")):
        parse_scenario(entry(extra=extra), "e.toml")


def test_each_backend_explores_for_its_own_invariant(monkeypatch: pytest.MonkeyPatch) -> None:
    """#29355: the vllm backend's search targets input-integrity, the model's unique-live-id;
    the table's invariant cell names both."""
    seen: dict[str, tuple[str | None, str | None]] = {}

    def fake_explore(scen: Any, policy: str, **kw: Any) -> Any:
        seen[kw["engine"]] = (kw["target"], kw["symptom"])
        raise _Stop

    monkeypatch.setattr(corpus, "explore", fake_explore)
    monkeypatch.setattr(corpus, "why_not_run", lambda *a: None)
    scen = load_scenario("29355-tool-call-async-reuse")
    for engine in ("vllm", "model"):
        with pytest.raises(_Stop):
            corpus._explore_one(scen, "0.11.0", "buggy", engine, CorpusOptions(), None)
    assert seen == {"vllm": ("input-integrity", None), "model": ("unique-live-id", None)}
    doc = corpus._entry_doc(scen)
    assert (doc["invariant"], doc["vllm_invariant"]) == ("unique-live-id", "input-integrity")
    assert invariant_cell(doc) == "vllm: input-integrity; model: unique-live-id"
    same = corpus._entry_doc(load_scenario("23440-tool-loop-runner-batch"))
    assert invariant_cell(same) == "engine-alive" and same["vllm_symptom"] == "broadcast"


class _Stop(Exception):
    pass


def test_an_open_bug_says_so_with_or_without_a_proposed_fix() -> None:
    info = load_scenario("57562-chunked-prefill-concurrent-async").corpus
    assert info is not None
    assert (info.fix_kind, info.fix_pr, info.fixed_release) == ("open", 0, "open")
    assert info.fix_text == "open upstream (no fix proposed)"
    proposed = load_scenario("46240-abort-recv-send-same-step").corpus
    assert proposed is not None and proposed.fix_text.startswith("open; proposed fix #")
    assert parse_scenario(entry(fixed="open", extra='fix_kind = "open"\n').replace(
        "fix_pr = 2", "fix_pr = 0"), "e.toml").corpus is not None
    with pytest.raises(InputError, match=r"corpus\.fixed_release: must be \"open\""):
        parse_scenario(entry(extra='fix_kind = "open"\n'), "e.toml")
    with pytest.raises(InputError, match=r"corpus\.fix_pr: must be a vLLM issue"):
        parse_scenario(entry().replace("fix_pr = 2", "fix_pr = 0"), "e.toml")


# -- on a release's own venv ----------------------------------------------------------------------

def _run_on(release: str, name: str) -> dict[str, Any]:
    """``racesim run NAME --engine vllm`` in ``release``'s venv, under the lifecycle vLLM has
    there (the corpus's: IDs as given before 0.14, internal IDs from 0.14)."""
    python = venv_python(default_folder(), release)
    if not python.exists():
        pytest.skip(f"no venv of vLLM {release} at {python}")
    profile = ".".join(release.split(".")[:2])
    policy, _options = release_lifecycle(profile)
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([str(python), "-m", "racesim", "run", name, "-p", policy,
                           "--engine", "vllm", "--vllm", profile, "--json"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600,
                          check=False)
    text = proc.stdout
    doc: dict[str, Any] = json.loads(text[text.index("{"):])  # a release may log a line first
    assert doc["vllm_release"] == release
    return doc


def _dies_then_clean(name: str, releases: tuple[str, str], detail: str, where: str) -> None:
    """On the buggy release the engine dies of vLLM's own error (``detail``, raised at
    ``where``); the fixed release breaks none of the runner's invariants or the engine."""
    buggy, fixed = releases
    doc = _run_on(buggy, name)
    dead = [v for v in doc["violations"] if v["invariant"] == "engine-alive"]
    assert dead and detail in dead[0]["detail"]
    assert dead[0]["vllm_where"] == where
    clean = _run_on(fixed, name)
    assert not [v for v in clean["violations"]
                if v["invariant"] in ("engine-alive", "runner-books", "input-integrity")]


@pytest.mark.vllm
def test_23440_is_vllm_0_10_own_broadcast_error_and_0_14_is_clean() -> None:
    """0.10.1.1's step_with_batch_queue does not execute a batch with no tokens, so the
    finished X never leaves the runner's batch and the re-sent X is appended twice: vLLM's own
    ValueError in _prepare_inputs, with no delay. 0.14.0 executes every scheduled batch."""
    _dies_then_clean("23440-tool-loop-runner-batch", ("0.10.1.1", "0.14.0"),
                     "broadcast together", "v1/worker/gpu_model_runner.py:718")


@pytest.mark.vllm
def test_35755_is_vllm_0_20_own_placeholder_assert_and_0_33_is_clean() -> None:
    """A realtime session's segment ends on EOS with the next decode in flight; the next
    8-token segment, one prefill chunk, is applied before that step's token returns, so 0.20.0
    reserves no placeholder for it (is_prefill_chunk) and, once the session waits for input, a
    trailing token drives num_output_placeholders below zero: vLLM's own assert, no delay.
    0.33.0 discards the in-flight token of a resumed session and guards the decrement."""
    _dies_then_clean("35755-streaming-short-final-chunk", ("0.20.0", "0.33.0"),
                     "num_output_placeholders >= 0", "v1/core/sched/async_scheduler.py:53")
