"""``racesim corpus``: the real-bug corpus, explored with no hint (parse, call, render)."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from racesim.cli.support import BUDGET, check_workers, console, emit_json, output_dir, output_file
from racesim.corpus import CorpusOptions, corpus_entries, install_releases, run_corpus
from racesim.reports.text import printable
from racesim.sim import InputError
from racesim.sim.strategies import STRATEGIES

__all__ = ["corpus_cmd", "markdown_table"]

_RELEASE = re.compile(r"[0-9]+(\.[0-9]+){1,3}")


@click.command("corpus")
@click.argument("entries", nargs=-1)
@click.option("--budget", type=BUDGET, default=300, show_default=True,
              help="Schedules per entry and release on the vllm backend (run 0 is the "
                   "unperturbed baseline); the buggy release's search stops at the first find.")
@click.option("--model-budget", type=BUDGET, default=300, show_default=True,
              help="The same on the model, alongside.")
@click.option("--strategy", type=click.Choice([s for s in STRATEGIES if s != "hypothesis"]),
              default="random", show_default=True, help="How each run's delays are chosen.")
@click.option("--reach", type=click.Choice(["live", "all"]), default="live", show_default=True,
              help="'live': delay only await points that are live or yield on the release "
                   "(a bug users hit is live); 'all' also delays latent ones.")
@click.option("--seed", type=int, default=0, show_default=True, help="Exploration seed.")
@click.option("--shrink-runs", type=click.IntRange(0, 2**31), default=100, show_default=True,
              help="Runs spent shrinking each find.")
@click.option("--workers", type=int, default=1, show_default=True,
              help="Worker processes per exploration (each imports vLLM once).")
@click.option("--time-limit", type=float, default=None,
              help="Seconds per exploration (makes the runs counted depend on the machine).")
@click.option("--release", "only_release", default=None, metavar="VERSION",
              help="Only the entries' work on this vLLM release (e.g. 0.20.0).")
@click.option("--venvs", type=click.Path(file_okay=False), envvar="RACESIM_VLLM_VENVS",
              default=None, help="Folder with one venv per vLLM release (DIR/<version>), "
                                 "for the releases not installed here [env RACESIM_VLLM_VENVS].")
@click.option("--install", "install_dir", type=click.Path(file_okay=False), default=None,
              help="Install each missing release into its own venv under this folder, then "
                   "run (as --venvs).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="racesim-out",
              show_default=True, help="Where each find's counterexample file is written.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False),
              help="Write the HTML corpus report.")
@click.option("--markdown", is_flag=True,
              help="Print the table as Markdown (the README's corpus table).")
def corpus_cmd(entries: Sequence[str], budget: int, model_budget: int, strategy: str,
               reach: str, seed: int, shrink_runs: int, workers: int, time_limit: float | None,
               only_release: str | None, venvs: str | None, install_dir: str | None,
               out_dir: str, as_json: bool, html_file: str | None, markdown: bool) -> None:
    """Explore each corpus entry (a real vLLM bug; default: every bundled one) with no hint,
    on the vllm backend, on the release the bug lived in and on the release that fixed it;
    the model runs alongside. Prints found / not found, the runs and seconds to the first
    find, and whether the fixed release is clean. Exits 0 when it completed."""
    scens = corpus_entries(entries)
    if only_release is not None and not _RELEASE.fullmatch(only_release):
        raise InputError(f"--release {only_release!r}: expected a vLLM release such as 0.20.0")
    if time_limit is not None and not time_limit > 0:
        raise InputError(f"--time-limit must be > 0 seconds, got {time_limit}")
    check_workers(workers, None)
    output_file("--html", html_file)
    out = output_dir("--out", out_dir)
    folder = Path(install_dir or venvs) if (install_dir or venvs) else None
    if install_dir is not None:
        for line in install_releases(scens, Path(install_dir)):
            click.echo(line, err=True)
    opts = CorpusOptions(budget=budget, model_budget=model_budget, strategy=strategy,
                         seed=seed, shrink_runs=shrink_runs, workers=workers,
                         time_limit=time_limit, reach=reach)
    status = Console(stderr=True)
    if as_json or not status.is_terminal:
        doc = run_corpus(scens, opts=opts, venvs=folder, only_release=only_release,
                         out_dir=out)
    else:
        with status.status("corpus") as spinner:
            doc = run_corpus(scens, opts=opts, venvs=folder, only_release=only_release,
                             out_dir=out, progress=lambda what: spinner.update(what))
    if html_file:
        from racesim.reports.corpus import write_corpus_report
        write_corpus_report(Path(html_file), doc)
    if as_json:
        emit_json(doc)
    elif markdown:
        click.echo(markdown_table(doc))
    else:
        _print(doc)
        if html_file:
            click.echo(f"report: {html_file}")
    if doc["interrupted"]:
        click.echo("racesim: interrupted; nothing more was started, and the table shows what "
                   "finished", err=True)
        sys.exit(130)
    if doc["bad_venvs"]:  # a venv that is not what it claims: the user's input, one line
        raise InputError(doc["bad_venvs"][0])


def _cell(side: dict[str, Any]) -> str:
    """One release's verdict in words: found at run N (S s), not found in N runs, clean..."""
    status = side.get("status", "not run")
    if status == "found":
        return f"found, run {side['first_find_run']}"
    if status in ("not found", "clean"):
        return f"{status} ({side['runs']} runs)"
    if status == "not clean":
        return f"NOT CLEAN, run {side['first_find_run']}"
    return status  # also "open": no fixed release to explore


