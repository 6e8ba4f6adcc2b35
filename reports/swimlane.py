"""Swimlane sequence diagrams as plain data: which events to show, where, and the arrows.

A diagram is a column per lane and a row per shown event (time runs down, in event order).
Big runs are never drawn whole: each page keeps at most ``budget`` event rows, chosen around
the race (violating events, injected delays, then key events of the violated request IDs, then
other key events, nearest first); everything else folds into grey summary rows. Violations that
do not fit the first page get pages of their own (at most ``max_pages`` in all).

The templates draw these numbers; every string here is raw text for the template to escape.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from typing import cast

from racesim.engine_model.checker import Violation
from racesim.engine_model.events import SchedStep
from racesim.engine_model.narrate import KEY_KINDS, describe
from racesim.reports.diagram import (
    ARROW_COLOURS,
    GAP_H,
    HEAD_H,
    LEFT_W,
    LINE_H,
    ROW_H,
    TEXT_W,
    VIOLATION_RED,
    Arrow,
    Bar,
    Diagram,
    Row,
    short_label,
)
from racesim.reports.focus import KEY, priorities, race_span, select
from racesim.reports.lane_layout import LaneBox, lay_out_lanes, used_lanes
from racesim.reports.model import PALETTE, Incarnation, TraceModel
from racesim.reports.text import clip, wrap
from racesim.sim.trace import TraceEvent

__all__ = ["Diagram", "Row", "Arrow", "Bar", "LaneBox", "build_diagrams", "race_span", "LINE_H",
           "ARROW_COLOURS", "VIOLATION_RED", "clip"]


def _gap_text(events: Sequence[TraceEvent]) -> str:
    kinds = Counter(e.kind for e in events)
    top = ", ".join(f"{n}x {k}" for k, n in kinds.most_common(3))
    more = len(kinds) - 3
    return (f"folded (t={events[0].time:.4f}-{events[-1].time:.4f}s): {top}"
            + (f", +{more} kinds" if more > 0 else ""))


class _Page:
    """Lays out one page: rows first, then what hangs off them (arrows, bars, the shade)."""

    def __init__(self, model: TraceModel, viol: dict[int, list[str]],
                 end_viol: list[str], sim_time: float, focus_ids: set[str],
                 prio: list[int]) -> None:
        self.model = model
        self.prio = prio
        self.focus_ids = focus_ids
        self.more_incs = 0
        self.viol = viol
        self.end_viol = end_viol
        self.sim_time = sim_time
        self._layout(None)

    def _layout(self, keys: set[str] | None) -> None:
        """Lanes for this page: only those it draws something in (all, before rows exist)."""
        self.lanes, self.groups, self.text_x = lay_out_lanes(self.model, keys, LEFT_W)
        self.lane_x = {b.key: b.x for b in self.lanes}

    def _event_row(self, ev: TraceEvent, y: float, stripe: bool) -> Row:
        model = self.model
        msg = model.messages.get(ev.seq)
        lane = msg.src if msg else model.lane_of(ev.component)
        incs = model.incs_of(ev)
        inc_label = ", ".join(short_label(model.incarnations[i]) for i in incs[:2]
                              if i in model.incarnations) + (" …" if len(incs) > 2 else "")
        text = model.relabel(describe(ev))
        names = tuple(self.viol.get(ev.seq, ()))
        who = ev.component
        channel = model.topology.channel(who) if msg is not None else None
        if channel is not None:
            who = f"{channel.src}→{channel.dst}"
        lines = wrap(text, max(30, 84 - len(inc_label) - sum(len(x) + 2 for x in names)))
        return Row("event", y, ROW_H + LINE_H * (len(lines) - 1), ev.time, ev.time, ev.seq,
                   self.lane_x.get(lane, LEFT_W), model.colour_of(incs), who,
                   inc_label, text, f"#{ev.seq} t={ev.time:.4f}s {ev.component}: {text}",
                   names, ev.kind == "delay", msg is not None, stripe, lines)

    def _fold_runs(self, chosen: list[int]) -> list[int | tuple[int, int, str]]:
        """``chosen`` with steady runs (4+ alike output messages in a row) folded to one row."""
        events, messages = self.model.events, self.model.messages
        out: list[int | tuple[int, int, str]] = []
        k = 0
        while k < len(chosen):
            i = chosen[k]
            msg = messages.get(events[i].seq)
            run = k
            if msg is not None and msg.type == "EngineCoreOutputs":
                while run + 1 < len(chosen):
                    j = chosen[run + 1]
                    other = messages.get(events[j].seq)
                    if (other is None or (other.type, other.ids, other.incs, other.src)
                            != (msg.type, msg.ids, msg.incs, msg.src)
                            or any(e.kind in KEY_KINDS
                                   for e in events[chosen[run] + 1:j])):
                        break
                    run += 1
            if msg is not None and run - k >= 3:
                inner = chosen[k + 1:run]
                labels = ", ".join(self.model.incarnations[n].label for n in msg.incs[:2]
                                   if n in self.model.incarnations) or ", ".join(msg.ids)
                text = (f"{len(inner)} more alike outputs messages for {clip(labels, 30)} "
                        f"(t={events[inner[0]].time:.4f}-{events[inner[-1]].time:.4f}s)")
                out += [i, (inner[0], inner[-1], text), chosen[run]]
                k = run + 1
            else:
                out.append(i)
                k += 1
        return out

    def _worth_a_row(self, lo: int, hi: int) -> bool:
        """Whether folded events ``lo:hi`` get a summary row: many, or a key event among them
        (bookkeeping and repeated output messages fold silently)."""
        return hi - lo > 30 or any(p <= KEY for p in self.prio[lo:hi])

    def _gap(self, hidden: Sequence[TraceEvent], y: float, text: str = "") -> Row:
        return Row("gap", y, GAP_H, hidden[0].time, hidden[-1].time, seq=len(hidden),
                   text=text or _gap_text(hidden),
                   title=f"events #{hidden[0].seq}-#{hidden[-1].seq} folded")

    def build(self, title: str, chosen: list[int], shade_span: tuple[int, int] | None,
              with_end: bool) -> Diagram:
        events = self.model.events
        self._layout(used_lanes(self.model, [events[i] for i in chosen]))
        rows: list[Row] = []
        y = float(HEAD_H)
        prev = -1
        n = 0
        for item in self._fold_runs(chosen):
            if isinstance(item, tuple):
                lo, hi, text = item
                rows.append(self._gap(events[prev + 1:hi + 1], y, text))
                y += GAP_H
                prev = hi
                continue
            i = item
            hidden = events[prev + 1:i]
            if self._worth_a_row(prev + 1, i):
                rows.append(self._gap(hidden, y))
                y += GAP_H
            rows.append(self._event_row(events[i], y, n % 2 == 1))
            n += 1
            y += rows[-1].h
            prev = i
        hidden = events[prev + 1:]
        if self._worth_a_row(prev + 1, len(events)):
            rows.append(self._gap(hidden, y))
            y += GAP_H
        if with_end and self.end_viol:
            rows.append(Row("end", y, ROW_H, self.sim_time, self.sim_time,
                            text=f"end of run (t={self.sim_time:.4f}s): end-of-run checks",
                            title="checked when the run ended", violations=tuple(self.end_viol)))
            y += ROW_H
        height = y + 10
        arrows = self._arrows(rows, height)
        bars = self._bars(rows, height)
        shade = None
        if shade_span is not None:
            lo, hi = shade_span
            tops = [r for r in rows if r.kind == "event" and lo <= r.seq <= hi]
            if tops:
                shade = (tops[0].y, tops[-1].y + tops[-1].h)
        incs = self._legend(chosen)
        ev_rows = [r for r in rows if r.kind == "event"]
        t_range = (ev_rows[0].t0, ev_rows[-1].t1) if ev_rows else (0.0, 0.0)
        who_w = max((len(r.who) for r in ev_rows), default=9) * 6.3 + 14
        body_x = self.text_x + max(who_w, 80.0)
        return Diagram(title, body_x + TEXT_W, height, self.lanes, self.groups, rows,
                       arrows, bars, shade, incs, len(ev_rows), len(events) - len(ev_rows),
                       self.text_x, body_x, t_range, frozenset(r.seq for r in ev_rows),
                       self.more_incs)

    def _legend(self, chosen: list[int], cap: int = 12) -> list[Incarnation]:
        """The incarnations to name above a page: those of the violated IDs first."""
        model = self.model
        shown = sorted({i for idx in chosen for i in model.incs_of(model.events[idx])
                        if i in model.incarnations})
        ranked = sorted(shown, key=lambda i: (model.incarnations[i].request not in self.focus_ids,
                                              i))
        self.more_incs = max(len(ranked) - cap, 0)
        return [model.incarnations[i] for i in ranked[:cap]]

    def _ymap(self, rows: list[Row], t: float, after: int, height: float) -> tuple[float, bool]:
        """Where time ``t`` falls among ``rows`` (searching from index ``after``)."""
        for r in rows[after:]:
            if r.kind == "gap" and r.t1 >= t:
                return r.cy, True
            if r.kind != "gap" and r.t0 >= t:
                return (r.cy if r.t0 == t else r.y), True
        return height - 4, False

    def _arrows(self, rows: list[Row], height: float) -> list[Arrow]:
        out: list[Arrow] = []
        colour_index = {c: i for i, c in enumerate(ARROW_COLOURS)}
        for k, r in enumerate(rows):
            if not r.message:
                continue
            msg = self.model.messages[r.seq]
            y2, _landed = self._ymap(rows, msg.arrive, k + 1, height)
            y2 = max(y2, r.cy + 6)
            colour = r.colour
            dash, width = "", 1.6
            if msg.type == "AbortMessage":
                dash, width = "6 3", 2.2
            elif msg.type == "EngineCoreOutputs":
                width = 1.1
            elif msg.type == "EngineDead":
                colour, width = VIOLATION_RED, 2.4
            elif msg.type == "KVDoneNotice":
                dash = "2 3"
            label = "" if msg.type == "EngineCoreOutputs" else clip(
                f"{msg.short} {', '.join(msg.ids)}", 22)
            title = (f"{msg.channel}: {msg.short} {', '.join(msg.ids)} sent t={msg.send:.4f}s, "
                     f"arrives t={msg.arrive:.4f}s")
            out.append(Arrow(self.lane_x.get(msg.src, LEFT_W), r.cy,
                             self.lane_x.get(msg.dst, LEFT_W), y2,
                             colour_index.get(colour, len(PALETTE)), dash, width, label, title))
        return out

    def _bars(self, rows: list[Row], height: float, cap: int = 400) -> list[Bar]:
        """Engine steps (sched.step to its sched.update) as bars in the runner lane."""
        ev_rows = [r for r in rows if r.kind == "event"]
        if not ev_rows:
            return []
        t_lo, t_hi = ev_rows[0].t0, ev_rows[-1].t1
        spans = [(st, end) for st, end, _applied in self.model.step_spans(self.sim_time)]
        times = [r.t0 for r in rows]
        out: list[Bar] = []
        for st, end in sorted(spans, key=lambda s: s[0].seq):
            if end < t_lo or st.time > t_hi or len(out) >= cap:
                continue
            lane = self.model.step_lane(st.component)
            if lane not in self.lane_x:
                continue
            after = max(bisect_left(times, st.time) - 1, 0)
            y1, _ = self._ymap(rows, st.time, after, height)
            y2, _ = self._ymap(rows, end, after, height)
            if y2 - y1 < 3:
                continue
            batch = cast(SchedStep, st.detail).batch
            incs = list(dict.fromkeys(int(b[1]) for b in batch))[:4] or [0]
            w = 12.0 / len(incs)
            x0 = self.lane_x[lane] - 6
            desc = describe(st)
            for j, inc in enumerate(incs):
                colour = self.model.colour_of([inc]) if inc else "#bbbbbb"
                out.append(Bar(x0 + j * w, y1 + 1, y2 - 1, w, colour,
                               f"#{st.seq} t={st.time:.4f}-{end:.4f}s {desc}"))
        return out


def build_diagrams(model: TraceModel, violations: Sequence[Violation], sim_time: float, *,
                   budget: int = 120, max_pages: int = 4) -> list[Diagram]:
    """The pages of a run's swimlane diagram (empty when the trace was not retained)."""
    events = model.events
    if not events:
        return []
    viol: dict[int, list[str]] = {}
    end_viol: list[str] = []
    for v in violations:
        if v.event >= 0:
            viol.setdefault(v.event, [])
            if v.invariant not in viol[v.event]:
                viol[v.event].append(v.invariant)
        elif v.invariant not in end_viol:
            end_viol.append(v.invariant)
    focus_ids = {v.request for v in violations if v.request is not None}
    prio = priorities(events, viol, focus_ids)
    index = {ev.seq: i for i, ev in enumerate(events)}
    page = _Page(model, viol, end_viol, sim_time, focus_ids, prio)
    viol_idx = sorted(index[s] for s in viol if s in index)
    delays = [i for i, ev in enumerate(events) if ev.kind == "delay"]
    fatal = [i for i, ev in enumerate(events) if ev.kind == "engine.fatal"]
    span = race_span(model, violations)
    if not viol_idx or span is None:
        must = set(delays[: budget // 2])
        chosen = select(prio, (0, len(events) - 1), must, budget)
        title = "the whole run" + ("" if violations else " (no violation)")
        return [page.build(title, chosen, None, True)]
    start, first = span
    # Page 1: the race window and as many violations as fit in half the budget.
    room = budget // 2
    must_first = {i for i in delays if start <= i <= first}
    pending = viol_idx + [i for i in fatal if i not in viol]
    pending.sort(key=lambda i: (i < start, abs(i - first)))
    taken = [i for i in pending[: max(room - len(must_first), 1)]]
    chosen = select(prio, (start, first), must_first | set(taken), budget)
    title = ("the race: from the window opening to the first violation"
             + (", and what followed" if chosen and chosen[-1] > first else ""))
    pages = [page.build(title, chosen, (events[start].seq, events[first].seq), True)]
    rest = sorted(set(pending) - set(taken))
    while rest and len(pages) < max_pages:
        chunk, rest = rest[:room], rest[room:]
        names = sorted({n for i in chunk for n in viol.get(events[i].seq, ["engine.fatal"])})
        title = (f"later violations at t={events[chunk[0]].time:.4f}-"
                 f"{events[chunk[-1]].time:.4f}s: {', '.join(names)}")
        pages.append(page.build(clip(title, 160),
                                select(prio, (chunk[0], chunk[-1]), set(chunk), budget),
                                None, False))
    return pages
