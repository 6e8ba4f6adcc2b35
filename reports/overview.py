"""The whole run at a glance: a heat strip per lane over time (bounded, whatever the run size).

Time runs right; each lane is a thin row of buckets shaded by how many events fell in them.
Violations are red ticks, injected delays orange ticks, the race window is shaded and each
swimlane page's time span is bracketed, so a reader sees where the detailed pages sit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from racesim.engine_model.checker import Violation
from racesim.engine_model.events import Delay
from racesim.reports.model import TraceModel
from racesim.reports.swimlane import Diagram

__all__ = ["Overview", "build_overview"]

_LEFT, _LANE_H, _TOP, _BUCKETS, _PLOT_W = 180, 13, 22, 96, 1060


@dataclass(slots=True)
class Overview:
    """The whole-run overview strip above the swimlane diagrams."""

    width: float
    height: float
    left: float
    plot_w: float
    lanes: list[tuple[str, float]]  # (title, y)
    cells: list[tuple[float, float, float, float, float, str]]  # x, y, w, h, opacity, title
    ticks: list[tuple[float, str, str]]  # x, colour, title
    shade: tuple[float, float] | None
    pages: list[tuple[float, float, str]]  # x0, x1, label
    axis: list[tuple[float, str]]  # x, label
    bottom: float


def build_overview(model: TraceModel, violations: Sequence[Violation], sim_time: float,
                   pages: Sequence[Diagram], race: tuple[float, float] | None) -> Overview:
    # Zoom to the activity: a run whose last request hangs ends at its horizon (pd-kv-load-
    # failure: events up to 0.05 s, the run to 30 s), and a strip scaled to the horizon would
    # squeeze every event into its first pixels. Later violations are ticks at the right edge.
    last = max((e.time for e in model.events), default=0.0)
    span = max(last * 1.04 if last > 0 else sim_time, 1e-9)
    ends = f" (the run ends at t={sim_time:.3f}s)" if sim_time > span else ""

    def x_of(t: float) -> float:
        return _LEFT + min(max(t / span, 0.0), 1.0) * _PLOT_W

    bw = _PLOT_W / _BUCKETS
    counts: Counter[tuple[int, int]] = Counter()
    for ev in model.events:
        lane = model.lane_index.get(model.lane_of(ev.component))
        if lane is not None:
            counts[(lane, min(int(ev.time / span * _BUCKETS), _BUCKETS - 1))] += 1
    top = max(counts.values(), default=1)
    cells: list[tuple[float, float, float, float, float, str]] = []
    for (lane, b), n in sorted(counts.items()):
        y = float(_TOP + lane * _LANE_H)
        cells.append((_LEFT + b * bw, y + 1, bw, _LANE_H - 2.0, 0.18 + 0.82 * n / top,
                      f"{model.lanes[lane].group_title} / {model.lanes[lane].title}: {n} events "
                      f"at t={b * span / _BUCKETS:.4f}-{(b + 1) * span / _BUCKETS:.4f}s"))
    bottom = _TOP + len(model.lanes) * _LANE_H
    ticks: list[tuple[float, str, str]] = []
    seen: set[tuple[str, float]] = set()
    for v in violations:
        if (v.invariant, v.time) not in seen:
            seen.add((v.invariant, v.time))
            ticks.append((x_of(v.time), "#d62728", f"{v.invariant} at t={v.time:.4f}s"))
    for ev in model.events:
        d = ev.detail
        if isinstance(d, Delay):
            ticks.append((x_of(ev.time), "#e08a1e",
                          f"delay {d.point}#{d.occurrence} at t={ev.time:.4f}s"))
    shade = (x_of(race[0]), max(x_of(race[1]), x_of(race[0]) + 2)) if race else None
    marks = [(x_of(p.t_range[0]), max(x_of(p.t_range[1]), x_of(p.t_range[0]) + 3), str(n))
             for n, p in enumerate(pages, 1)]
    axis = [(x_of(span * k / 4), f"{span * k / 4:.3f}s") for k in range(5)]
    if ends:
        axis[-1] = (axis[-1][0], axis[-1][1] + ends)
    # Each group's name once, on its first lane ("prefill engine / input thread", then
    # "busy loop", ...): the axis reads as a list, not the same prefix on every line.
    lanes = []
    for i, lane in enumerate(model.lanes):
        first = i == 0 or model.lanes[i - 1].group_title != lane.group_title
        label = (f"{lane.group_title} / {lane.title}"
                 if first and lane.group_title != lane.title else lane.title)
        lanes.append((label, float(_TOP + i * _LANE_H + _LANE_H - 3)))
    return Overview(_LEFT + _PLOT_W + 20, bottom + 34, _LEFT, _PLOT_W, lanes, cells, ticks,
                    shade, marks, axis, bottom)
