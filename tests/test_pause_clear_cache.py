"""``[engine] pause_clear_cache``: a pause that completes with vLLM's own
``reset_prefix_cache(reset_running_requests=True)`` (vllm backend), refused on the model.

The story of the vllm tests: X and Y decode under async scheduling; a trainer pauses in "keep"
mode at 0.1 s and resumes at 0.3 s. With the cache cleared, the engine preempts both once the
batch in flight has returned (the pause's idle callback, 0.33 core.py:2216-2223), frees their
blocks, and recomputes them after resume. On 0.20.0 the first output after resume is dropped
(#42043: scheduler.py:1890-1895 sets ``discard_latest_async_tokens`` with nothing in flight);
on 0.33.0 it is applied.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from racesim.runner import engines, run_scenario
from racesim.scenarios import load_scenario, scenario_from_dict
from racesim.sim import InputError

_SCENARIO = """
name = "keep-clear"
horizon = 30.0
[engine]
vllm = "{vllm}"
num_blocks = 64
block_size = 16
max_num_seqs = 16
step_time = 0.01
async_scheduling = true
pause_at = 0.1
pause_mode = "keep"
resume_at = 0.3
{clear}
[ipc]
latency = 0.0005
[[request]]
id = "X"
at = 0.0
prompt_tokens = 32
max_tokens = 30
[[request]]
id = "Y"
at = 0.0
prompt_tokens = 20
max_tokens = 30
"""


def _scenario(tmp_path: Path, vllm: str, clear: bool | None) -> object:
    line = "" if clear is None else f"pause_clear_cache = {str(clear).lower()}"
    path = tmp_path / "keep-clear.toml"
    path.write_text(_SCENARIO.format(vllm=vllm, clear=line), encoding="utf-8")
    return load_scenario(str(path))


def test_the_key_needs_a_pause() -> None:
    with pytest.raises(InputError, match="engine.pause_clear_cache: needs engine.pause_at"):
        scenario_from_dict({"name": "x", "engine": {"pause_clear_cache": True},
                            "request": [{"id": "X"}]})


def test_the_model_refuses_it_in_one_line(tmp_path: Path) -> None:
    scen = _scenario(tmp_path, "0.33", True)
    with pytest.raises(InputError, match=r"pause_clear_cache = true runs on the vllm backend "
                                         r"only .*--engine vllm$"):
        run_scenario(scen, "internal-id")
    assert engines.why_not_run(scen.workload, "model") is not None
    assert engines.why_not_run(scen.workload, "vllm") is None


def test_the_model_refuses_a_pause_on_020_which_the_vllm_backend_runs(tmp_path: Path) -> None:
    scen = _scenario(tmp_path, "0.20", None)
    with pytest.raises(InputError, match=r"engine.pause_at on profile '0\.20' runs on the "
                                         r"vllm backend only"):
        run_scenario(scen, "internal-id")
    assert engines.why_not_run(scen.workload, "vllm") is None
    assert engines.why_not_run(load_scenario("pause-abort-reuse").with_vllm("0.14").workload,
                               "vllm") is not None  # 0.14.0 pauses in AsyncLLM, no PauseState


def test_false_is_what_the_model_ran_before(tmp_path: Path) -> None:
    """Unset and false are the same run on the model: no pin moves."""
    unset = run_scenario(_scenario(tmp_path, "0.33", None), "internal-id")
    false = run_scenario(_scenario(tmp_path, "0.33", False), "internal-id")
    assert unset.trace_hash == false.trace_hash
    assert not [e for e in unset.trace if e.kind == "sched.preempt"]


def _post_resume(r: object) -> tuple[list[tuple[float, str]], list[tuple[float, str]], list]:
    trace = r.trace  # type: ignore[attr-defined]
    frees = [(round(e.time, 4), e.request) for e in trace if e.kind == "kv.free"]
    preempts = [(round(e.time, 4), e.request) for e in trace if e.kind == "sched.preempt"]
    updates = [e.detail.applied for e in trace
               if e.kind == "sched.update" and e.time > 0.3]
    return frees, preempts, updates


@pytest.mark.vllm
def test_clearing_the_cache_preempts_the_frozen_requests(tmp_path: Path) -> None:
    release = engines.installed_profile()
    assert release in ("0.20", "0.33")
    r = run_scenario(_scenario(tmp_path, release, True), "internal-id", engine="vllm")
    assert not r.violated
    assert [(q.id, q.tokens, q.finish_reason) for q in r.requests] == [
        ("X", 30, "length"), ("Y", 30, "length")]
    frees, preempts, updates = _post_resume(r)
    # the pause came at 0.1105 with a batch in flight: the reset waits for it (idle, 0.1205)
    assert [t for t, _ in frees][:2] == [0.1205, 0.1205]
    # 0.20 traces its preemptions at the reset; 0.33's next schedule() lists them (resume)
    assert {t for t, _ in preempts} == ({0.1205} if release == "0.20" else {0.3005})
    assert len(preempts) == 2
    # #42043: 0.20.0 drops the first post-resume token of both; 0.33.0 applies them
    assert len(updates[0]) == (0 if release == "0.20" else 2)


@pytest.mark.vllm
def test_without_clearing_nothing_is_preempted(tmp_path: Path) -> None:
    release = engines.installed_profile()
    r = run_scenario(_scenario(tmp_path, str(release), False), "internal-id", engine="vllm")
    frees, preempts, updates = _post_resume(r)
    assert not preempts and all(t > 0.3 for t, _ in frees)
    assert len(updates[0]) == 2


def test_the_model_refuses_a_prefix_cache_reset() -> None:
    wl = load_scenario("46066-reset-running-spec-inflight").workload
    wl = dataclasses.replace(wl, engine=dataclasses.replace(wl.engine,
                                                            num_speculative_tokens=None))
    gap = engines.why_not_run(wl, "model")
    assert gap is not None and gap.startswith("engine.reset_prefix_cache_at runs on the vllm "
                                              "backend only")
    assert engines.why_not_run(wl, "vllm") is None


@pytest.mark.vllm
def test_the_corpus_entries_on_the_installed_release() -> None:
    """#42043 and #46066 on the release installed here, with no delay (the corpus's run 0):
    both bugs on 0.20.0, neither on 0.33.0."""
    release = engines.installed_profile()
    pause = run_scenario(load_scenario("42043-pause-keep-clear-cache").with_vllm(str(release)),
                         "internal-id", engine="vllm")
    reset = run_scenario(load_scenario("46066-reset-running-spec-inflight")
                         .with_vllm(str(release)), "internal-id", engine="vllm")
    if release == "0.20":
        assert pause.violated == ("input-integrity",)
        assert "output 0 is" in pause.violations[0].detail  # a prompt token at B's output 0
        assert reset.violated == ("engine-alive",)
        assert reset.violations[0].where == "v1/core/sched/async_scheduler.py:53"
    else:
        assert not pause.violated and not reset.violated
        stale = [e.detail.stale for e in reset.trace if e.kind == "sched.preempt"]
        assert stale[:2] == [3, 3]  # both preempted with a step of 1 + 2 tokens in flight
