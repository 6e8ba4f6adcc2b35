"""A swimlane diagram's data, as the templates draw it: its rows, arrows, bars and sizes
(swimlane.py decides which events become rows and lays them out). Every string is raw text for
the template to escape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from racesim.reports.lane_layout import LaneBox
from racesim.reports.model import PALETTE, Incarnation
from racesim.reports.text import clip

__all__ = ["ARROW_COLOURS", "GAP_H", "GREY", "HEAD_H", "LEFT_W", "LINE_H", "ROW_H", "TEXT_W",
           "VIOLATION_RED", "Arrow", "Bar", "Diagram", "Row", "short_label"]

ROW_H, GAP_H, HEAD_H, TEXT_W = 22, 20, 56, 540
#: The height each further line of a wrapped event text adds to its row.
LINE_H = 14
LEFT_W = 118.0
VIOLATION_RED = "#d62728"
GREY = "#7a7a7a"
#: One arrowhead marker per colour an arrow can have (index = marker id suffix).
ARROW_COLOURS = (*PALETTE, GREY, VIOLATION_RED)


@dataclass(slots=True)
class Row:
    """One row of a swimlane diagram: an event, a fold of events, or the end of the run."""

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
    #: ``text`` wrapped: an event's long text takes more lines, never an ellipsis
    lines: tuple[str, ...] = ()

    @property
    def cy(self) -> float:
        """The middle of the row's first line: where its mark sits and its arrows start."""
        return self.y + min(self.h, ROW_H) / 2


def short_label(inc: Incarnation) -> str:
    """An incarnation's label for a diagram row: a long request ID is shortened, its number
    is always kept ("tenant-42/ve… #2")."""
    return f"{clip(inc.request, 12)} #{inc.number or inc.inc}"


@dataclass(slots=True)
class Arrow:
    """A message drawn from one lane to another."""

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
    """A shaded span on a lane (a delay, or a race window)."""

    x: float
    y1: float
    y2: float
    w: float
    colour: str
    title: str


@dataclass(slots=True)
class Diagram:
    """One laid-out swimlane diagram, ready for the template."""

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
    body_x: float = 0.0  # where the "what happened" text starts (after the component column)
    t_range: tuple[float, float] = (0.0, 0.0)
    seqs: frozenset[int] = field(default_factory=frozenset)
    more_incarnations: int = 0

    @property
    def has_delay(self) -> bool:
        return any(r.delay for r in self.rows)

    @property
    def has_violation(self) -> bool:
        return any(r.violations for r in self.rows)
