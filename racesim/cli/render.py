"""Terminal rendering with rich: verdicts, violation tables and race timelines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from racesim.engine_model import RunResult
from racesim.engine_model.events import IpcSend
from racesim.engine_model.narrate import KEY_KINDS, describe
from racesim.engine_model.topology import Topology
from racesim.reports.focus import race_span
from racesim.reports.model import TraceModel, reader_numbers, relabel_incs
from racesim.reports.text import printable
from racesim.reports.verdict import ACCOUNTING, RACE, verdict
from racesim.sim.trace import TraceEvent

__all__ = ["print_run", "print_components", "reached_rows", "timeline_events", "print_matrix",
           "matrix_summary"]

#: Component styles by kind (engines: by P/D role).
_KIND_STYLE = {"client": "cyan", "frontend": "green", "channel": "dim", "proxy": "yellow"}


def _style(topology: Topology | None, component: str) -> str:
    c = topology.component(component) if topology is not None else None
    if c is None:
        return ""
    if c.kind == "engine":
        return "blue" if c.role == "decode" else "magenta"
    return _KIND_STYLE.get(c.kind, "")


def timeline_events(result: RunResult, *, context: int = 3, limit: int = 48) -> list[TraceEvent]:
    """Key events from where the race window opened (:func:`racesim.reports.focus.race_span`,
    the rule the HTML report uses) through the last violation, trimmed in the middle if long."""
    marked = _marked(result)
    events = [e for e in result.trace
              if (e.kind in KEY_KINDS and e.kind != IpcSend.KIND) or e.seq in marked
              or (isinstance(e.detail, IpcSend) and e.detail.type in ("AbortMessage",
                                                                      "EngineCoreRequest"))]
    if not events:
        return []
    hits = sorted(v.event for v in result.violations if v.event >= 0)
    if not hits:
        return events[-limit:]
    span = None
    if result.topology is not None:
        span = race_span(TraceModel(result.trace, result.topology), result.violations)
    start_seq = result.trace[span[0]].seq if span is not None else hits[0]
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


_VERDICT_TEXT = {RACE: ("RACE", "bold red"), ACCOUNTING: ("ACCOUNTING ONLY", "bold yellow")}


def _verdict_text(invariants: Sequence[str]) -> Text:
    label, style = _VERDICT_TEXT.get(verdict(invariants), ("no violation", "bold green"))
    return Text(label, style=style)


def print_command(console: Console, label: str, command: str) -> None:
    """A command to copy: one line, never wrapped, whatever the terminal's width."""
    console.print(Text(f"{label}: {printable(command)}"), soft_wrap=True)


def print_components(console: Console, result: RunResult) -> None:
    """One line: which components of the run were vLLM's own code, which simulated."""
    from racesim.documents import run_provenance

    p = run_provenance(result)
    if not p["vllm_code"]:
        console.print(Text("every component is racesim's model of vLLM (--engine model)",
                           style="dim"))
        return
    console.print(Text(f"vLLM's own code: {', '.join(p['vllm_code'])}; simulated: "
                       + ", ".join(sorted(set(p["simulated"].values())))
                       + (f"; vLLM code fingerprint {p['vllm_fingerprint'][:16]}"
                          if p["vllm_fingerprint"] else ""), style="dim"))


