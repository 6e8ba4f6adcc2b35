"""The HTML report of ``racesim conform``: the model against vLLM's own code, one file."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from racesim.reports._io import write_text
from racesim.reports.commands import replay_command
from racesim.reports.html import environment

__all__ = ["render_conform_report", "write_conform_report"]


def render_conform_report(doc: Mapping[str, Any]) -> str:
    """One self-contained page from ``racesim conform --json``'s document: a row per cell, then
    every mismatch side by side (each backend's outcome per client), with its replay commands."""
    parameters = dict(doc.get("parameters") or {})
    #: ``conform --frontend``: the model's frontend against vLLM's own AsyncLLM
    frontends = parameters.get("engines") == ["vllm@model", "vllm@asyncllm"]
    mismatches = []
    for m in doc.get("mismatches") or []:
        model, vllm = m.get("model") or {}, m.get("vllm") or {}
        clients = []
        for i, (a, b) in enumerate(zip(model.get("requests") or [], vllm.get("requests") or [],
                                       strict=False)):
            clients.append({"index": i, "id": a.get("id"), "model": a, "vllm": b,
                            "same": a == b})
        path = m.get("path")
        if frontends:  # both on the vllm backend; the frontend is chosen by the environment
            commands = [f"RACESIM_VLLM_FRONTEND={f} {replay_command(path)} --engine vllm"
                        for f in ("model", "asyncllm")]
        else:
            commands = [f"{replay_command(path)} --engine {e}" for e in ("model", "vllm")]
        mismatches.append({**m, "clients": clients, "commands": commands if path else []})
    ctx = {"title": "racesim conform", "doc": doc, "cells": doc.get("cells") or [],
           "parameters": parameters, "mismatches": mismatches, "frontends": frontends,
           "unlisted": doc.get("unlisted_mismatches", 0)}
    return environment().get_template("conform.j2").render(ctx)


def write_conform_report(path: Path, doc: Mapping[str, Any]) -> Path:
    return write_text(path, render_conform_report(doc))
