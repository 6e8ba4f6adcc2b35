"""Streaming-input sessions (vLLM PR #28973) on vLLM 0.33's own Scheduler and OutputProcessor:
the model agrees with them, a session's collector is vLLM's, and a duplicate of an ID that is
no session still kills the engine by vLLM's own assert.

These tests need vLLM 0.33 (``scripts/install-vllm-cpu``): skipped locally without it, a failure
under CI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import _profiles  # noqa: F401  (the suite's hypothesis profile, before any @settings)
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from racesim.conform import conform
from racesim.engine_model.invariants import RUNNER_INVARIANTS
from racesim.engine_model.config import EngineConfig, RequestSpec, Workload
from racesim.engine_model.frontend.outputs import (
    CompletionOutput,
    RequestOutput,
    StreamingInputOutputCollector,
)
from racesim.engine_model.messages import Token
from racesim.engine_model.policies import load_policy
from racesim.engine_model.system import RunResult
from racesim.engine_model.system import run_workload as run_model
from racesim.engine_vllm.system import run_workload as run_vllm
from racesim.scenarios import load_scenario
from racesim.sim.world import World

pytestmark = pytest.mark.vllm


def _runs(policy: str, *requests: RequestSpec, **engine: Any) -> tuple[RunResult, RunResult]:
    workload = Workload(requests=requests, engine=EngineConfig(vllm="0.33", **engine))
    return (run_model(workload, load_policy(policy)), run_vllm(workload, load_policy(policy)))


def _seen(r: RunResult) -> tuple[object, ...]:
    """Per-request outcomes, violated invariants, each session's steps in the scheduler (in
    order per session; sessions stopping in one step may be recorded in either order). The
    runner invariants are read on vLLM's own runner only (the model's fake runner keeps no such
    books), so they are left out, as conform leaves them out."""
    steps = [(e.request, e.detail.action) for e in r.trace if e.kind == "sched.session"]
    violated = tuple(v for v in r.violated if v not in RUNNER_INVARIANTS)
    return (tuple((q.id, q.tokens, q.finish_reason) for q in r.requests), violated,
            sorted(steps, key=lambda step: str(step[0])), _fatal(r))


def _fatal(r: RunResult) -> list[str]:
    """Each engine death's error (the model's message names the ID, vLLM's does not)."""
    return [e.detail.error.split(" '")[0] for e in r.trace if e.kind == "engine.fatal"]


_S = RequestSpec("S", max_tokens=5, input_chunks=2, chunk_interval=0.2)

#: sessions and accidental duplicates, each taking another path through scheduler.py:2931-2947
#: and output_processor.py:695-726
CASES: dict[str, tuple[RequestSpec, ...]] = {
    # chunks arrive while the session waits for input: each resumes it
    "resume": (_S,),
    # chunks arrive while a chunk runs: queued, applied when it stops
    "queue": (RequestSpec("S", max_tokens=8, input_chunks=2, chunk_interval=0.01),),
    # a plain add of the session's ID while a chunk runs: taken as the session's final add
    "duplicate-while-running": (_S, RequestSpec("S", at=0.21, max_tokens=5)),
    # a plain add while the session waits for input: STREAM_FINISHED, the session ends
    "duplicate-while-waiting": (_S, RequestSpec("S", at=0.15, max_tokens=5)),
    # two sessions under one ID, their chunks interleaved
    "two-sessions": (_S, RequestSpec("S", at=0.05, max_tokens=3, input_chunks=1,
                                     chunk_interval=0.1)),
    # an abort while the session waits for input
    "abort-waiting": (RequestSpec("S", max_tokens=5, input_chunks=3, chunk_interval=0.2,
                                  abort_at=0.15),),
    # EOS ends a chunk early
    "eos": (RequestSpec("S", max_tokens=8, eos_at=3, input_chunks=1, chunk_interval=0.2),),
}


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("policy", ["buggy", "internal-id"])
@pytest.mark.parametrize("case", list(CASES))
def test_sessions_agree_with_vllms_own_classes(case: str, policy: str,
                                               async_scheduling: bool) -> None:
    model, vllm = _runs(policy, *CASES[case], async_scheduling=async_scheduling)
    assert _seen(vllm) == _seen(model)
    assert vllm.engine == "vllm"
    assert [a for _, a in _seen(model)[2]]  # every case drives a session through the scheduler


