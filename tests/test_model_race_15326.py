"""vLLM PR #15326 end to end: abort pops the frontend state, then awaits the ABORT send.

Client 0 aborts X at t=0.1; the BUG point holds the ABORT for 50 ms; client 1 sends X again
at t=0.13. Under ``buggy`` the re-ADD overtakes the ABORT (vLLM 0.33 v1/engine/async_llm.py:948-956:
``abort`` pops the state, then awaits the send) and the damage follows. The fixes, under the
very same delay, do not race.
"""

from __future__ import annotations

import pytest

from racesim.engine_model import RunResult
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario
from racesim.sim import TraceEvent

BUG_POINT = "frontend.abort:after_pop"


def _abort_reuse(policy: str) -> RunResult:
    return run_scenario(load_scenario("abort-reuse").with_vllm("0.8"), policy,
                        delays=[(BUG_POINT, None, 0.05)])


def _incs(result: RunResult) -> tuple[int, int]:
    """The hidden incarnations of client 0's X and client 1's X."""
    by_uid = {e.detail.uid: e.inc for e in result.trace if e.kind == "fe.add"}
    return by_uid[1], by_uid[2]


def _beat(e: TraceEvent) -> tuple[str, str, int, float]:
    return (e.component, e.kind, e.inc, round(e.time, 9))


@pytest.fixture(scope="module")
def buggy() -> RunResult:
    return _abort_reuse("buggy")


def test_the_re_add_overtakes_the_abort(buggy: RunResult) -> None:
    old, new = _incs(buggy)
    kinds = {"client.abort", "client.send", "fe.pop", "fe.add", "sched.add", "sched.finish",
             "engine.fatal", "delay"}
    story = [_beat(e) for e in buggy.trace if e.kind in kinds or (
        e.kind == "ipc.send" and e.detail.type == "AbortMessage")]
    assert story == [
        ("client0", "client.send", 0, 0.0),
        ("frontend0", "fe.add", old, 0.0),
        ("engine.scheduler", "sched.add", old, 0.0005),
        ("client0", "client.abort", 0, 0.1),
        ("frontend0", "fe.pop", old, 0.1),                 # state popped first ...
        ("frontend0", "delay", 0, 0.1),                    # ... then the await on the send
        ("client1", "client.send", 0, 0.13),
        ("frontend0", "fe.add", new, 0.13),                # "already running" check passes
        ("engine.scheduler", "sched.add", new, 0.1405),    # overwrites requests['X']
        ("ipc:frontend0->engine", "ipc.send", 0, 0.15),    # the ABORT, 20 ms too late
        ("engine.scheduler", "sched.finish", new, 0.1605),  # ... kills the NEW request
        ("engine.core", "engine.fatal", 0, 0.1605),        # old X's lookup: KeyError
        ("frontend0", "fe.pop", new, 0.161)]               # EngineDeadError for client 1
    (add,) = [e for e in buggy.trace if e.kind == "sched.add" and e.inc == new]
    assert add.detail.prev == old


def test_unique_live_id_names_the_overwriting_add(buggy: RunResult) -> None:
    old, new = _incs(buggy)
    (v,) = [v for v in buggy.violations if v.invariant == "unique-live-id"]
    event = buggy.trace[v.event]
    assert (event.kind, event.inc) == ("sched.add", new)
    assert f"inc {old}" in v.detail and f"inc {new}" in v.detail


def test_the_late_abort_kills_the_new_request(buggy: RunResult) -> None:
    old, new = _incs(buggy)
    (finish,) = [e for e in buggy.trace if e.kind == "sched.finish"]
    assert (finish.inc, finish.detail.status) == (new, "FINISHED_ABORTED")
    (v,) = [v for v in buggy.violations if v.invariant == "abort-precision"]
    assert buggy.trace[v.event] is finish
    # _free_request pops req_to_blocks['X']: the OLD request's blocks, while it still runs.
    (free,) = [e for e in buggy.trace if e.kind == "kv.free"]
    assert free.inc == new and set(free.detail.owners) == {old}
    assert "kv-ownership" in buggy.violated


def test_the_old_requests_tokens_reach_the_new_client_then_the_engine_dies(
        buggy: RunResult) -> None:
    old, _new = _incs(buggy)
    got = [t[1] for e in buggy.trace if e.kind == "client.output" and e.detail.uid == 2
           for t in e.detail.tokens]
    assert old in got, "client 1 is handed tokens generated for client 0's request"
    assert {"no-crosstalk", "engine-alive"} <= set(buggy.violated)
    assert [(r.id, r.finish_reason) for r in buggy.requests] == [("X", "abort"), ("X", "error")]


def test_abort_scope_under_the_same_delay_only_misses_the_abort_in_stats() -> None:
    result = _abort_reuse("abort-scope")
    assert result.violated == ("metrics-exact",)
    assert [e.detail.uid for e in result.trace if e.kind == "fe.add"] == [1], \
        "client 1's X is never registered"
    # The state outlives the ABORT send, so the second X is refused instead of overtaking.
    story = [(e.kind, round(e.time, 9)) for e in result.trace
             if e.kind in ("fe.pop", "fe.reject", "sched.finish") or (
                 e.kind == "ipc.send" and e.detail.type == "AbortMessage")]
    assert story == [("fe.reject", 0.13), ("ipc.send", 0.15), ("fe.pop", 0.15),
                     ("sched.finish", 0.1605)]   # applied at the end of the step in flight
    assert [(r.id, r.finish_reason) for r in result.requests] == \
        [("X", "abort"), ("X", "rejected")]


def test_engine_final_under_the_same_delay_violates_nothing() -> None:
    result = _abort_reuse("engine-final")
    assert result.violations == ()
    # The frontend drops X only on the engine's final "abort" output, and counts it.
    story = [(e.kind, round(e.time, 9)) for e in result.trace
             if e.kind in ("fe.pop", "fe.stats", "sched.finish")]
    assert story == [("sched.finish", 0.1605), ("fe.stats", 0.161), ("fe.pop", 0.161)]
    assert [r.finish_reason for r in result.requests] == ["abort", "rejected"]
