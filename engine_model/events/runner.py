"""Events about the model runner's books, recorded only when they disagree with the truth."""

from __future__ import annotations

from typing import Any

from racesim.sim.trace import EventRecord, TraceEvent

__all__ = ["RunnerBooks", "RunnerInput"]


class RunnerBooks(EventRecord):
    """runner.books: after a step the runner's requests or batch rows are not exactly the
    scheduler's live requests, each once (``problems``: one line each)."""

    KIND = "runner.books"
    KEY = True
    __slots__ = ("step", "problems")

    def __init__(self, step: int, problems: list[str]) -> None:
        self.step = step
        self.problems = problems

    def describe(self, ev: TraceEvent) -> str:
        return f"step {self.step}: runner books differ ({'; '.join(self.problems)})"


class RunnerInput(EventRecord):
    """runner.input: a request's model input at one step holds a token or a position that is
    not its incarnation's true sequence (``problems``: ``[position, token, what]`` each)."""

    KIND = "runner.input"
    KEY = True
    __slots__ = ("step", "problems")

    def __init__(self, step: int, problems: list[Any]) -> None:
        self.step = step
        self.problems = problems

    def describe(self, ev: TraceEvent) -> str:
        return f"step {self.step}: model input of {ev.request!r} is wrong ({self.problems[0][2]})"
