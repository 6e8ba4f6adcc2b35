"""The HTML report of ``racesim corpus``: real vLLM bugs, found or not on their releases."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from racesim.reports._io import write_text
from racesim.reports.commands import replay_command
from racesim.reports.html import environment

__all__ = ["render_corpus_report", "write_corpus_report", "disagreement", "coverage_note",
           "invariant_cell"]


def invariant_cell(entry: Mapping[str, Any]) -> str:
    """The invariant an entry is judged by; both when the vllm backend judges another one
    (vLLM's own runner shows the bug as another symptom than the model)."""
    mine = entry.get("invariant", "")
    theirs = entry.get("vllm_invariant") or mine
    return mine if mine == theirs else f"vllm: {theirs}; model: {mine}"


def disagreement(entry: Mapping[str, Any]) -> str | None:
    """One line when the model and vLLM's own code disagree on an entry's buggy release (one
    found the bug, the other did not), else None: the model's verdict then misses (or adds)
    what vLLM's code decides, and the entry says so where both verdicts appear."""
    b = entry.get("buggy") or {}
    m = b.get("model") or {}
    ours, model = b.get("status"), m.get("status")
    if {ours, model} != {"found", "not found"}:
        return None
    release = b.get("release", "?")
    if ours == "found":
        return (f"#{entry.get('issue')}: model and vLLM disagree on {release}: vLLM's own code "
                f"found it at run {b.get('first_find_run')}, the model did not in "
                f"{m.get('runs')} runs (the model misses what vLLM's code decides here)")
    return (f"#{entry.get('issue')}: model and vLLM disagree on {release}: the model found it "
            f"at run {m.get('first_find_run')}, vLLM's own code did not in {b.get('runs')} runs")


def coverage_note(entry: Mapping[str, Any]) -> str | None:
    """What the buggy release's search (vLLM's code, else the model) never reached, one line."""
    b = entry.get("buggy") or {}
    side, who = (b, "vllm") if b.get("reached") else (b.get("model") or {}, "model")
    reached = side.get("reached") or {}
    if not reached:
        return None
    never = reached.get("invariants_never_evaluated") or []
    return (f"#{entry.get('issue')} coverage ({who}, {side.get('runs')} runs): "
            f"{reached.get('windows_opened')} windows opened; never delayed: "
            f"{', '.join(reached.get('never_delayed') or []) or 'none'}; never evaluated: "
            f"{', '.join(never) or 'none'}")


def render_corpus_report(doc: Mapping[str, Any]) -> str:
    """One self-contained page from ``racesim corpus --json``'s document: a row per entry (its
    buggy and fixed release's verdicts, the model's alongside), then each entry's description,
    the violation vLLM's own code raised (file:line) and the replay command of its find."""
    entries = []
    for e in doc.get("entries") or []:
        buggy = dict(e.get("buggy") or {})
        path = buggy.get("counterexample")
        entries.append({**e, "buggy": buggy, "fixed": dict(e.get("fixed") or {}),
                        "invariant_text": invariant_cell(e),
                        "command": f"{replay_command(path, '', 'vllm')}" if path else "",
                        "disagreement": disagreement(e), "coverage": coverage_note(e)})
    ctx = {"title": "racesim corpus", "doc": doc, "entries": entries,
           "options": dict(doc.get("options") or {}), "skipped": doc.get("skipped") or []}
    return environment().get_template("corpus.j2").render(ctx)


def write_corpus_report(path: Path, doc: Mapping[str, Any]) -> Path:
    return write_text(path, render_corpus_report(doc))
