"""The HTML report of ``racesim corpus``: real vLLM bugs, found or not on their releases."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from racesim.reports._io import write_text
from racesim.reports.commands import replay_command
from racesim.reports.html import environment

__all__ = ["render_corpus_report", "write_corpus_report"]


def render_corpus_report(doc: Mapping[str, Any]) -> str:
    """One self-contained page from ``racesim corpus --json``'s document: a row per entry (its
    buggy and fixed release's verdicts, the model's alongside), then each entry's description,
    the violation vLLM's own code raised (file:line) and the replay command of its find."""
    entries = []
    for e in doc.get("entries") or []:
        buggy = dict(e.get("buggy") or {})
        path = buggy.get("counterexample")
        entries.append({**e, "buggy": buggy, "fixed": dict(e.get("fixed") or {}),
                        "command": f"{replay_command(path, '', 'vllm')}" if path else ""})
    ctx = {"title": "racesim corpus", "doc": doc, "entries": entries,
           "options": dict(doc.get("options") or {}), "skipped": doc.get("skipped") or []}
    return environment().get_template("corpus.j2").render(ctx)


def write_corpus_report(path: Path, doc: Mapping[str, Any]) -> Path:
    return write_text(path, render_corpus_report(doc))
