"""Streaming-input sessions (vLLM PR #28973 on 0.33): one internal ID re-used on purpose for
every input chunk, while an accidental duplicate keeps 0.33's behaviour."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from racesim.cli import main
from racesim.engine_model.config import EngineConfig, RequestSpec, Workload
from racesim.engine_model.policies import load_policy
from racesim.engine_model.system import RunResult, run_workload
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario, scenario_from_dict
from racesim.sim import InputError


def _run(*requests: RequestSpec, policy: str = "internal-id", **engine: object) -> RunResult:
    workload = Workload(requests=requests,
                        engine=EngineConfig(vllm="0.33", **engine))  # type: ignore[arg-type]
    return run_workload(workload, load_policy(policy))


def _actions(r: RunResult) -> list[str]:
    return [e.detail.action for e in r.trace if e.kind == "sched.session"]


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize(("interval", "path"), [(0.2, "resume"), (0.005, "queue")])
def test_every_chunk_runs_under_one_engine_request(async_scheduling: bool, interval: float,
                                                   path: str) -> None:
    r = _run(RequestSpec("S", max_tokens=6, input_chunks=2, chunk_interval=interval),
             async_scheduling=async_scheduling)
    assert (r.requests[0].finish_reason, r.requests[0].tokens) == ("length", 18)
    assert len([e for e in r.trace if e.kind == "sched.add"]) == 1  # the session's first add
    assert path in _actions(r)
    finishes = [e for e in r.trace if e.kind == "sched.finish"]
    assert len(finishes) == 1                                        # it ends once, at the end
    assert r.violated == ()


def test_a_session_keeps_its_output_as_prompt_for_the_next_chunk() -> None:
    r = _run(RequestSpec("S", prompt_tokens=16, max_tokens=6, input_chunks=1,
                         chunk_interval=0.2), async_scheduling=False)
    resumes = [e.detail.prompt_tokens for e in r.trace
               if e.kind == "sched.session" and e.detail.action == "resume"]
    assert resumes == [16 + 5 + 16]           # all output tokens but the last sampled one


def test_an_aborted_session_sends_no_more_chunks_and_leaves_nothing() -> None:
    r = _run(RequestSpec("S", max_tokens=5, input_chunks=3, chunk_interval=0.1, abort_at=0.15))
    adds = [e for e in r.trace if e.kind == "ipc.send" and e.detail.type == "EngineCoreRequest"]
    assert len(adds) == 2                      # chunks 0 and 1; chunk 2 and the final never go
    assert r.requests[0].finish_reason == "abort"
    assert set(r.violated) <= {"metrics-exact"}


def test_an_accidental_duplicate_ends_the_session_with_equal_ids_only() -> None:
    scen = load_scenario("streaming-input-session")
    buggy = run_scenario(scen, "buggy")
    assert "no-hang" in buggy.violated and buggy.reach().reach == "live"
    # the duplicate came while S's second chunk ran: that chunk became S's last
    assert [(q.finish_reason, q.tokens) for q in buggy.requests[:2]] == [("length", 10),
                                                                         (None, 0)]
    assert "queue-end" in _actions(buggy)
    assert "engine-alive" not in buggy.violated          # a session's ID takes no assert
    fixed = run_scenario(scen, "internal-id")
    assert fixed.violated == ()
    assert [(q.finish_reason, q.tokens) for q in fixed.requests] == [
        ("length", 15), ("length", 5), ("length", 40)]


def test_a_duplicate_while_the_session_waits_for_input_ends_its_stream() -> None:
    """output_processor.py:701-707: the session's stream ends with STREAM_FINISHED; the
    scheduler ends the session (scheduler.py:2943-2945); the newcomer is never answered."""
    r = _run(RequestSpec("S", max_tokens=5, input_chunks=1, chunk_interval=0.2),
             RequestSpec("S", at=0.15, max_tokens=5), policy="buggy")
    assert [(q.finish_reason, q.tokens) for q in r.requests] == [("stream_finished", 5),
                                                                 (None, 0)]
    assert _actions(r) == ["wait", "end"]
    assert "no-hang" in r.violated and "engine-alive" not in r.violated


def test_a_duplicate_of_an_id_that_is_no_session_still_asserts() -> None:
    r = run_scenario(load_scenario("duplicate-in-flight"), "buggy")
    assert "engine-alive" in r.violated
    assert any(e.kind == "sched.duplicate" for e in r.trace)


@pytest.mark.parametrize("extra", [{"n": 2}, {"stop_string_at": 3}])
def test_sessions_refuse_what_vllm_refuses(extra: dict[str, object]) -> None:
    with pytest.raises(InputError, match="input_chunks: needs"):
        scenario_from_dict({"name": "t", "request": [{"id": "S", "input_chunks": 1, **extra}]})
    with pytest.raises(InputError, match=r"input_chunks is modelled on vLLM 0\.20, 0\.33 only"):
        run_workload(Workload(engine=EngineConfig(vllm="0.8"),
                              requests=(RequestSpec("S", input_chunks=1),)),
                     load_policy("buggy"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions=st.lists(st.tuples(st.sampled_from("SU"), st.floats(0, 0.1),
                                   st.integers(0, 3), st.floats(0.001, 0.1),
                                   st.integers(1, 6)), min_size=1, max_size=4),
       async_scheduling=st.booleans())
def test_sessions_with_unique_internal_ids_always_run_every_chunk(
        sessions: list[tuple[str, float, int, float, int]], async_scheduling: bool) -> None:
    """Any mix of concurrent sessions, also under one external ID, runs clean under
    internal-id, and each gets (chunks + 1) * max_tokens tokens."""
    specs = tuple(RequestSpec(rid, at=at, max_tokens=m, input_chunks=k, chunk_interval=gap)
                  for rid, at, k, gap, m in sessions)
    r = _run(*specs, async_scheduling=async_scheduling)
    assert r.violated == (), r.violations
    assert [q.tokens for q in r.requests] == [(s.input_chunks + 1) * s.max_tokens
                                               for s in specs]


def test_chunk_tokens_sizes_every_input_chunk_after_the_first() -> None:
    r = _run(RequestSpec("S", prompt_tokens=16, max_tokens=6, input_chunks=2, chunk_tokens=4,
                         chunk_interval=0.2), async_scheduling=False)
    resumes = [e.detail.prompt_tokens for e in r.trace
               if e.kind == "sched.session" and e.detail.action == "resume"]
    assert resumes == [16 + 5 + 4, 16 + 5 + 4 + 5 + 4]
    assert r.violated == ()


@pytest.mark.parametrize(("request_keys", "wanted"), [
    ("input_chunks = 2\nchunk_tokens = 0", "request[0].chunk_tokens: must be >= 1 (got 0)"),
    ('input_chunks = 2\nchunk_tokens = "8"', "request[0].chunk_tokens: must be an integer"),
    ("input_chunks = 2\nchunk_tokens = 1048577", "chunk_tokens: must be <= 1048576"),
    ("chunk_tokens = 8", "request[0].chunk_tokens: needs input_chunks >= 1"),
])
def test_a_bad_chunk_tokens_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], request_keys: str,
        wanted: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f'name = "t"\n[[request]]\nid = "S"\n{request_keys}\n', encoding="utf-8")
    with pytest.raises(SystemExit) as stop:
        main(["run", str(path)])
    out, err = capsys.readouterr()
    assert (stop.value.code, out) == (2, "")
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert wanted in err, err