def print_run(console: Console, title: str, result: RunResult, command: str,
              skip: Sequence[str] = ()) -> None:
    console.print(Text.assemble(_verdict_text(result.violated),
                                f"  {printable(title)}  vLLM {result.vllm}  seed={result.seed}  "
                                f"events={result.events}  sim_time={result.sim_time:.4f}s"))
    console.print(Text(f"trace hash {result.trace_hash}"),
                  Text(" (simulated events' SHA-256: same schedule, same hash; not a "
                       "fingerprint of vLLM's code)", style="dim"))
    print_components(console, result)
    if verdict(result.violated) == RACE:
        reach = result.reach()
        console.print(Text(result.reach_text(),
                           style="bold red" if reach.reach == "live" else "bold yellow"))
    elif result.unverified:
        console.print(Text(result.unverified, style="yellow"))
    if result.schedule:
        console.print("schedule: " + ", ".join(
            f"{d.point}#{d.occurrence}={d.delay:g}s" for d in result.schedule))
    req = Table(title="requests (scenario order)", title_justify="left")
    for col in ("#", "id", "frontend", "tokens", "finish_reason"):
        req.add_column(col)
    for i, r in enumerate(result.requests):
        reason = r.finish_reason or "never finished"
        style = "red" if r.finish_reason in (None, "error") else ""
        req.add_row(str(i), Text(printable(r.id)), str(r.frontend), str(r.tokens),
                    Text(reason, style=style))
    console.print(req)
    # incarnations as the HTML report numbers them (1, 2, 3 in order of appearance)
    numbers = reader_numbers(result.trace) if result.trace else {}
    if result.violations:
        vt = Table(title="violations", title_justify="left")
        vt.add_column("invariant", no_wrap=True)
        vt.add_column("reach", no_wrap=True)
        vt.add_column("t (s)", no_wrap=True)
        vt.add_column("request", overflow="fold", max_width=16)
        vt.add_column("event", no_wrap=True)
        vt.add_column("what broke", overflow="fold", ratio=1)
        for v in result.violations:
            vt.add_row(Text(v.invariant, style="red" if verdict([v.invariant]) == RACE
                            else "yellow"), result.reach(v).reach, f"{v.time:.4f}",
                       Text(printable(v.request) if v.request is not None else "-"),
                       str(v.event) if v.event >= 0 else "end",
                       Text(printable(relabel_incs(v.detail, numbers))))
        console.print(vt)
        from racesim.documents import violation_dicts

        for d in dict.fromkeys((d["invariant"], d["provenance"]["text"])
                               for d in violation_dicts(result)):
            console.print(Text(f"decided by ({d[0]}): {printable(d[1])}", style="dim"))
    events = timeline_events(result)
    if events and result.trace:
        marked = _marked(result)
        tl = Table(title="timeline (key events around the first violation)", title_justify="left")
        for col in ("seq", "t (s)", "component", "inc"):
            tl.add_column(col, no_wrap=col != "component", overflow="fold")
        tl.add_column("what happened", overflow="fold", ratio=1)
        for e in events:
            text = Text(printable(relabel_incs(describe(e), numbers)))
            if e.seq in marked:
                text.stylize("bold red")
                text.append("   <-- violation", style="bold red")
            elif e.kind in ("delay",):
                text.stylize("bold yellow")
            tl.add_row(str(e.seq), f"{e.time:.4f}",
                       Text(printable(e.component), style=_style(result.topology, e.component)),
                       str(numbers.get(e.inc, e.inc)) if e.inc else "", text)
        console.print(tl)
    if skip:
        console.print(f"not checked: {', '.join(skip)}")
    print_command(console, "reproduce", command)


def reached_rows(reached: dict[str, Any]) -> list[tuple[str, str]]:
    """What a search reached, as rows: points never delayed, windows, invariants."""
    if not reached:
        return []
    rows = [("never delayed", ", ".join(reached["never_delayed"]) or "none (every point passed "
                                                                      "was delayed)")]
    if reached.get("not_delayable"):
        rows.append(("not delayed (latent)", ", ".join(reached["not_delayable"])))
    rows += [("windows opened", f"{reached['windows_opened']} (point, occurrence) passes held "
                                f"open by a delay; the unperturbed run makes "
                                f"{reached['windows_available']} delayable passes"),
             ("invariants evaluated", ", ".join(reached["invariants_evaluated"]) or "none"),
             ("never evaluated", ", ".join(reached["invariants_never_evaluated"]) or "none")]
    return rows


