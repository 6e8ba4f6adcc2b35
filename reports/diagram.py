"""A swimlane diagram as data: the records the templates draw, and their colours.

:mod:`racesim.reports.swimlane` lays a trace out into these; the templates draw them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from racesim.reports.model import PALETTE, Incarnation

__all__ = ["Diagram", "Row", "Arrow", "Bar", "LaneBox", "ARROW_COLOURS", "VIOLATION_RED",
           "GREY", "clip"]

VIOLATION_RED = "#d62728"
GREY = "#7a7a7a"
#: One arrowhead marker per colour an arrow can have (index = marker id suffix).
ARROW_COLOURS = (*PALETTE, GREY, VIOLATION_RED)


def clip(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters with an ellipsis."""
    return text if len(text) <= n else text[: max(n - 1, 1)] + "…"


@dataclass(slots=True)
class LaneBox:
    """One lane's column header: a component, under its group (a frontend, an engine, ...)."""

    key: str
    title: str
    group_title: str
    x: float  # centre
    x0: float
    w: float
    group_start: bool


@dataclass(slots=True)
class Row:
    """One row of the diagram: a shown event, a fold of hidden ones, or the end-of-run checks."""

    kind: str  # "event", "gap" (folded events) or "end" (end-of-run checks)
    y: float
    h: float
    t0: float
    t1: float
    seq: int = -1
    lane_x: float = 0.0
    colour: str = GREY
    who: str = ""
    inc_label: str = ""
    text: str = ""
    title: str = ""
    violations: tuple[str, ...] = ()
    delay: bool = False
    message: bool = False
    stripe: bool = False

    @property
    def cy(self) -> float:
        return self.y + self.h / 2


@dataclass(slots=True)
class Arrow:
    """A message between two lanes, from its send row to its receive row."""

    x1: float
    y1: float
    x2: float
    y2: float
    colour: int  # index into ARROW_COLOURS
    dash: str
    width: float
    label: str
    title: str


@dataclass(slots=True)
class Bar:
    """An engine step on its lane, from start to end: one slice per incarnation it ran."""

    x: float
    y1: float
    y2: float
    w: float
    colour: str
    title: str


@dataclass(slots=True)
class Diagram:
    """One page of a swimlane diagram, laid out: everything the template draws."""

    title: str
    width: float
    height: float
    lanes: list[LaneBox]
    groups: list[tuple[str, float, float]]  # (title, x0, width)
    rows: list[Row]
    arrows: list[Arrow]
    bars: list[Bar]
    shade: tuple[float, float] | None
    incarnations: list[Incarnation]
    shown: int
    folded: int
    text_x: float
    t_range: tuple[float, float] = (0.0, 0.0)
    seqs: frozenset[int] = field(default_factory=frozenset)
    more_incarnations: int = 0

    @property
    def has_delay(self) -> bool:
        return any(r.delay for r in self.rows)

    @property
    def has_violation(self) -> bool:
        return any(r.violations for r in self.rows)
