"""Await points, delay plans and schedules.

An await point is a named place where a modelled coroutine or thread can lose control. Each pass
is an *occurrence* ``(point, k)``; a :class:`DelayPlan` decides its delay. The decisions that
differ from the default form the run's *schedule*, which is its replay token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from racesim.sim.errors import InputError

__all__ = ["AwaitPoint", "PointCatalogue", "Decision", "DelayPlan", "Decider", "parse_point_key",
           "check_delay", "delay_entry", "plan_entries"]

#: The largest occurrence number a schedule may name (TOML's integer range).
MAX_OCCURRENCE = 2**63 - 1

#: An exploration hook: ``(point, occurrence, default_delay) -> delay``.
Decider = Callable[[str, int, float], float]


@dataclass(frozen=True, slots=True)
class AwaitPoint:
    """A named place where control can be lost.

    ``natural`` names the default delay (``"0"`` or a config key such as ``"step_time"``);
    ``always_yields`` marks points that give up control even at zero delay (``asyncio.sleep(0)``).
    """

    name: str
    meaning: str
    natural: str = "0"
    always_yields: bool = False

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return reduce_by_fields(self)


def reduce_by_fields(record: Any) -> tuple[type[Any], tuple[Any, ...]]:
    """``__reduce__`` for a frozen dataclass: rebuild it through its constructor, from its
    fields. A compiled (mypyc) frozen class cannot be unpickled or copied by setting its fields
    one by one, which is what the dataclass default does."""
    return type(record), tuple(getattr(record, f.name) for f in fields(record))


class PointCatalogue:
    """An ordered registry of await points, used to validate names the user types.

    ``dynamic``: prefixes of points named at run time from the code that passes them (vLLM's own
    frontend: ``send:``, ``yield:``, ``exec:`` and the vLLM function), valid without a
    declaration."""

    __slots__ = ("_points", "_dynamic")

    def __init__(self, points: Iterable[AwaitPoint], dynamic: tuple[str, ...] = ()) -> None:
        self._points: dict[str, AwaitPoint] = {}
        self._dynamic = dynamic
        for p in points:
            if p.name in self._points:
                raise ValueError(f"await point {p.name!r} declared twice")
            self._points[p.name] = p

    def _is_dynamic(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        for prefix in self._dynamic:
            if name.startswith(prefix) and len(name) > len(prefix):
                return True
        return False

    def __contains__(self, name: object) -> bool:
        return name in self._points or self._is_dynamic(name)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._points.values())

    def __len__(self) -> int:
        return len(self._points)

    def names(self) -> tuple[str, ...]:
        return tuple(self._points)

    def get(self, name: str) -> AwaitPoint:
        if name not in self._points and self._is_dynamic(name):
            return AwaitPoint(name, "named at run time by the code that passes it")
        try:
            return self._points[name]
        except KeyError:
            known = ", ".join(self._points)
            raise InputError(f"unknown await point {name!r} (known: {known})") from None


class Decision(NamedTuple):
    """One delay actually taken that differs from the default: the unit of a schedule.

    A named tuple: immutable, ordered and hashed field by field, and made (``World.pause``)
    and hashed (``explore`` counts distinct schedules) without any Python-level code."""

    point: str
    occurrence: int
    delay: float

    def as_dict(self) -> dict[str, object]:
        return {"point": self.point, "occurrence": self.occurrence, "delay": self.delay}


def check_delay(value: object, where: str) -> float:
    """A delay in seconds: a finite number >= 0, else an InputError naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: delay must be a number of seconds, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise InputError(f"{where}: delay must be a finite number >= 0, got {value!r}")
    return v


def delay_entry(point: object, occurrence: object, seconds: object,
                catalogue: PointCatalogue | None, where: str, *,
                every: bool = True) -> tuple[str, int | None, float]:
    """One delay entry ``(point, occurrence or None, seconds)``, validated: the one check every
    way of giving a delay goes through (a scenario's tables, ``--delay``, a counterexample's
    schedule, the pytest fixture). ``every=False``: the occurrence must be given."""
    if not isinstance(point, str) or (catalogue is not None and point not in catalogue):
        known = f" (known: {', '.join(catalogue.names())})" if catalogue is not None else ""
        raise InputError(f"{where}: unknown await point {point!r}{known}")
    if occurrence is None and every:
        k: int | None = None
    elif (isinstance(occurrence, bool) or not isinstance(occurrence, int)
            or not 0 <= occurrence <= MAX_OCCURRENCE):
        raise InputError(f"{where}: occurrence must be a whole number in 0..2**63-1"
                         f"{' or None' if every else ''} (got {occurrence!r})")
    else:
        k = occurrence
    return point, k, check_delay(seconds, where)


