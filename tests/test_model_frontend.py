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
