"""Exploration strategies: how each run of an exploration picks its delays.

A strategy turns ``(base seed, run index)`` into a :class:`~racesim.sim.points.Decider` for
that run, so run *i* is the same whichever worker runs it and in whatever order. It knows
await points only by name and by how often a baseline run passed them; nothing here knows
about vLLM.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from racesim.sim.errors import InputError
from racesim.sim.points import Decider, Decision, reduce_by_fields
from racesim.sim.rng import stable_seed

__all__ = ["StrategyConfig", "Strategy", "RandomStrategy", "PctStrategy", "GridStrategy",
           "make_strategy", "STRATEGIES", "grid_cells", "delay_alphabet", "Replay"]

STRATEGIES = ("random", "pct", "grid", "hypothesis")


@dataclass(frozen=True, slots=True)
class StrategyConfig:
    """What a strategy may know: the points a baseline run passed and their counts, and a time
    scale (seconds; one engine step) to size delays with."""

    occurrences: Mapping[str, int]
    scale: float
    seed: int = 0
    pct_depth: int = 2
    grid_width: int = 1
    grid_occurrences: int = 3

    @property
    def points(self) -> tuple[str, ...]:
        return tuple(p for p, n in self.occurrences.items() if n > 0)

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return reduce_by_fields(self)


class Strategy:
    """How one exploration chooses delays: one decider per run number."""

    name = "none"

    def __init__(self, config: StrategyConfig) -> None:
        self.config = config

    def decider(self, run: int) -> Decider | None:
        """The decider of run ``run`` (run 0 is always the unperturbed baseline)."""
        raise NotImplementedError

    def size(self) -> int | None:
        """How many runs the strategy has to offer (None: unbounded)."""
        return None

    def info(self) -> dict[str, object]:
        return {}


class RandomStrategy(Strategy):
    """Each run picks a few points to perturb; each occurrence of those is delayed with
    probability 1/2 by either a tiny reordering delay or an exponential one (mean 3 steps)."""

    name = "random"

    def decider(self, run: int) -> Decider | None:
        if run == 0:
            return None
        rng = random.Random(stable_seed(self.config.seed, "random", run))
        points = self.config.points
        focus: set[str] = set()
        if points:
            focus = {p for p in points if rng.random() < 0.3} or {rng.choice(points)}
        scale = self.config.scale

        def decide(point: str, k: int, default: float) -> float:
            if point not in focus or rng.random() < 0.5:
                return default
            # rng.uniform(0.0, scale / 10) and rng.expovariate(1.0 / (3 * scale)), written out
            # as random.py computes them: the same draws and values, without a Python-level
            # call at every await point
            if rng.random() < 0.3:
                return default + (0.0 + (scale / 10 - 0.0) * rng.random())
            return default + -math.log(1.0 - rng.random()) / (1.0 / (3 * scale))

        return decide


class PctStrategy(Strategy):
    """PCT (Burckhardt et al.) adapted to await points.

    Points play the threads: each run gives them random priorities, and a lower priority is a
    slightly later resumption at every occurrence (a reordering of same-time events). ``d - 1``
    change points are chosen (a point, then one of its baseline occurrences); there the process
    is parked for one or five steps, letting every other process run first. For a bug of depth
    ``d`` each run finds it with probability at least 1/(n * k^(d-1)), n = points, k = the most
    occurrences of any point.
    """

    name = "pct"

    def decider(self, run: int) -> Decider | None:
        if run == 0:
            return None
        cfg = self.config
        rng = random.Random(stable_seed(cfg.seed, "pct", run))
        points = list(cfg.points)
        order = points[:]
        rng.shuffle(order)
        rank = {p: i for i, p in enumerate(order)}
        changes: dict[tuple[str, int], float] = {}
        for _ in range(max(0, cfg.pct_depth - 1)):
            p = rng.choice(points)
            k = rng.randrange(cfg.occurrences[p])
            changes[(p, k)] = cfg.scale * rng.choice((1.0, 5.0))
        tick = cfg.scale * 1e-4

        def decide(point: str, k: int, default: float) -> float:
            park = changes.get((point, k))
            if park is not None:
                return default + park
            return default + tick * rank.get(point, 0)

        return decide

    def info(self) -> dict[str, object]:
        cfg = self.config
        n = len(cfg.points)
        k = max(cfg.occurrences.values(), default=1)
        d = cfg.pct_depth
        bound = 1.0 / (n * k ** (d - 1)) if n else 0.0
        return {"n": n, "k": k, "d": d, "bound": bound}


def delay_alphabet(scale: float) -> tuple[float, float, float, float]:
    """The delays a schedule search tries, simplest first: none, a reordering nudge (1 % of an
    engine step ``scale``), one step, five steps. The grid and both hypothesis schedule
    strategies (exploration's and ``racesim.scenarios.schedules``) draw from it."""
    scale = float(scale)  # an int scale gives the same (float) delays in both builds
    return (0.0, scale / 100, scale, 5 * scale)


def grid_cells(config: StrategyConfig) -> Iterator[tuple[tuple[str, int | None, float], ...]]:
    """All perturbations of at most ``grid_width`` (point, occurrence) slots, each set to a value
    of the alphabet {0, epsilon, one step, five steps}, fewest slots first."""
    alphabet = delay_alphabet(config.scale)
    slots: list[tuple[str, int | None]] = []
    for p in config.points:
        n = config.occurrences[p]
        slots.extend((p, k) for k in range(min(n, config.grid_occurrences)))
        if n > config.grid_occurrences:
            slots.append((p, None))
    for width in range(1, config.grid_width + 1):
        for combo in itertools.combinations(slots, width):
            for values in itertools.product(alphabet, repeat=width):
                yield tuple((p, k, v) for (p, k), v in zip(combo, values, strict=True))


class GridStrategy(Strategy):
    """Bounded-exhaustive: run i > 0 is the i-th cell of :func:`grid_cells`."""

    name = "grid"

    def __init__(self, config: StrategyConfig) -> None:
        super().__init__(config)
        self._cells = list(grid_cells(config))

    def cell(self, run: int) -> tuple[tuple[str, int | None, float], ...]:
        return self._cells[run - 1] if 0 < run <= len(self._cells) else ()

    def decider(self, run: int) -> Decider | None:
        cell = self.cell(run)
        if not cell:
            return None
        every = {p: v for p, k, v in cell if k is None}
        exact = {(p, k): v for p, k, v in cell if k is not None}

        def decide(point: str, k: int, default: float) -> float:
            v = exact.get((point, k))
            if v is None:
                v = every.get(point)
            return default if v is None else v

        return decide

    def size(self) -> int | None:
        return len(self._cells) + 1

    def info(self) -> dict[str, object]:
        return {"cells": len(self._cells), "width": self.config.grid_width}


class Replay:
    """A recorded schedule as a decider: each recorded occurrence gets its recorded delay and
    every other one its default, so the run is the recorded one again. Replaying is one more
    way of deciding delays, as exploring is, not a path of its own."""

    __slots__ = ("_delays",)

    def __init__(self, schedule: Iterable[Decision]) -> None:
        self._delays = {(d.point, d.occurrence): float(d.delay) for d in schedule}

    def __call__(self, point: str, k: int, default: float) -> float:
        v = self._delays.get((point, k))
        return default if v is None else v


def make_strategy(name: str, config: StrategyConfig) -> Strategy:
    classes: dict[str, type[Strategy]] = {"random": RandomStrategy, "pct": PctStrategy,
                                          "grid": GridStrategy}
    cls = classes.get(name)
    if cls is None:
        # "hypothesis" is no Strategy: racesim.explore.hypothesis_search drives hypothesis itself
        raise InputError(f"unknown strategy {name!r} (known: {', '.join(classes)})")
    return cls(config)


