"""Terminal rendering with rich: verdicts, violation tables and race timelines."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from racesim.engine_model import SAFETY_INVARIANTS, RunResult
from racesim.engine_model.narrate import KEY_KINDS, describe
from racesim.sim.trace import TraceEvent

__all__ = ["print_run", "timeline_events"]

_LANE_STYLE = {"client": "cyan", "frontend": "green", "P.frontend": "green", "D.frontend": "green",
               "ipc": "dim", "engine": "magenta", "prefill": "magenta", "decode": "blue",
               "proxy": "yellow", "nixl": "dim"}


def _style(component: str) -> str:
    for prefix, style in _LANE_STYLE.items():
        if component.startswith(prefix):
            return style
    return ""


def timeline_events(result: RunResult, *, context: int = 3, limit: int = 48) -> list[TraceEvent]:
    """Key events from where the race window opened (the first injected delay, or a little
    before the first violation) through the last violation, trimmed in the middle if long."""
    marked = _marked(result)
    events = [e for e in result.trace
              if (e.kind in KEY_KINDS and e.kind != "ipc.send") or e.seq in marked
              or (e.kind == "ipc.send" and e.detail.get("type") in ("AbortMessage",
                                                                    "EngineCoreRequest"))]
    if not events:
        return []
    hits = sorted(v.event for v in result.violations if v.event >= 0)
    if not hits:
        return events[-limit:]
    delays = [e.seq for e in events if e.kind == "delay"]
    start_seq = min(delays[0], hits[0]) if delays else hits[0]
    idx_start = next(i for i, e in enumerate(events) if e.seq >= start_seq)
    idx_last = max(i for i, e in enumerate(events) if e.seq <= hits[-1])
    lo = max(0, idx_start - 2 * context)
    hi = min(len(events), idx_last + context + 1)
    chosen = events[lo:hi]
    if len(chosen) > limit:
        chosen = chosen[:limit // 2] + chosen[-limit // 2:]
    return chosen


def _marked(result: RunResult) -> set[int]:
    return {v.event for v in result.violations}


def print_run(console: Console, title: str, result: RunResult, command: str,
              skip: Sequence[str] = ()) -> None:
    verdict = (Text("VIOLATION", style="bold red") if result.violations
               else Text("no violation", style="bold green"))
    console.print(Text.assemble(verdict, f"  {title}  seed={result.seed}  "
                                f"events={result.events}  sim_time={result.sim_time:.4f}s"))
    console.print(f"trace hash {result.trace_hash}")
    if result.schedule:
        console.print("schedule: " + ", ".join(
            f"{d.point}#{d.occurrence}={d.delay:g}s" for d in result.schedule))
    req = Table(title="requests (scenario order)", title_justify="left")
    for col in ("#", "id", "frontend", "tokens", "finish_reason"):
        req.add_column(col)
    for i, r in enumerate(result.requests):
        reason = r.finish_reason or "never finished"
        style = "red" if r.finish_reason in (None, "error") else ""
        req.add_row(str(i), Text(r.id), str(r.frontend), str(r.tokens), Text(reason, style=style))
    console.print(req)
    if result.violations:
        vt = Table(title="violations", title_justify="left")
        for col in ("invariant", "t (s)", "request", "first event", "what broke"):
            vt.add_column(col, overflow="fold")
        for v in result.violations:
            vt.add_row(Text(v.invariant, style="red"), f"{v.time:.4f}",
                       Text(v.request if v.request is not None else "-"),
                       str(v.event) if v.event >= 0 else "end", Text(v.detail))
        console.print(vt)
    events = timeline_events(result)
    if events and result.trace:
        marked = _marked(result)
        tl = Table(title="timeline (key events around the first violation)", title_justify="left")
        for col in ("seq", "t (s)", "component", "inc", "what happened"):
            tl.add_column(col, overflow="fold")
        for e in events:
            text = Text(describe(e))
            if e.seq in marked:
                text.stylize("bold red")
                text.append("   <-- violation", style="bold red")
            elif e.kind in ("delay",):
                text.stylize("bold yellow")
            tl.add_row(str(e.seq), f"{e.time:.4f}", Text(e.component, style=_style(e.component)),
                       str(e.inc) if e.inc else "", text)
        console.print(tl)
    if skip:
        console.print(f"not checked: {', '.join(skip)}")
    console.print(f"reproduce: {command}")


def print_explore(console: Console, doc: dict[str, object], after: RunResult | None,
                  replay: str) -> None:
    """Summary of an exploration, then the shrunk counterexample's timeline."""
    t = Table(title=f"explore {doc['scenario']} under {doc['policy']} ({doc['strategy']})",
              title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", overflow="fold")
    conf = doc["confidence"]
    assert isinstance(conf, dict)
    rows: list[tuple[str, str]] = [
        ("runs", f"{doc['runs']} ({doc['distinct_traces']} distinct traces, "
                 f"{doc['elapsed_s']} s)"),
        ("violating runs", str(doc["violating_runs"])),
        ("first violating run", str(doc["first_violation_run"])),
        ("invariants violated", ", ".join(doc["invariants"]) or "none"),  # type: ignore[arg-type]
        ("violated with no delay", ", ".join(doc["baseline_violations"]) or "none"),  # type: ignore[arg-type]
        ("points perturbed (runs)", ", ".join(f"{p} ({n})" for p, n in
                                             doc["coverage"].items()) or "none"),  # type: ignore[union-attr]
    ]
    pct = doc.get("pct")
    if isinstance(pct, dict):
        rows.append(("PCT", f"n={pct['n']} points, k={pct['k']}, d={pct['d']}: each run finds a "
                            f"depth-{pct['d']} bug with p >= {pct['bound']:.3g}"))
    if conf.get("rule_of_three") is not None:
        rows.append(("confidence", f"no violation in {doc['runs']} runs: failure probability "
                                   f"per run < {conf['rule_of_three']:.3g} at 95 % (rule of three)"
                     + (f"; PCT: a depth-{pct['d']} bug would have been found with probability "
                        f"{conf['pct_confidence']:.3f}" if isinstance(pct, dict)
                        and conf.get("pct_confidence") is not None else "")))
    cx = doc["counterexample"]
    if isinstance(cx, dict):
        sched = ", ".join(f"{d['point']}#{d['occurrence']}={d['delay']:g}s"
                          for d in cx["schedule"]) or "(no delay needed)"
        rows.append(("counterexample", f"{sched}  [shrunk from {cx['shrunk_from']} delays, "
                                       f"{cx['requests']} request(s)]"))
        rows.append(("written to", str(cx["path"])))
    for what, value in rows:
        t.add_row(what, Text(value))
    console.print(t)
    if after is not None:
        print_run(console, f"counterexample of {doc['scenario']} under {doc['policy']}", after,
                  replay)


def print_matrix(console: Console, doc: dict[str, object]) -> None:
    scenarios = doc["scenarios"]
    policies = doc["policies"]
    cells = {(c["scenario"], c["policy"]): c for c in doc["cells"]}  # type: ignore[union-attr]
    t = Table(title="policy x scenario (violating runs / runs; invariants)", title_justify="left")
    t.add_column("scenario")
    for p in policies:  # type: ignore[union-attr]
        t.add_column(p, overflow="fold")
    for s in scenarios:  # type: ignore[union-attr]
        row: list[Text] = [Text(s)]
        for p in policies:  # type: ignore[union-attr]
            c = cells.get((s, p))
            if c is None:
                row.append(Text("-"))
                continue
            inv = [i for i in c["invariants"]]
            races = [i for i in inv if i in SAFETY_INVARIANTS]
            style = "red" if races else ("yellow" if inv else "green")
            label = "race" if races else ("metrics only" if inv else "safe")
            row.append(Text(f"{label} {c['violating_runs']}/{c['runs']}\n"
                            + (", ".join(inv) if inv else ""), style=style))
        t.add_row(*row)
    console.print(t)
