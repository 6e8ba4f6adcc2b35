"""Which lanes a diagram page draws, and where: a lane nothing happens in on a page is dropped."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from racesim.reports.model import TraceModel
from racesim.sim.trace import TraceEvent

__all__ = ["LaneBox", "lay_out_lanes", "used_lanes"]



@dataclass(slots=True)
class LaneBox:
    """One lane's box in a swimlane diagram."""

    key: str
    title: str
    group_title: str
    x: float  # centre
    x0: float
    w: float
    group_start: bool


def used_lanes(model: TraceModel, events: Sequence[TraceEvent]) -> set[str]:
    """The lanes ``events`` put a mark, an arrow end or an engine-step bar in."""
    keys: set[str] = set()
    for ev in events:
        msg = model.messages.get(ev.seq)
        if msg is not None:  # a message is drawn from its sender's lane to its receiver's
            keys.update((msg.src, msg.dst))
        else:
            keys.add(model.lane_of(ev.component))
        if model.is_engine_lane(model.lane_of(ev.component)):  # its engine's steps are bars
            keys.add(model.step_lane(ev.component))
    return keys


def lay_out_lanes(model: TraceModel, keys: set[str] | None,
                  left: float) -> tuple[list[LaneBox], list[tuple[str, float, float]], float]:
    """Lane boxes (in the model's order) for ``keys`` (None: every lane), the group headers
    ``(title, x0, width)``, and where the text columns start."""
    lanes = [lane for lane in model.lanes if keys is None or lane.key in keys]
    n = max(len(lanes), 1)
    lane_w = 80.0 if n <= 8 else 72.0 if n <= 10 else 62.0
    boxes: list[LaneBox] = []
    groups: list[tuple[str, float, float]] = []
    prev_group = None
    for i, lane in enumerate(lanes):
        x0 = left + i * lane_w
        start = lane.group != prev_group
        if start:
            groups.append((lane.group_title, x0, lane_w))
        else:
            title, gx, gw = groups[-1]
            groups[-1] = (title, gx, gw + lane_w)
        prev_group = lane.group
        boxes.append(LaneBox(lane.key, lane.title, lane.group_title, x0 + lane_w / 2, x0,
                             lane_w, start))
    return boxes, groups, left + n * lane_w + 14
