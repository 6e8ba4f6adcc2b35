"""The World: one simulation run's environment, random streams, delay plan and trace."""

from __future__ import annotations

from functools import partial
from operator import attrgetter
from typing import Any

import simpy

from racesim.sim.points import Decision, DelayPlan
from racesim.sim.rng import RngStreams
from racesim.sim.trace import EventRecord, TraceEvent, TraceRecorder

__all__ = ["Delay", "World"]

_NOW = attrgetter("_now")
_new_tuple = tuple.__new__  # a named tuple without its Python-level __new__


class Delay(EventRecord):
    """delay: an await point's occurrence was given a delay other than its default."""

    KIND = "delay"
    KEY = True
    __slots__ = ("point", "occurrence", "delay", "default")

    def __init__(self, point: str, occurrence: int, delay: float, default: float) -> None:
        self.point = point
        self.occurrence = occurrence
        self.delay = delay
        self.default = default

    def describe(self, ev: TraceEvent) -> str:
        return (f"await point {self.point}#{self.occurrence} delayed {self.delay:g}s "
                f"(default {self.default:g}s)")


class World:
    """One run: a ``simpy.Environment``, seeded RNG streams, the delay plan and the recorder.

    Everything that varies between runs comes from the seed and the plan, so the same seed and
    plan give the same trace (and trace hash) in any process.
    """

    __slots__ = ("env", "rng", "plan", "trace", "_occurrences", "_schedule", "_times",
                 "_yielding", "_widened")

    def __init__(self, seed: int, plan: DelayPlan | None = None, *, retain_trace: bool = True,
                 hash_trace: bool = True, always_yield: frozenset[str] = frozenset()) -> None:
        # simpy's clock starts at the int 0 and becomes a float with the first float timeout.
        # The clock is read as "float | int" wherever it reaches a trace or a verdict, so that
        # a compiled build (where a float-typed value is a C double) records 0 exactly as the
        # source build does (and as the pinned trace hashes expect).
        self.env = simpy.Environment()
        self.rng = RngStreams(seed)
        self.plan = plan if plan is not None else DelayPlan()
        # env._now is what env.now returns; partial(attrgetter) reads it without a Python frame
        self.trace = TraceRecorder(partial(_NOW, self.env), retain=retain_trace,
                                   hashing=hash_trace)
        self._occurrences: dict[str, int] = {}
        self._schedule: list[Decision] = []
        self._times: list[float] = []
        self._yielding = always_yield
        self._widened: list[tuple[str, int]] = []

    @property
    def now(self) -> float | int:
        """The simulation clock (what ``env.now`` returns, without its Python-level property):
        the int 0 until the first float timeout, as simpy keeps it."""
        now: float | int = self.env._now
        return now

    @property
    def seed(self) -> int:
        return self.rng.seed

    @property
    def schedule(self) -> tuple[Decision, ...]:
        """The decisions taken so far that differ from the default: the replay token."""
        return tuple(self._schedule)

    @property
    def decision_times(self) -> tuple[float, ...]:
        """When each decision of :attr:`schedule` was taken (the reach of a violation counts
        only the delays taken before it)."""
        return tuple(self._times)

    @property
    def occurrences(self) -> dict[str, int]:
        """How many times each await point was passed (race-window coverage)."""
        return dict(self._occurrences)

    @property
    def widened(self) -> tuple[tuple[str, int], ...]:
        """The ``(point, occurrence)`` passes that yield although their point does not always
        yield (see :meth:`widen_next`)."""
        return tuple(self._widened)

    def widen_next(self, point: str) -> None:
        """The next pass of ``point`` sits in a window that already yields (its width there is
        "yield", whatever the point's own): a delay there is no latent hazard."""
        self._widened.append((point, self._occurrences.get(point, 0)))

    def pause(self, point: str, natural: float, where: str) -> float:
        """Pass an await point and return its delay (0 means: carry on without yielding).

        A non-default delay is recorded in the schedule and in the trace, so reports can show
        exactly where the race window was opened.
        """
        occ = self._occurrences
        k = occ.get(point, 0)
        occ[point] = k + 1
        delay, default = self.plan.resolve(point, k, natural)
        if delay != default:
            self._schedule.append(_new_tuple(Decision, (point, k, delay)))
            self._times.append(float(self.env._now))
            trace = self.trace
            if trace.reads("delay"):
                trace.emit(where, None, 0, Delay(point, k, delay, default))
            else:
                trace.skip()
        return delay

    def sleep(self, point: str, natural: float, where: str) -> simpy.Timeout | None:
        """:meth:`pause`, as an event to yield (``None`` when the process keeps control)."""
        d = self.pause(point, natural, where)
        if d > 0.0 or point in self._yielding:
            return self.env.timeout(d)
        return None

    def emit(self, component: str, request: str | None, inc: int, record: EventRecord) -> None:
        """Trace one event: ``record`` (its kind's typed detail) at ``component``, about
        ``request`` (incarnation ``inc``, 0 when none)."""
        self.trace.emit(component, request, inc, record)

    def record(self, component: str, kind: str, request: str | None = None, inc: int = 0,
               **detail: Any) -> None:
        """:meth:`emit` by kind name, the detail as keywords (the record of ``kind`` is built
        from them). The model emits records; this form serves tests and hand-written traces."""
        self.trace.record(component, kind, request, inc, detail)