def parse_point_key(key: str, catalogue: PointCatalogue | None,
                    where: str) -> tuple[str, int | None]:
    """``"point"`` or ``"point#K"`` → ``(point, K or None)``, checked against the catalogue."""
    point, sep, occ = key.partition("#")
    k: int | None = None
    if sep:
        # isdigit() alone admits digits such as '²' that int() refuses
        if not (occ.isascii() and occ.isdigit() and len(occ) <= 19
                and int(occ) <= MAX_OCCURRENCE):
            raise InputError(f"{where}: occurrence in {key!r} must be a whole number in "
                             f"0..2**63-1")
        k = int(occ)
    if catalogue is not None and point not in catalogue:
        known = ", ".join(catalogue.names())
        raise InputError(f"{where}: unknown await point {point!r} (known: {known})")
    return point, k


class _Table:
    """Delays per point: one for every occurrence and/or one per occurrence."""

    __slots__ = ("every", "by_occurrence")

    def __init__(self) -> None:
        self.every: dict[str, float] = {}
        self.by_occurrence: dict[str, dict[int, float]] = {}

    def set(self, point: str, k: int | None, delay: float) -> None:
        delay = float(delay)  # an int given through the Python API: a float in both builds
        if k is None:
            self.every[point] = delay
        else:
            self.by_occurrence.setdefault(point, {})[k] = delay

    def lookup(self, point: str, k: int) -> float | None:
        occ = self.by_occurrence.get(point)
        if occ is not None:
            v = occ.get(k)
            if v is not None:
                return v
        return self.every.get(point)

    def items(self) -> list[tuple[str, int | None, float]]:
        out: list[tuple[str, int | None, float]] = [(p, None, d) for p, d in self.every.items()]
        for p, occ in self.by_occurrence.items():
            out.extend((p, k, d) for k, d in sorted(occ.items()))
        return out


class DelayPlan:
    """Decides each occurrence's delay.

    Precedence, strongest first: ``overrides`` (``--delay``, a witness), then the ``decider``
    (an exploration strategy's, or a replayed schedule's), then ``environment`` (a scenario's
    ``[delays]``, which is part of the default), then the point's natural latency.
    """

    __slots__ = ("_env", "_over", "_decider", "_env_empty", "_over_empty")

    def __init__(self, *, environment: Iterable[tuple[str, int | None, float]] = (),
                 overrides: Iterable[tuple[str, int | None, float]] = (),
                 decider: Decider | None = None) -> None:
        self._env = _Table()
        for p, k, d in environment:
            self._env.set(p, k, d)
        self._over = _Table()
        for p, k, d in overrides:
            self._over.set(p, k, d)
        self._decider = decider
        # The tables never change after this: most plans have no entry at all, so resolve can
        # skip their lookups.
        self._env_empty = not (self._env.every or self._env.by_occurrence)
        self._over_empty = not (self._over.every or self._over.by_occurrence)

    def resolve(self, point: str, k: int, natural: float) -> tuple[float, float]:
        """``(delay, default)`` for occurrence ``k`` of ``point``."""
        # float(): a natural latency given as an int (a Workload built in Python) is recorded
        # as a float by both builds
        if self._env_empty:
            default = float(natural)
        else:
            found = self._env.lookup(point, k)
            default = float(natural) if found is None else found
        if not self._over_empty:
            chosen = self._over.lookup(point, k)
            if chosen is not None:
                return chosen, default
        decider = self._decider
        if decider is not None:
            # float(): a decider may answer an int; both builds record it as a float
            return float(decider(point, k, default)), default
        return default, default

    def overrides(self) -> list[tuple[str, int | None, float]]:
        return self._over.items()

    def environment(self) -> list[tuple[str, int | None, float]]:
        return self._env.items()


def plan_entries(table: Mapping[str, object], catalogue: PointCatalogue | None,
                 where: str) -> list[tuple[str, int | None, float]]:
    """Turn ``{"point" or "point#K": seconds}`` into plan entries, validating every one."""
    out = []
    for key, value in table.items():
        point, k = parse_point_key(str(key), catalogue, f"{where} {key!r}")
        out.append(delay_entry(point, k, value, catalogue, f"{where} {key!r}"))
    return out

