"""``racesim list`` (the catalogue, documents/catalogue.py) and ``racesim show`` (a scenario's
TOML): parse, call, render."""

from __future__ import annotations

import re
import textwrap
from typing import Any

import click

from racesim.cli.options import vllm_option as _vllm_option
from racesim.cli.support import UNWRAPPED
from racesim.cli.support import console as _console
from racesim.cli.support import emit_json as _emit_json
from racesim.documents.catalogue import SECTIONS, listing
from racesim.engine_model.versions import DEFAULT_VLLM, get_profile
from racesim.scenarios import load_scenario

__all__ = ["list_cmd", "show_cmd"]


@click.command("list")
@click.argument("what", required=False,
                type=click.Choice(list(SECTIONS)))
@_vllm_option(f"{DEFAULT_VLLM}; the profile whose await-point widths are listed")
@click.option("--engine", type=click.Choice(["model", "vllm"]), default="model",
              help="'vllm': the await points of the installed vLLM's own frontend, read from "
                   "its code (async_llm.py, core_client.py).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout (with no "
                                                       "WHAT: every section in full).")
def list_cmd(what: str | None, vllm: str | None, engine: str, as_json: bool) -> None:
    """List bundled scenarios, corpus entries (real vLLM bugs), policies, await points (with
    their width in a vLLM profile), invariants or vLLM version profiles. With no WHAT: an
    overview, each section's names, and the command that shows it in full."""
    profile = get_profile(vllm)
    sections = listing(what, vllm, engine)
    if as_json:
        _emit_json(sections)
        return
    console = _console()
    if what is None:
        _overview(console, sections)
        return
    for title, rows in sections.items():
        console.print(f"[bold]{title}[/bold]"
                      + (f" (widths in vLLM {profile.name})" if title == "points"
                         else " (first sentence; 'racesim show NAME' prints the whole scenario)"
                         if title == "scenarios"
                         else " (real vLLM bugs; 'racesim corpus' explores them)"
                         if title == "corpus" else ""))
        pad = max(len(r["name"]) for r in rows) if rows else 0
        for r in rows:
            width_tag = f"[{r['width']}] " if "width" in r else ""
            if "width_mid_step" in r:  # a width that depends on the step's size
                width_tag = f"[{r['width']}; {r['width_mid_step']} mid-step] "
            meaning = _first_sentence(r["meaning"]) if title == "scenarios" else r["meaning"]
            lead = f"  {r['name'].ljust(pad)}  "
            _hanging(console, lead, width_tag + meaning, len(lead))
            for b in r.get("behaviours", ()):
                _hanging(console, " " * (len(lead) + 2) + "- ", f"{b['text']} ({b['source']})",
                         len(lead) + 4)


def _hanging(console: Any, lead: str, text: str, indent: int) -> None:
    """``lead`` + ``text``, wrapped at the console's width with its later lines indented by
    ``indent`` (not at column 0); off a terminal with no COLUMNS, one line however long."""
    if console.width >= UNWRAPPED:
        console.print(lead + text, markup=False)
        return
    for line in textwrap.wrap(text, width=max(console.width, indent + 20), initial_indent=lead,
                              subsequent_indent=" " * indent, break_long_words=False,
                              break_on_hyphens=False):
        console.print(line, markup=False)


#: what each section holds, as the overview names it
_WHAT = {"scenarios": "bundled race scenarios ('racesim show NAME' prints one)",
         "corpus": "real vLLM bugs ('racesim corpus' explores them)",
         "policies": "lifecycle policies (-p)",
         "points": "await points a delay may name (--vllm V: their widths there)",
         "invariants": "invariants the checker evaluates (--skip)",
         "versions": "vLLM release profiles (--vllm) and what runs of each"}


def _overview(console: Any, sections: dict[str, list[dict[str, Any]]]) -> None:
    """``racesim list`` with no WHAT: per section its size, what it is, its names (wrapped at
    the console's width, at most 100 columns) and the command that lists it."""
    width = min(console.width, 100)
    console.print(f"racesim list {'|'.join(SECTIONS)}: one section in full; "
                  "racesim list --json: all of them", markup=False)
    for title, rows in sections.items():
        console.print(f"\n[bold]{title}[/bold]: {len(rows)} {_WHAT[title]}; in full: "
                      f"racesim list {title}")
        names = ", ".join(r["name"] for r in rows)
        for line in textwrap.wrap(names, width=width - 2, break_long_words=False,
                                  break_on_hyphens=False):
            console.print(f"  {line}", markup=False)


#: a sentence ends at ". " (or "): ") before a word, not after "e.g." or "i.e."
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.(?=\s+[\w(])")


def _first_sentence(text: str) -> str:
    """A scenario summary's first sentence: one index line per scenario in ``racesim list``."""
    end = _SENTENCE_END.search(text)
    return text if end is None else text[:end.start() + 1]


@click.command("show")
@click.argument("scenario")
def show_cmd(scenario: str) -> None:
    """Print SCENARIO's TOML (a bundled name or a path): a start for your own scenario."""
    from racesim.scenarios.loader import scenario_to_toml

    click.echo(scenario_to_toml(load_scenario(scenario)), nl=False)
