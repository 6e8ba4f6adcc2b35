"""Which events a diagram page shows: the race window, the violations and what led to them.

Pure selection over trace indices; the layout lives in :mod:`racesim.reports.swimlane`.
"""

from __future__ import annotations

from collections.abc import Sequence

from racesim.engine_model.checker import Violation
from racesim.engine_model.events import Delay, EngineFatalEvent, FeAbortIssue, IpcSend
from racesim.engine_model.narrate import KEY_KINDS
from racesim.reports.model import TraceModel
from racesim.sim.trace import TraceEvent

__all__ = ["MUST", "FOCUS", "KEY", "FILLER", "BOOKKEEPING", "priorities", "select", "race_span"]

#: Priorities, lower first: violations, delays and deaths; key events of the violated request
#: IDs; other key events; repeated output messages; bookkeeping (never shown on its own).
MUST, FOCUS, KEY, FILLER, BOOKKEEPING = 0, 1, 2, 3, 9


def _ids_of(ev: TraceEvent) -> set[str]:
    d = ev.detail
    ids = set(d.ids) if isinstance(d, (IpcSend, FeAbortIssue)) else set()
    if ev.request is not None:
        ids.add(ev.request)
    return ids


def priorities(events: Sequence[TraceEvent], viol: dict[int, list[str]],
                focus_ids: set[str]) -> list[int]:
    """How much each event matters to the picture (lower first).

    Output messages that repeat the previous one on their socket (same requests, same
    incarnations: the steady state of a decode) are fillers, shown only when there is room.
    """
    out = []
    last_outputs: dict[str, tuple[object, object]] = {}
    for ev in events:
        d = ev.detail
        if ev.seq in viol or isinstance(d, (Delay, EngineFatalEvent)):
            out.append(MUST)
        elif ev.kind not in KEY_KINDS:
            out.append(BOOKKEEPING)
        elif isinstance(d, IpcSend) and d.type == "EngineCoreOutputs":
            sig = (tuple(d.ids), tuple(tuple(o[:2]) for o in d.outputs or ()))
            same = last_outputs.get(ev.component) == sig
            last_outputs[ev.component] = sig
            out.append(FILLER if same else FOCUS if _ids_of(ev) & focus_ids else KEY)
        else:
            out.append(FOCUS if _ids_of(ev) & focus_ids else KEY)
    return out


def select(prio: list[int], span: tuple[int, int], must: set[int], budget: int) -> list[int]:
    """Indices of the events to show for a page about ``span`` (index range) and ``must``.

    Must-show events first, then the window's own events, then context nearest first (key
    events of the violated IDs weigh double); at most a quarter of the page is lead-in before
    the window, so the race stays near the top of the page.
    """
    lo, hi = span

    def key(i: int) -> tuple[int, float, int, int]:
        if i in must:
            return (0, 0.0, 0, i)
        p = FOCUS if prio[i] == MUST else prio[i]  # a violation or delay of another page
        outside = lo - i if i < lo else (i - hi) * 1.5 if i > hi else 0
        return (1, outside * {FOCUS: 1.0, KEY: 2.0}.get(p, 4.0), p, abs(hi - i))

    cands = [i for i, p in enumerate(prio) if p <= FILLER or i in must]
    cands.sort(key=key)
    chosen: list[int] = []
    lead_in = budget // 4
    for i in cands:
        if len(chosen) >= budget:
            break
        if i < lo and i not in must:
            if lead_in <= 0:
                continue
            lead_in -= 1
        chosen.append(i)
    return sorted(chosen)


def race_span(model: TraceModel, violations: Sequence[Violation]) -> tuple[int, int] | None:
    """(opening event, first violating event) as indices into the trace, or None.

    The window opens at the last injected delay before the first violation that held up the
    violated request ID, else at the first injected delay; with no delay at all, at the first
    event of the violating incarnation (else the event just before the violation).
    """
    index = {ev.seq: i for i, ev in enumerate(model.events)}
    firsts = [v for v in violations if v.event in index]
    if not firsts:
        return None
    first_v = min(firsts, key=lambda v: v.event)
    first = index[first_v.event]
    delays = [i for i in range(first + 1) if model.events[i].kind == Delay.KIND]
    owned = [i for i in delays
             if model.delay_owner.get(model.events[i].seq, ("",))[0] == first_v.request]
    if owned:
        return owned[-1], first
    if delays:
        return delays[0], first
    # No injected delay: the race is in the workload itself (two API servers, say); it opens
    # with the first event of the incarnation the violating event is about.
    incs = set(model.incs_of(model.events[first]))
    start = next((i for i in range(first) if incs & set(model.incs_of(model.events[i]))), None)
    return (start if start is not None else max(first - 1, 0)), first