def test_the_duplicate_paths_are_the_ones_named() -> None:
    """The cases above reach what they say (so agreement covers each path)."""
    running, _ = _runs("buggy", *CASES["duplicate-while-running"], async_scheduling=False)
    waiting, _ = _runs("buggy", *CASES["duplicate-while-waiting"], async_scheduling=False)
    assert ("S", "queue-end") in _seen(running)[2]
    assert [q.finish_reason for q in running.requests] == ["length", None]
    assert ("S", "end") in _seen(waiting)[2]
    assert [q.finish_reason for q in waiting.requests] == ["stream_finished", None]


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_session_waiting_for_input_holds_a_slot(async_scheduling: bool) -> None:
    """With max_num_seqs = 1, a request arriving while a session waits for input is admitted
    only once the session has ended (scheduler.py:1070-1074)."""
    runs = _runs("internal-id", RequestSpec("S", max_tokens=3, input_chunks=2,
                                            chunk_interval=0.1),
                 RequestSpec("X", at=0.05, max_tokens=3), max_num_seqs=1,
                 async_scheduling=async_scheduling)
    for r in runs:
        ends = {e.request.split("-")[0]: e.time for e in r.trace if e.kind == "sched.finish"}
        first_x = min(e.time for e in r.trace if e.kind == "sched.step"
                      and any(str(b[0]).startswith("X") for b in e.detail.batch))
        assert first_x >= ends["S"], r.engine
    assert _seen(runs[1]) == _seen(runs[0])


def test_a_session_stopped_twice_under_a_reused_id_stalls_the_engine() -> None:
    """Equal IDs, async scheduling: S is aborted and re-added at once, so the old request's
    step in flight counts against the new session's in-flight tokens (by ID, scheduler.py:
    2313-2323). Its chunk's stopping output is then not stale and stops it a second time:
    num_waiting_for_streaming_input is 2 for one session (:2739-2740), stays 1 after the
    abort, and hides the next request from get_num_unfinished_requests (:3147-3155). The
    engine stops stepping; that request runs only when another input arrives (here none: it
    is cancelled with no token). Derived on vLLM's own Scheduler with the fake executor."""
    model, vllm = _runs("buggy", RequestSpec("S", at=0.048, max_tokens=9, abort_at=0.091,
                                             input_chunks=1, chunk_interval=0.039),
                        RequestSpec("S", at=0.06, max_tokens=5),
                        RequestSpec("S", at=0.096, max_tokens=6, cancel_at=0.191,
                                    input_chunks=3, chunk_interval=0.105),
                        RequestSpec("S", at=0.275, max_tokens=4, cancel_at=0.444),
                        async_scheduling=True)
    assert _seen(vllm) == _seen(model)
    assert [a for _, a in _seen(vllm)[2]].count("wait") == 2  # one session, stopped twice
    assert (vllm.requests[3].tokens, vllm.requests[3].finish_reason) == (0, "abort")


def test_a_duplicate_of_an_id_that_is_no_session_still_kills_the_engine() -> None:
    """With a session open, a plain duplicate of another ID in flight reaches vLLM's own
    "duplicate request id" assert (scheduler.py:2935-2936): the engine dies."""
    model, vllm = _runs("buggy", _S, RequestSpec("X", max_tokens=20),
                        RequestSpec("X", at=0.05, max_tokens=20))
    assert _seen(vllm) == _seen(model)
    assert _seen(vllm)[3] == ["AssertionError: duplicate request id"]
    assert "engine-alive" in vllm.violated


_REQUEST = st.builds(
    lambda rid, at, m, chunks, gap, abort, eos: RequestSpec(
        rid, at=at, max_tokens=m, input_chunks=chunks, chunk_interval=gap,
        abort_at=None if abort is None else at + abort,
        eos_at=None if eos is None else min(eos, m)),
    st.sampled_from("SSX"), st.floats(0, 0.3), st.integers(1, 8), st.integers(0, 3),
    st.floats(0.002, 0.15), st.none() | st.floats(0, 0.3), st.none() | st.integers(1, 8))


# derandomized: the same examples on every run, under any profile
@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(_REQUEST, min_size=1, max_size=4), equal_ids=st.booleans(),
       async_scheduling=st.booleans())
