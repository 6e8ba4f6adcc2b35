"""runner-books and input-integrity, case by case, on books written out by hand: each case a
runner's books would be wrong in, and the line the check gives it (a check that stopped
seeing one fails here without a vLLM run that happens to reach it).

The books are what the checks read of vLLM's runner and scheduler (racesim.engine_vllm.runner.
books): the persistent batch's rows and ``runner.requests``; the scheduler's ``requests``,
``finished_req_ids`` and the step's SchedulerOutput; the model input the runner built, as
:meth:`RealRunner.model_inputs` gives it (numpy)."""

from __future__ import annotations

from types import SimpleNamespace as NS
from typing import Any

import numpy as np

from racesim.engine_vllm.engine.views import Vocabulary
from racesim.engine_vllm.runner.books import input_errors, runner_books

VOCAB = Vocabulary()
#: a sampled token of incarnation 1, and one of incarnation 2 (fake vocabulary ids >= BASE)
INC1, INC2 = VOCAB.code(1, 0, False), VOCAB.code(2, 0, False)


class _Req:
    """The scheduler's Request: what the checks read of it."""

    def __init__(self, inc: int, prompt: list[int], outputs: list[int] = (),  # type: ignore
                 computed: int = 0, finished: bool = False) -> None:
        self.inc = inc
        self.prompt_token_ids = list(prompt)
        self.output_token_ids = list(outputs)
        self.num_computed_tokens = computed
        self._finished = finished

    def is_finished(self) -> bool:
        return self._finished


class _Real:
    """RealRunner's books: batch rows, request states (each state's incarnation), inputs."""

    def __init__(self, rows: list[str], states: dict[str, int],
                 inputs: list[tuple[int, int]] | None = None,
                 row_tokens: list[int] | None = None) -> None:
        self._state_inc: dict[int, int] = {}
        self.runner = NS(input_batch=NS(req_ids=rows, num_reqs=len(rows)),
                         requests={})
        for rid, inc in states.items():
            state = NS(rid=rid)
            self._state_inc[id(state)] = inc
            self.runner.requests[rid] = state
        self.verifier = None
        self.vocab = VOCAB
        inputs = inputs or []
        counts = row_tokens if row_tokens is not None else [1] * len(rows)
        self._qsl = np.cumsum([0, *counts]).astype(np.int32)
        self._ids = np.array([t for _p, t in inputs] or [0], dtype=np.int32)
        self._pos = np.array([p for p, _t in inputs] or [0], dtype=np.int64)

    def inc_of_state(self, state: Any) -> int:
        return self._state_inc.get(id(state), 0)

    def model_inputs(self) -> tuple[Any, Any, Any]:
        return self._qsl, self._ids, self._pos


def _sched(requests: dict[str, _Req], pending: set[str] = frozenset()) -> Any:  # type: ignore
    return NS(requests=requests, finished_req_ids=set(pending))


def _so(scheduled: dict[str, int]) -> Any:
    return NS(num_scheduled_tokens=scheduled,
              total_num_scheduled_tokens=sum(scheduled.values()),
              scheduled_spec_decode_tokens={})


def _inc_of(req: Any) -> int:
    return 0 if req is None else int(req.inc)


def _books(real: _Real, requests: dict[str, _Req], scheduled: dict[str, int],
           pending: set[str] = frozenset()) -> list[str]:  # type: ignore
    return runner_books(real, _sched(requests, pending), _so(scheduled), _inc_of)


# -- runner-books ------------------------------------------------------------------------------

def test_books_that_agree_with_the_scheduler_say_nothing() -> None:
    reqs = {"X": _Req(1, [5]), "Y": _Req(2, [6])}
    real = _Real(["X", "Y"], {"X": 1, "Y": 2})
    assert _books(real, reqs, {"X": 1, "Y": 1}) == []


def test_an_id_appended_twice_is_one_line_per_extra_row() -> None:
    """#23440's symptom: the re-sent X gets a second row while the first is still there."""
    reqs = {"X": _Req(1, [5])}
    real = _Real(["X", "X"], {"X": 1})
    assert _books(real, reqs, {"X": 1}) == ["batch row 'X' appears twice"]


def test_rows_and_the_scheduled_ids_are_compared_both_ways_in_id_order() -> None:
    reqs = {r: _Req(1, [5]) for r in "WXYZ"}
    real = _Real(["Y", "X", "W"], {"X": 1, "Y": 1, "W": 1})
    assert _books(real, reqs, {"X": 1, "Z": 2}) == [
        "batch row 'W' is not scheduled this step", "batch row 'Y' is not scheduled this step",
        "scheduled 'Z' has no batch row"]