def _explore_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    runs, violating = doc["runs"], doc["violating_runs"]
    baseline = list(doc["baseline_violations"])
    first = doc["first_violation_run"]
    rows: list[tuple[str, str]] = [
        ("runs", f"{runs} ({doc['distinct_traces']} distinct traces, {doc['elapsed_s']} s)"),
        ("violating runs", f"{violating} of {runs}" + (
            f": {doc['racing_runs']} racing, {doc['accounting_runs']} accounting only"
            if violating else "") + (
            f" (the unperturbed run 0 already violates {', '.join(baseline)})"
            if baseline else "")),
        ("first run violating more than run 0" if baseline else "first violating run",
         "none" if first is None else str(first)),
        ("invariants violated", ", ".join(doc["invariants"]) or "none"),
        ("verdict", doc.get("finding") or verdict(doc["invariants"])),
        ("points perturbed (runs)", ", ".join(f"{p} ({n})" for p, n in
                                             doc["coverage"].items()) or "none"),
        *reached_rows(doc.get("reached") or {}),
    ]
    pct, conf = doc.get("pct"), doc["confidence"]
    if isinstance(pct, dict):
        rows.append(("PCT", f"n={pct['n']} points, k={pct['k']}, d={pct['d']}: each run finds a "
                            f"depth-{pct['d']} bug with p >= {pct['bound']:.3g}"))
    if conf.get("rule_of_three") is not None:
        rows.append(("confidence", f"no violation in {runs} runs: failure probability "
                                   f"per run < {conf['rule_of_three']:.3g} at 95 % (rule of three)"
                     + (f"; PCT: a depth-{pct['d']} bug would have been found with probability "
                        f"{conf['pct_confidence']:.3f}" if isinstance(pct, dict)
                        and conf.get("pct_confidence") is not None else "")))
    cx = doc["counterexample"]
    if isinstance(cx, dict):
        sched = ", ".join(f"{d['point']}#{d['occurrence']}={d['delay']:g}s"
                          for d in cx["schedule"]) or "(no delay needed)"
        how = (f"shrunk from {cx['shrunk_from']} delays, {cx['requests']} request(s)"
               if cx.get("shrunk") else "NOT shrunk: interrupted before shrinking")
        standing = verdict(baseline) == RACE and first not in (None, 0)
        rows.append(("counterexample beyond run 0" if standing else "counterexample",
                     f"{sched}  [{how}]"))
        if cx.get("reach") and verdict(doc["invariants"]) == RACE:
            beyond = ("live race (vLLM as released)" if cx["reach"] == "live"
                      else "latent hazard (needs a delay where vLLM never yields)")
            # run 0 racing is the finding itself (no schedule at all); the counterexample
            # only shows what a delay adds to it, so its reach must not read as the verdict's
            rows.append(("reach", f"{_baseline_reach(doc, baseline)}; beyond it, {beyond}"
                         if standing else beyond))
    else:
        rows.append(("counterexample", "none"))
    if doc.get("interrupted"):
        rows.append(("interrupted", "yes: these figures cover the runs made before Ctrl-C"))
    if doc.get("stopped_early"):
        rows.append(("stopped early", doc["stopped_early"]))
    return rows


def _baseline_reach(doc: dict[str, Any], baseline: list[str]) -> str:
    racing = [i for i in baseline if verdict([i]) == RACE]
    how = ("live race (vLLM as released)" if doc.get("baseline_reach", "live") == "live"
           else "latent hazard (the scenario's own [delays])")
    return f"run 0, with no perturbation, violates {', '.join(racing)}: {how}"


def print_explore(console: Console, doc: dict[str, Any], after: RunResult | None,
                  replay: str) -> None:
    """Summary of an exploration, then the shrunk counterexample's timeline."""
    t = Table(title=printable(f"explore {doc['scenario']} under {doc['policy']} "
                              f"({doc['strategy']}, vLLM {doc['vllm']}, {doc['search']} points)"),
              title_justify="left", show_header=False)
    t.add_column("what", no_wrap=True)
    t.add_column("value", overflow="fold", ratio=1)
    for what, value in _explore_rows(doc):
        t.add_row(what, Text(printable(value)))
    console.print(t)
    cx = doc["counterexample"]
    if isinstance(cx, dict) and cx.get("path"):
        print_command(console, "written to", str(cx["path"]))
    if after is not None:
        print_run(console, f"counterexample of {doc['scenario']} under {doc['policy']}", after,
                  replay)
    elif replay:
        print_command(console, "replay", replay)


_CELL_STYLE = {RACE: "red", ACCOUNTING: "yellow"}


def print_matrix(console: Console, doc: dict[str, Any]) -> None:
    """Each of the matrix's tables (the shipped configuration first), then its footnotes."""
    groups = doc.get("tables") or [{"title": "", "policies": doc["policies"]}]
    for g in groups:
        if len(groups) > 1 or g["title"] not in ("", "Results"):
            console.print(Text(printable(g["title"]), style="bold underline"))
        _print_matrix_table(console, doc, list(g["policies"]))
        summary = matrix_summary({"cells": [c for c in doc["cells"]
                                            if c["policy"] in g["policies"]]})
        console.print(Text(summary, style="dim"))
    params = doc.get("parameters") or {}
    if params:
        console.print(Text(printable(", ".join(f"{k} {v}" for k, v in params.items()
                                               if v not in (None, [])))), style="dim")
    console.print("Each cell answers: does any explored schedule race? (the README's findings "
                  "table answers: what do the unperturbed run and the witness show?)", style="dim")
    console.print("race: a safety or liveness invariant broke; accounting: only metrics-exact "
                  "(a stats gap vLLM still has); not found in N runs: nothing broke in the runs "
                  "explored (safe only when a grid tried every schedule). racing/runs: runs that "
                  "raced; +N acct.: runs with only an accounting gap.", style="dim")
    notes = dict.fromkeys(c["unverified"] for c in doc["cells"] if c.get("unverified"))
    for note in notes:
        console.print(Text(f"(unverified): {note}", style="yellow"))


