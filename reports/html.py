"""Render run, explore and matrix reports: one self-contained HTML file each.

Every template is loaded from the package with autoescaping forced on, so request IDs (user
input) reach the page, SVG text included, only as escaped text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from racesim.engine_model.checker import INVARIANTS, SAFETY_INVARIANTS
from racesim.engine_model.events import Delay
from racesim.engine_model.narrate import describe
from racesim.engine_model.points import POINTS
from racesim.engine_model.policies import POLICIES
from racesim.engine_model.system import RunResult
from racesim.reports._io import write_text
from racesim.reports.commands import replay_command
from racesim.reports.model import TraceModel, reader_numbers, relabel_incs, topology_of
from racesim.reports.overview import build_overview
from racesim.reports.swimlane import (
    ARROW_COLOURS,
    LINE_H,
    VIOLATION_RED,
    build_diagrams,
    race_span,
)
from racesim.reports.text import printable
from racesim.reports.verdict import RACE, verdict

__all__ = ["render_run_report", "write_run_report", "render_explore_report",
           "write_explore_report", "render_matrix_report", "write_matrix_report",
           "environment"]

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
LOG_PAGE = 250
LOG_MAX_PAGES = 8

_env: Environment | None = None


def environment() -> Environment:
    """The one Jinja2 environment: package templates, autoescape on for every template."""
    global _env
    if _env is None:
        _env = Environment(loader=PackageLoader("racesim.reports"), autoescape=True,
                           undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                           keep_trailing_newline=True, finalize=_finalize)
        _env.globals.update(CSP=CSP, ARROW_COLOURS=ARROW_COLOURS, RED=VIOLATION_RED,
                            LINE_H=LINE_H)
        _env.filters["secs"] = _secs
        _env.filters["num"] = _num
    return _env


def _finalize(value: Any) -> Any:
    """Every printed string: control characters escaped (a raw NUL or ESC never reaches the
    page), before autoescaping."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return printable(value, keep_newlines=True)
    return value


def _secs(value: Any) -> str:
    return "-" if value is None else f"{float(value):.4f}"


def _num(value: Any, digits: int = 1) -> str:
    """A coordinate for SVG: short, fixed, locale-free."""
    v = round(float(value), digits)
    return str(int(v)) if v == int(v) else f"{v:.{digits}f}"


# -- run reports --------------------------------------------------------------------------------

def _point_meaning(name: str) -> str:
    return POINTS.get(name).meaning if name in POINTS else ""


def _schedule_rows(result: RunResult) -> list[dict[str, Any]]:
    defaults = {(e.detail.point, e.detail.occurrence): e.detail.default
                for e in result.trace if isinstance(e.detail, Delay)}
    return [{"point": d.point, "occurrence": d.occurrence, "delay": d.delay,
             "default": defaults.get((d.point, d.occurrence)),
             "meaning": _point_meaning(d.point)} for d in result.schedule]