def test_any_mix_of_sessions_and_duplicates_agrees_with_vllm(
        requests: list[RequestSpec], equal_ids: bool, async_scheduling: bool,
        vllm_backend: Any) -> None:
    """Sessions (input_chunks > 0) and plain requests, sharing IDs, aborted, ended by EOS: the
    same outcomes on both backends, but for the listed difference after an engine death
    (racesim/conform/known.py)."""
    model, vllm = _runs("buggy" if equal_ids else "internal-id", *requests,
                        async_scheduling=async_scheduling)
    seen_model, seen_vllm = _seen(model), _seen(vllm)
    if seen_vllm[3]:  # the engine died: vLLM keeps the states an abort can still end
        seen_model, seen_vllm = (
            (s[0], tuple(i for i in s[1] if i != "one-terminal-output"), *s[2:])
            for s in (seen_model, seen_vllm))
    assert seen_vllm == seen_model


@pytest.mark.parametrize("policy", ["buggy", "internal-id"])
def test_conform_covers_the_streaming_session_scenario(policy: str, tmp_path: Path) -> None:
    scen = load_scenario("streaming-input-session")
    res = conform([scen], [(policy, {})], budget=30, workers=1, out_dir=tmp_path)
    (cell,) = res.cells
    assert cell["model_only"] is None and cell["runs"] == 30
    assert [m.document() for m in res.unlisted] == []


# -- the session's collector against vLLM's StreamingInputOutputCollector --------------------

_PUT = st.tuples(st.just("put"), st.integers(0, 3),
                 st.sampled_from([None, None, "length", "stop", "abort"]), st.booleans())
_OPS = st.lists(st.one_of(_PUT, st.just(("take",)), st.just(("error",))), max_size=25)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
def test_a_sessions_collector_merges_and_splits_as_vllms(ops: list[tuple[Any, ...]],
                                                         vllm_backend: Any) -> None:
    from vllm.outputs import CompletionOutput as VCompletion
    from vllm.outputs import RequestOutput as VOutput
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.output_processor import StreamingInputOutputCollector as VCollector

    ours = StreamingInputOutputCollector(World(seed=0).env, "S")
    theirs = VCollector(RequestOutputKind.DELTA, "S")
    got_ours: list[object] = []
    got_theirs: list[object] = []
    token = 0
    for op in ops:
        if op[0] == "put":
            _, n, finish, finished = op
            ids = list(range(token, token + n))
            token += n
            ours.put(RequestOutput("S", [CompletionOutput(
                0, [Token(1, t, False) for t in ids], finish)], finished))
            theirs.put(VOutput("S", None, None, None, [VCompletion(
                0, "", ids, None, None, finish_reason=finish)], finished))
        elif op[0] == "error":
            ours.put(RequestOutput("S", [], True, None, "EngineDeadError"))
            theirs.put(RuntimeError("EngineDeadError"))
        else:
            mine = ours.take()
            got_ours.append(None if mine is None else "error" if mine.error else (
                [t.ctx for c in mine.outputs for t in c.tokens],
                [c.finish_reason for c in mine.outputs], mine.finished))
            try:
                real = theirs.get_nowait()
            except RuntimeError:
                got_theirs.append("error")
                continue
            got_theirs.append(None if real is None else (
                [t for c in real.outputs for t in c.token_ids],
                [c.finish_reason for c in real.outputs], real.finished))
    assert got_ours == got_theirs


@pytest.mark.parametrize("frontend", ["model", "asyncllm"])
def test_a_sessions_later_chunks_carry_chunk_tokens_on_either_frontend(
        frontend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """#35755's realtime workload: a 64-token first prompt, then 8-token segments
    (``chunk_tokens``), each of which resumes the session with its 8 tokens and the kept
    output token (scheduler.py:1879-1911): the same prompt lengths whichever frontend sends
    them, and 0.33.0 runs the whole session (vLLM's own frontend once sent 64-token segments,
    past the session's max_model_len)."""
    from racesim.runner import run_scenario
    from racesim.scenarios import load_scenario

    monkeypatch.setenv("RACESIM_VLLM_FRONTEND", frontend)
    res = run_scenario(load_scenario("35755-streaming-short-final-chunk").with_vllm("0.33"),
                       "internal-id", engine="vllm")
    resumes = [e.detail.prompt_tokens for e in res.trace
               if e.kind == "sched.session" and e.detail.action == "resume"]
    assert resumes == [73, 82, 91, 100]
    assert "engine-alive" not in res.violated