def markdown_table(doc: dict[str, Any]) -> str:
    """The deterministic part of the result (no seconds) as a Markdown table."""
    from racesim.reports.corpus import invariant_cell  # jinja2 is imported only when needed

    rows = ["| issue | entry | invariant | buggy release | vllm backend | model | "
            "fixed release | vllm backend |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for e in doc["entries"]:
        b, f = e["buggy"], e["fixed"]
        rows.append(f"| #{e['issue']} | {e['name']} | {invariant_cell(e)} | {b['release']} | "
                    f"{_cell(b)} | {_cell(b.get('model', {}))} | {f['release']} | "
                    f"{_cell(f)} |")
    return "\n".join(rows)


def _print(doc: dict[str, Any]) -> None:
    from racesim.reports.corpus import coverage_note, disagreement, invariant_cell

    out = console()  # a pipe or file: the whole table, not one squeezed into 80 columns
    t = Table(title="vLLM bug corpus (no hint)", title_justify="left")
    for col in ("issue / entry", "invariant", "buggy release", "vllm backend", "s",
                "model", "fixed release", "vllm backend"):
        t.add_column(col, no_wrap=col != "issue / entry")
    for e in doc["entries"]:
        b, f = e["buggy"], e["fixed"]
        found = b.get("status") == "found"
        clean = f.get("status") == "clean"
        t.add_row(Text(printable(f"#{e['issue']} {e['name']}")), invariant_cell(e),
                  b["release"],
                  Text(_cell(b), style="green" if found else "red"),
                  "" if b.get("first_find_s") is None else f"{b['first_find_s']:.2f}",
                  _cell(b.get("model", {})), f["release"],
                  Text(_cell(f), style="green" if clean else "red"))
    out.print(t)
    for e in doc["entries"]:  # the find's own exception, raised in vLLM's code
        raised = next((v for v in e["buggy"].get("violations", ()) if v.get("vllm_where")),
                      None)
        if raised is not None and e["buggy"].get("status") == "found":
            out.print(Text(printable(f"#{e['issue']} on vLLM {e['buggy']['release']}: "
                                     f"{raised.get('detail', '')}"), style="dim"))
    for e in doc["entries"]:  # where the model and vLLM's code disagree, and what was reached
        if (line := disagreement(e)) is not None:
            out.print(Text(printable(line), style="bold yellow"))
        if (line := coverage_note(e)) is not None:
            out.print(Text(printable(line), style="dim"))
    for line in doc["skipped"]:
        out.print(Text(printable(f"skipped: {line}"), style="yellow"))
    out.print(Text(f"found {doc['found']}/{doc['tried']} on their buggy releases; "
                   f"{doc['fixed_clean']}/{doc['fixed_tried']} fixed releases clean "
                   f"({doc['elapsed_s']} s)"))