def _log_pages(result: RunResult, model: TraceModel, keep: set[int],
               viol: Mapping[int, list[str]]) -> tuple[list[dict[str, Any]], int]:
    """The full event log in pages; when long, only pages near the diagrams (and the first)."""
    events = result.trace
    n_pages = math.ceil(len(events) / LOG_PAGE)
    wanted = set(range(n_pages)) if n_pages <= LOG_MAX_PAGES else (
        {0} | {s // LOG_PAGE for s in sorted(keep)})
    pages: list[dict[str, Any]] = []
    omitted = 0
    for p in range(n_pages):
        chunk = events[p * LOG_PAGE:(p + 1) * LOG_PAGE]
        if p not in wanted or len(pages) >= LOG_MAX_PAGES:
            omitted += len(chunk)
            continue
        rows = [{"seq": e.seq, "time": e.time, "component": e.component, "kind": e.kind,
                 "request": e.request, "inc": model.number(e.inc) if e.inc else 0,
                 "colour": model.colour_of(model.incs_of(e)),
                 "text": model.relabel(describe(e)),  # the log's cell wraps it
                 "violations": viol.get(e.seq, [])} for e in chunk]
        pages.append({"first": chunk[0].seq, "last": chunk[-1].seq, "rows": rows,
                      "open": False})
    return pages, omitted


def _policy_summary(policy: str) -> str:
    """A policy's ``name`` (when not the spec itself) and ``summary``, for the header."""
    from racesim.engine_model.policies import policy_spec
    from racesim.sim import InputError

    try:
        cls = policy_spec(policy)
    except InputError:
        return ""
    return (f"({cls.name}) " if cls.name != policy else "") + cls.summary


def _caption(model: TraceModel, event: Any) -> str:
    """An event as its diagram row reads: "X #1: ◆ await point ..."."""
    incs = model.incs_of(event)
    label = ", ".join(model.incarnations[i].label for i in incs[:2] if i in model.incarnations)
    mark = "◆ " if event.kind == "delay" else ""
    return (f"{label}: " if label else "") + mark + model.relabel(describe(event))


def _row_anchor(diagrams: Sequence[Any], seq: int, prefix: str = "d") -> str:
    """Where event ``seq`` is shown: its diagram row (the first page that has it), else its
    row of the event log."""
    for n, d in enumerate(diagrams, 1):
        if seq in d.seqs:
            return f"{prefix}{n}-e{seq}"
    return f"log-e{seq}"


def _opener_text(model: TraceModel, opener: Any) -> str:
    if opener is None:
        return ""
    text = _caption(model, opener)
    owner = model.delay_owner.get(opener.seq)
    if owner is not None:
        incs = ", ".join(model.incarnations[i].label for i in owner[1] if i in model.incarnations)
        text += f", holding up {owner[0]!r}" + (f" ({incs})" if incs else "")
    return text


def _run_context(scenario: Any, policy: str, options: Mapping[str, str], result: RunResult,
                 command: str, budget: int = 80) -> dict[str, Any]:
    model = TraceModel(result.trace, topology_of(result))
    diagrams = build_diagrams(model, result.violations, result.sim_time, budget=budget)
    by_seq = {e.seq: e for e in result.trace}
    viol: dict[int, list[str]] = {}
    for v in result.violations:
        viol.setdefault(v.event, []).append(v.invariant)
    from racesim.reports.provenance import run_components, violation_provenance

    violations = [{"invariant": v.invariant, "time": v.time, "request": v.request,
                   "event": v.event, "detail": model.relabel(v.detail),
                   "provenance": violation_provenance(result, v.as_dict()),
                   "meaning": INVARIANTS.get(v.invariant, ""), "where": v.where,
                   "what": (f"{by_seq[v.event].component}: "
                            f"{model.relabel(describe(by_seq[v.event]))}"
                            if v.event in by_seq else "end-of-run check")}
                  for v in result.violations]
    first = min((v for v in result.violations if v.event in by_seq), key=lambda v: v.event,
                default=None)
    span = race_span(model, result.violations)
    opener = model.events[span[0]] if span else None
    race = (opener.time, first.time) if opener is not None and first is not None else None
    keep: set[int] = set()
    for d in diagrams:
        keep |= set(d.seqs)
    log_pages, log_omitted = _log_pages(result, model, keep, viol)
    requests = []
    for i, r in enumerate(result.requests):
        incs = [inc.label for inc in model.incarnations.values() if inc.client == f"client{i}"]
        requests.append({"index": i, "id": r.id, "frontend": r.frontend, "tokens": r.tokens,
                         "finish_reason": r.finish_reason, "client": f"client{i}",
                         "incarnations": ", ".join(incs),
                         "colour": model.colour_of(
                             [inc.inc for inc in model.incarnations.values()
                              if inc.client == f"client{i}"][:1])})
    return {
        "scenario": scenario, "policy": policy, "options": dict(options), "result": result,
        "command": command, "violated": [(n, INVARIANTS.get(n, "")) for n in result.violated],
        "violations": violations, "first": first, "verdict": verdict(result.violated),
        "vllm": result.vllm, "engine": result.engine, "components": run_components(result),
        "reach": (result.reach_text() if verdict(result.violated) == RACE
                  else result.unverified),
        "policy_summary": _policy_summary(policy),
        "first_what": violations[result.violations.index(first)]["what"] if first else "",
        "first_detail": model.relabel(first.detail) if first else "",
        "opener": opener, "opener_text": _opener_text(model, opener),
        "opener_anchor": _row_anchor(diagrams, opener.seq) if opener is not None else "",
        "first_anchor": _row_anchor(diagrams, first.event) if first is not None else "",
        "diagrams": diagrams, "overview": (build_overview(model, result.violations,
                                                          result.sim_time, diagrams, race)
                                           if result.trace else None),
        "schedule": _schedule_rows(result), "requests": requests, "log_pages": log_pages,
        "log_omitted": log_omitted, "incarnations": list(model.incarnations.values()),
    }


def render_run_report(scenario: Any, policy: str, options: Mapping[str, str],
                      result: RunResult, command: str, *, title: str | None = None,
                      back: str | None = None) -> str:
    """The HTML race report of one run (``racesim run/replay --html``); ``back`` links the
    page it was reached from (a matrix cell)."""
    ctx = _run_context(scenario, policy, options, result, command)
    ctx["back"] = _safe_href(back)
    return environment().get_template("run.j2").render(
        title=title or f"{scenario.name} under {policy}", run=ctx)


def write_run_report(path: Path, scenario: Any, policy: str, options: Mapping[str, str],
                     result: RunResult, command: str, *, back: str | None = None) -> Path:
    return write_text(path, render_run_report(scenario, policy, options, result, command,
                                              back=back))


def cell_anchor(scenario: str, policy: str) -> str:
    """The id of a matrix cell, for links to it (letters, digits, ``_.-`` only)."""
    return "cell-" + re.sub(r"[^A-Za-z0-9_.-]", "_", f"{scenario}__{policy}")


# -- explore and matrix reports -----------------------------------------------------------------

def _scenario_name(doc: Mapping[str, Any], scenario: Any) -> str:
    if scenario is not None and hasattr(scenario, "name"):
        return str(scenario.name)
    s = doc.get("scenario")
    return str(s.get("name", "?")) if isinstance(s, Mapping) else str(s)


def _run_panel(label: str, scenario: Any, doc: Mapping[str, Any],
               result: RunResult | None, command: str) -> dict[str, Any] | None:
    if result is None:
        return None
    ctx = _run_context(scenario, str(doc.get("policy", result.policy)),
                       dict(doc.get("policy_options") or {}), result, command, budget=70)
    ctx["label"] = label
    ctx["diagrams"] = ctx["diagrams"][:1]
    return ctx


def render_explore_report(doc: Mapping[str, Any], scenario: Any, before: RunResult | None,
                          after: RunResult | None) -> str:
    """The HTML report of ``racesim explore``: figures, coverage, the shrunk counterexample."""
    cx = doc.get("counterexample") or None
    if cx and after is not None:  # its violations in the numbers the swimlanes below use
        numbers = reader_numbers(after.trace)
        cx = {**cx, "violations": [
            {**v, "detail": relabel_incs(str(v.get("detail", "")), numbers)}
            if isinstance(v, Mapping) else v for v in cx.get("violations") or []]}
    replay = ""
    if cx and cx.get("path"):
        replay = replay_command(str(cx["path"]))
    coverage = sorted((doc.get("coverage") or {}).items(), key=lambda kv: (-kv[1], kv[0]))
    runs = int(doc.get("runs") or 0)
    ctx = {
        "title": f"explore {_scenario_name(doc, scenario)} under {doc.get('policy', '?')}",
        "doc": doc, "scenario_name": _scenario_name(doc, scenario),
        "summary": getattr(scenario, "summary", ""), "cx": cx, "replay": replay,
        "coverage": [(p, n, _point_meaning(p), (n / runs if runs else 0.0)) for p, n in coverage],
        "confidence": dict(doc.get("confidence") or {}), "pct": doc.get("pct"),
        "panels": [p for p in (_run_panel("after shrinking", scenario, doc, after, replay),
                               _run_panel("before shrinking", scenario, doc, before, replay))
                   if p is not None],
    }
    return environment().get_template("explore.j2").render(ctx)


def write_explore_report(path: Path, doc: Mapping[str, Any], scenario: Any,
                         before: RunResult | None, after: RunResult | None) -> Path:
    return write_text(path, render_explore_report(doc, scenario, before, after))


def _safe_href(href: str | None) -> str | None:
    """A relative link only: no scheme (``javascript:``), no protocol-relative ``//host``."""
    if not href:
        return None
    text = str(href).strip()
    head = text.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if ":" in head or text.startswith("//") or text.startswith("\\"):
        return None
    return text


def render_matrix_report(doc: Mapping[str, Any], links: Mapping[tuple[str, str], str],
                         files: Mapping[tuple[str, str], str] | None = None) -> str:
    """The HTML policy-by-scenario table of ``racesim matrix``; failing cells link their report
    (``links``) and their counterexample file (``files``: hrefs relative to the report)."""
    files = files or {}
    cells = {(c["scenario"], c["policy"]): c for c in doc.get("cells", [])}
    scenarios: Sequence[str] = doc.get("scenarios") or sorted({s for s, _ in cells})
    policies: Sequence[str] = doc.get("policies") or sorted({p for _, p in cells})
    def cell_of(s: str, p: str) -> dict[str, Any] | None:
        c = cells.get((s, p))
        if c is None:
            return None
        invariants = list(c.get("invariants") or [])
        return {
            "runs": c.get("runs", 0), "violating": c.get("violating_runs", 0),
            "racing": c.get("racing_runs", c.get("violating_runs", 0)),
            "accounting": c.get("accounting_runs", 0),
            "invariants": invariants, "verdict": verdict(invariants),
            "label": c.get("label") or verdict(invariants), "vllm": c.get("vllm"),
            "error": c.get("error"), "safety": [i in SAFETY_INVARIANTS for i in invariants],
            "unverified": c.get("unverified"), "ids": c.get("ids"),
            "never_evaluated": (c.get("reached") or {}).get("invariants_never_evaluated"),
            "never_delayed": (c.get("reached") or {}).get("never_delayed"),
            "href": _safe_href(links.get((s, p))), "cx": c.get("counterexample"),
            "cx_href": _safe_href(files.get((s, p))), "anchor": cell_anchor(s, p)}

    # the shipped configuration's table first (doc["tables"]), then the other configurations
    groups = doc.get("tables") or [{"title": "Results", "policies": list(policies)}]
    sections = [{"title": g["title"], "policies": list(g["policies"]),
                 "table": [(s, [cell_of(s, p) for p in g["policies"]]) for s in scenarios]}
                for g in groups]
    table = [(s, [cell_of(s, p) for p in policies]) for s in scenarios]
    failing = sum(1 for c in cells.values() if verdict(c.get("invariants") or []) == RACE)
    summaries = {p: POLICIES[p].summary if p in POLICIES else _policy_summary(p)
                 for p in policies}
    seen = {i for c in cells.values() for i in c.get("invariants") or []}
    legend = [(n, m, n in SAFETY_INVARIANTS) for n, m in INVARIANTS.items() if n in seen]
    ctx = {"title": "racesim matrix", "policies": policies, "table": table, "sections": sections,
           "failing": failing, "total": len(cells), "doc": doc, "summaries": summaries,
           "parameters": dict(doc.get("parameters") or {}), "legend": legend,
           "notes": list(dict.fromkeys(c["unverified"] for c in cells.values()
                                       if c.get("unverified")))}
    return environment().get_template("matrix.j2").render(ctx)


def write_matrix_report(path: Path, doc: Mapping[str, Any],
                        links: Mapping[tuple[str, str], str],
                        files: Mapping[tuple[str, str], str] | None = None) -> Path:
    return write_text(path, render_matrix_report(doc, links, files))