def test_a_step_with_no_tokens_compares_no_rows() -> None:
    """An empty step executes nothing: the batch keeps last step's rows."""
    reqs = {"X": _Req(1, [5])}
    real = _Real(["X"], {"X": 1})
    assert _books(real, reqs, {}) == []


def test_a_state_the_scheduler_dropped_is_reported_unless_its_finish_is_on_the_way() -> None:
    reqs = {"Y": _Req(1, [5], finished=True)}
    real = _Real([], {"X": 1, "Y": 1})
    assert _books(real, reqs, {}) == [
        "runner holds 'X', which the scheduler no longer has",
        "runner holds 'Y', which the scheduler no longer has"]
    assert _books(real, reqs, {}, pending={"X", "Y"}) == []


def test_a_state_kept_from_an_earlier_incarnation_is_reported() -> None:
    """#15041: the runner still holds the finished X's state when the re-sent X is scheduled."""
    reqs = {"X": _Req(2, [5])}
    real = _Real(["X"], {"X": 1})
    assert _books(real, reqs, {"X": 1}) == [
        "runner state of 'X' is inc 1, the scheduler's inc 2"]
    assert _books(_Real(["X"], {"X": 2}), reqs, {"X": 1}) == []


# -- input-integrity ---------------------------------------------------------------------------

def _inputs(real: _Real, requests: dict[str, _Req]) -> dict[str, list[list[Any]]]:
    return input_errors(real, _sched(requests), _inc_of)


def test_a_prefill_and_a_decode_with_the_right_inputs_say_nothing() -> None:
    """X prefills its 3 prompt tokens; Y (prompt of 2, one output recorded, one in flight)
    decodes from its in-flight token, which is its own incarnation's."""
    reqs = {"X": _Req(1, [7, 8, 9], computed=3),
            "Y": _Req(2, [7, 8], outputs=[INC2, -1], computed=4)}
    real = _Real(["X", "Y"], {"X": 1, "Y": 2},
                 [(0, 7), (1, 8), (2, 9), (3, INC2)], row_tokens=[3, 1])
    assert _inputs(real, reqs) == {}
    recorded = _Real(["Y"], {"Y": 2}, [(2, INC2)])  # the recorded output as input
    assert _inputs(recorded, {"Y": _Req(2, [7, 8], outputs=[INC2], computed=3)}) == {}


def test_a_row_at_the_wrong_position_is_reported_token_by_token() -> None:
    reqs = {"X": _Req(1, [7, 8, 9], computed=2)}
    real = _Real(["X"], {"X": 1}, [(0, 7), (2, 9)], row_tokens=[2])
    assert _inputs(real, reqs) == {"X": [[2, 9, "position 2, its true position is 1"]]}


def test_a_wrong_prompt_token_is_reported() -> None:
    reqs = {"X": _Req(1, [7, 8, 9], computed=3)}
    real = _Real(["X"], {"X": 1}, [(0, 7), (1, 4), (2, 9)], row_tokens=[3])
    assert _inputs(real, reqs) == {"X": [[1, 4, "the prompt has 8 there"]]}


def test_an_input_other_than_the_recorded_output_is_reported() -> None:
    reqs = {"X": _Req(1, [7], outputs=[INC1, INC1], computed=3)}
    real = _Real(["X"], {"X": 1}, [(2, INC2)])
    assert _inputs(real, reqs) == {"X": [[2, INC2, f"output 1 is {INC1}"]]}


def test_an_in_flight_input_of_another_or_no_incarnation_is_reported() -> None:
    """Async scheduling: the output is not recorded yet (placeholder -1); the runner's carried
    token must still be the request's own incarnation's."""
    reqs = {"X": _Req(1, [7], outputs=[-1], computed=2)}
    theirs = _Real(["X"], {"X": 1}, [(1, INC2)])
    assert _inputs(theirs, reqs) == {"X": [[1, INC2, "output 0 in flight is inc 2's token"]]}
    none = _Real(["X"], {"X": 1}, [(1, 7)])
    assert _inputs(none, reqs) == {
        "X": [[1, 7, "output 0 in flight, a token of no incarnation"]]}
    past = _Real(["X"], {"X": 1}, [(1, INC1)])  # beyond the outputs recorded: in flight too
    assert _inputs(past, {"X": _Req(1, [7], computed=2)}) == {}