def _print_matrix_table(console: Console, doc: dict[str, Any], policies: list[str]) -> None:
    """One line per cell under its scenario, readable at 80 columns: every name stays whole,
    and the invariants wrap between names (a table column as wide as the longest scenario
    name would leave the invariants a few characters, cut inside names). With one policy,
    one line per scenario."""
    cells = {(c["scenario"], c["policy"]): c for c in doc["cells"]}
    single = len(policies) == 1
    rows: dict[str, list[tuple[Text, Text, str, Text]]] = {}
    for s in doc["scenarios"]:
        rows[s] = []
        for p in policies:
            c = cells.get((s, p))
            name = Text(printable(s) if single else "  " + printable(p))
            if c is None:
                rows[s].append((name, Text("not run", style="dim"), "", Text("")))
            elif c.get("error"):
                rows[s].append((name, Text("error", style="bold red"), "",
                                Text(printable(c["error"]))))
            else:
                v = verdict(c["invariants"])
                style = ("magenta" if (c.get("label") or "").startswith("latent hazard")
                         else _CELL_STYLE.get(v, "green"))
                if c.get("ids") and not single:
                    name.append(f" (ids {c['ids']})", style="dim")
                rows[s].append((name, Text(c.get("label") or v, style=style),
                                _runs_text(c),
                                Text(", ".join(c["invariants"]))))
    every = [r for rs in rows.values() for r in rs]
    first = "scenario" if single else "  policy"
    widths = [max([len(first), *(len(r[0]) for r in every)]),
              max([len("verdict"), *(len(r[1]) for r in every)]),
              max([len("racing/runs"), *(len(line) for r in every for line in r[2].split("\n"))])]

    def table(header: bool) -> Table:
        t = Table(box=None, show_header=header, header_style="bold", pad_edge=False,
                  padding=(0, 2, 0, 0))
        for title, width in zip((first, "verdict", "racing/runs"), widths, strict=True):
            t.add_column(title, width=width, no_wrap=True,
                         justify="right" if title.startswith("racing") else "left")
        t.add_column("invariants violated", ratio=1, overflow="fold")
        return t

    if single:
        t = table(True)
        for s in doc["scenarios"]:
            for row in rows[s]:
                t.add_row(*row)
        console.print(t)
        return
    console.print(table(True))  # the header once; each scenario's name heads its own rows
    for s in doc["scenarios"]:
        console.print(Text(printable(s), style="bold"))
        t = table(False)
        for row in rows[s]:
            t.add_row(*row)
        console.print(t)



def _runs_text(cell: dict[str, Any]) -> str:
    """``racing/runs``, and the accounting-only runs under it: a run that only missed a stats
    count is not a race, so it is never added to the racing runs."""
    racing = cell.get("racing_runs", cell["violating_runs"])
    accounting = cell.get("accounting_runs", 0)
    return f"{racing}/{cell['runs']}" + (f"\n+{accounting} acct." if accounting else "")


def matrix_summary(doc: dict[str, Any]) -> str:
    """The matrix's last word: how many cells race (live, latent), have only an accounting
    gap, are safe, or could not run."""
    labels = [("error" if c.get("error") else
               (c.get("label") or verdict(c["invariants"])).removesuffix(" (unverified)"))
              for c in doc["cells"]]
    live, latent = labels.count("live race"), labels.count("latent hazard")
    parts = [f"{live + latent} racing ({live} live, {latent} latent hazard"
             f"{'' if latent == 1 else 's'})",
             f"{labels.count('accounting gap')} accounting gap only",
             f"{sum(x.startswith('not found') for x in labels)} not found"]
    if safe := sum(x.startswith("safe") for x in labels):
        parts.append(f"{safe} safe (exhaustive grid)")
    if labels.count("error"):
        parts.append(f"{labels.count('error')} failed to run")
    return f"cells: {', '.join(parts)} (of {len(labels)})"
