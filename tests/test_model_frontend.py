"""AsyncLLM.add_request with n > 1: a child's ID can be taken while an earlier child's ADD
awaits its send; the request is then refused as vLLM's generate() refuses it, and the children
it already registered are aborted — never a crash of the frontend process."""

from __future__ import annotations

import pytest

from racesim.cli import main
from racesim.engine_model import EngineConfig, RequestSpec, Workload, load_policy, run_workload
from racesim.sim import DelayPlan


def test_a_child_id_taken_during_the_send_await_refuses_the_parent() -> None:
    workload = Workload(engine=EngineConfig(vllm="0.8"),
                        requests=(RequestSpec("X", n=2, prompt_tokens=16, max_tokens=8),
                                  RequestSpec("1_X", prompt_tokens=16, max_tokens=8)))
    plan = DelayPlan(overrides=[("frontend.add_request:before_send", 0, 0.01)])
    result = run_workload(workload, load_policy("buggy"), plan=plan)
    parent, squatter = result.requests
    assert (parent.finish_reason, parent.tokens) == ("rejected", 0)
    assert (squatter.finish_reason, squatter.tokens) == ("length", 8)
    story = [(e.kind, e.request) for e in result.trace
             if e.kind in ("fe.add", "fe.reject", "fe.abort_issue", "sched.finish")]
    assert story[:4] == [("fe.add", "0_X"), ("fe.add", "1_X"), ("fe.reject", "1_X"),
                         ("fe.abort_issue", "X")]
    assert ("sched.finish", "0_X") in story  # the child already sent is aborted in the engine
    assert set(result.violated) <= {"metrics-exact"}


@pytest.mark.parametrize("argv", [
    ["run", "abort-reuse", "--delay", "frontend.abort:after_pop#\u00b2=0.1"],
    ["run", "abort-reuse", "-p", "internal-id", "--policy-opt", "suffix_hex=\u00b2"],
])
def test_unicode_digits_are_bad_input(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("vllm", ["0.8", "0.33"])
def test_a_stop_string_on_the_last_allowed_token_finishes_stop_with_no_abort(vllm: str) -> None:
    """The engine ends the request on max_tokens (LENGTH); the detokenizer still finds the stop
    string in that last token, so the finish is STOP (output_processor.py:825-830), and no ABORT
    is sent: the engine already finished it (:875-880)."""
    workload = Workload(engine=EngineConfig(vllm=vllm),
                        requests=(RequestSpec("B", max_tokens=5, stop_string_at=5),
                                  RequestSpec("C", max_tokens=5, stop_string_at=6)))
    r = run_workload(workload, load_policy("buggy"))
    assert [(q.tokens, q.finish_reason) for q in r.requests] == [(5, "stop"), (5, "length")]
    assert [e for e in r.trace if e.kind == "fe.abort_issue"] == []
    assert [e.detail.why for e in r.trace if e.kind == "fe.pop"] == ["finished", "finished"]
def _fan_out_story(vllm: str, cancel: bool) -> tuple[list[tuple[str, str | None]], object]:
    workload = Workload(engine=EngineConfig(vllm=vllm),
                        requests=(RequestSpec("X", n=3, prompt_tokens=16, max_tokens=8,
                                              cancel_at=0.005 if cancel else None),))
    # the second child's ADD send blocks for 10 ms (a latent point: the send never yields)
    plan = DelayPlan(overrides=[("frontend.add_request:before_send", 1, 0.01)])
    result = run_workload(workload, load_policy("buggy"), plan=plan)
    story = [(e.kind, e.request) for e in result.trace if e.kind in (
        "fe.add", "fe.add_cancelled", "fe.abort_issue", "fe.pop") or (
        e.kind == "ipc.send" and e.detail.type == "EngineCoreRequest")]
    return story, result


def test_033_registers_every_child_before_the_first_add_is_sent() -> None:
    # vLLM 0.33 async_llm.py:555-560: all output_processor.add_request calls, then the sends.
    story, _ = _fan_out_story("0.33", cancel=False)
    assert story[:6] == [("fe.add", "0_X"), ("fe.add", "1_X"), ("fe.add", "2_X"),
                     ("ipc.send", "0_X"), ("ipc.send", "1_X"), ("ipc.send", "2_X")]


def test_08_registers_and_sends_one_child_at_a_time() -> None:
    story, _ = _fan_out_story("0.8", cancel=False)
    assert story[:6] == [("fe.add", "0_X"), ("ipc.send", "0_X"), ("fe.add", "1_X"),
                     ("ipc.send", "1_X"), ("fe.add", "2_X"), ("ipc.send", "2_X")]


def test_033_cancel_during_the_child_sends_aborts_every_child_of_the_parent() -> None:
    # async_llm.py:561-564: a cancel at the second child's send aborts the parent by its
    # internal ID: all three registered children go, though only the first ADD was sent.
    story, result = _fan_out_story("0.33", cancel=True)
    assert story == [("fe.add", "0_X"), ("fe.add", "1_X"), ("fe.add", "2_X"),
                     ("ipc.send", "0_X"), ("fe.add_cancelled", "1_X"), ("fe.abort_issue", "X"),
                     ("fe.pop", "0_X"), ("fe.pop", "1_X"), ("fe.pop", "2_X")]
    (issue,) = [e for e in result.trace if e.kind == "fe.abort_issue"]
    assert issue.detail.ids == ["0_X", "1_X", "2_X"]
    (outcome,) = result.requests
    assert outcome.finish_reason == "abort"
    # the ABORT reaches the engine for the one child it holds; nothing leaks
    assert set(result.violated) <= {"metrics-exact"}
    assert result.reach().reach == "latent"  # only a delay at the eager send opens it
