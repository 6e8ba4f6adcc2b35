"""``racesim diff``: a vLLM change against its baseline (parse, call, render)."""

from __future__ import annotations

import html
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from racesim.cli.options import vllm_option as _vllm_option
from racesim.cli.support import BUDGET as _BUDGET
from racesim.cli.support import emit_json as _emit_json
from racesim.cli.support import output_dir as _output_dir
from racesim.cli.support import output_file as _output_file
from racesim.engine_model.checker import check_invariant_names
from racesim.engine_model.policies import policy_spec
from racesim.engine_vllm.support import SUPPORTED_POLICIES
from racesim.runner import import_from_cwd, resolve_backend
from racesim.runner.engines import cannot_run, why_not_run
from racesim.scenarios import bundled_names, load_scenario
from racesim.sim import InputError
from racesim.sim.strategies import STRATEGIES

__all__ = ["diff_cmd"]


@click.command("diff")
@click.option("-s", "--scenario", "scenario_names", multiple=True,
              help="Scenario (repeatable) [default: every bundled scenario vLLM runs].")
@click.option("-p", "--policy", "policies", multiple=True,
              help=f"Policy (repeatable) [default: {', '.join(SUPPORTED_POLICIES)}].")
@click.option("--budget", type=_BUDGET, default=100, show_default=True,
              help="Runs per cell and side.")
@click.option("--reach", type=click.Choice(["all", "live"]), default="all", show_default=True,
              help="'live': delay only await points that are live or yield in the profile.")
@_vllm_option("the candidate's generation")
@click.option("--vllm-src", default=None, type=click.Path(file_okay=False), metavar="DIR",
              help="Candidate: the vLLM checkout DIR (a folder holding vllm/).")
@click.option("--vllm-patch", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="Candidate: the installed vLLM with this unified diff applied.")
@click.option("--base-src", default=None, type=click.Path(file_okay=False), metavar="DIR",
              help="Baseline: a vLLM checkout [default: the installed release].")
@click.option("--base-patch", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="Baseline: the installed vLLM with this diff applied.")
@click.option("--vllm-base", default=None, metavar="VERSION",
              help="Run both trees as this supported vLLM generation.")
@click.option("--strategy", type=click.Choice([s for s in STRATEGIES if s != "hypothesis"]),
              default="random", show_default=True, help="How delays are chosen.")
@click.option("--seed", type=int, default=0, show_default=True, help="Base seed.")
@click.option("--skip", multiple=True, metavar="INVARIANT",
              help="Leave an invariant unchecked (repeatable).")
@click.option("--time-limit", type=float, default=None,
              help="Stop exploring each cell on each side after this many seconds.")
@click.option("--shrink-runs", type=int, default=100, show_default=True,
              help="Runs (on each side) to shrink each opened race.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="racesim-out",
              show_default=True, help="Where the opened races' counterexample files go.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False),
              help="Write an HTML summary of the diff.")
def diff_cmd(scenario_names: Sequence[str], policies: Sequence[str], budget: int, reach: str,
             vllm: str | None, vllm_src: str | None, vllm_patch: str | None,
             base_src: str | None, base_patch: str | None, vllm_base: str | None,
             strategy: str, seed: int, skip: Sequence[str], time_limit: float | None,
             shrink_runs: int, out_dir: str, as_json: bool, html_file: str | None) -> None:
    """What a vLLM change opens, closes and leaves alone: the same scenarios, seeds and budget
    on a baseline and a candidate, each schedule that violates an invariant on one side
    replayed exactly on the other.

    Exits 1 when the change opens a live race, else 0 (2 on bad input)."""
    from racesim.diff import diff

    if vllm_src is None and vllm_patch is None:
        raise InputError("racesim diff needs a candidate: --vllm-src DIR or --vllm-patch FILE")
    if shrink_runs < 0:
        raise InputError(f"--shrink-runs must be >= 0, got {shrink_runs}")
    if time_limit is not None and not time_limit > 0:
        raise InputError(f"--time-limit must be > 0 seconds, got {time_limit}")
    candidate = resolve_backend("vllm", src=vllm_src, patch=vllm_patch, base=vllm_base)
    if base_src is not None or base_patch is not None:
        baseline = resolve_backend("vllm", src=base_src, patch=base_patch, base=vllm_base)
    else:
        baseline = resolve_backend("vllm")
    profile = vllm or candidate.base
    scens = [load_scenario(n).with_vllm(profile) for n in (scenario_names or bundled_names())]
    if not scenario_names:
        left = [s.name for s in scens if cannot_run(s.workload, "vllm")]
        scens = [s for s in scens if s.name not in left]
        if left and not as_json:
            click.echo(f"racesim: diff on vLLM {profile} leaves out {', '.join(left)} "
                       f"(not run on the vllm backend)", err=True)
    for s in scens:
        if (why := why_not_run(s.workload, "vllm")) is not None:
            raise InputError(f"{s.name}: {why}")
        candidate.check(s.vllm)
    pols = list(policies or SUPPORTED_POLICIES)
    for p in pols:
        import_from_cwd(p)
        policy_spec(p)
    check_invariant_names(tuple(skip))
    out = _output_dir("--out", out_dir)
    _output_file("--html", html_file)
    say = None if as_json else (lambda line: click.echo(f"racesim: diff: {line}", err=True))
    result = diff(scens, pols, baseline=baseline, candidate=candidate, budget=budget,
                  seed=seed, strategy=strategy, reach=reach, skip=skip, time_limit=time_limit,
                  shrink_runs=shrink_runs, out_dir=out, progress=say)
    doc = result.document()
    if html_file:
        Path(html_file).write_text(render_html(doc), encoding="utf-8")
    if as_json:
        _emit_json(doc)
    else:
        for line in render_text(doc):
            click.echo(line)
        if html_file:
            click.echo(f"report: {html_file}")
    sys.exit(1 if result.opens_live_race else 0)


def _change(c: dict[str, Any]) -> str:
    n = len(c["schedule"])
    kind = "race" if c["verdict"] == "race" else "accounting only"
    return (f"{c['invariant']} ({c['reach'] or 'unjudged'} {kind}; {c['runs']} schedule"
            f"{'' if c['runs'] == 1 else 's'}, first at run {c['first_run']}; "
            f"{n} delay{'' if n == 1 else 's'}, {c['requests']} request"
            f"{'' if c['requests'] == 1 else 's'})")


def render_text(doc: dict[str, Any]) -> list[str]:
    """The diff in plain lines: per cell what it opens, closes and leaves alone."""
    lines = [f"baseline:  {doc['baseline']['label']}",
             f"candidate: {doc['candidate']['label']}",
             f"{doc['budget']} runs per cell on each side, seed {doc['seed']}, "
             f"{doc['strategy']} delays at {doc['reach']} await points"]
    opened = closed = 0
    for cell in doc["cells"]:
        lines.append(f"{cell['scenario']} / {cell['policy']}:")
        for c in cell["opens"]:
            opened += 1
            lines.append(f"  opens   {_change(c)}")
            if c.get("replay"):
                lines.append(f"          replay: {c['replay']}")
        for c in cell["closes"]:
            closed += 1
            lines.append(f"  closes  {_change(c)}")
        if not cell["opens"] and not cell["closes"]:
            lines.append("  no change")
        if cell["unchanged"]:
            lines.append(f"  unchanged: {', '.join(cell['unchanged'])}")
    live = sum(1 for cell in doc["cells"] for c in cell["opens"]
               if c["reach"] == "live" and c["verdict"] == "race")
    lines.append(f"the change opens {opened} (live races: {live}) and closes {closed} "
                 f"invariant violations in {len(doc['cells'])} cells ({doc['elapsed_s']:.0f} s)")
    return lines


def render_html(doc: dict[str, Any]) -> str:
    """A self-contained page: one row per cell and change."""
    e = html.escape
    rows = []
    for cell in doc["cells"]:
        changes = [("opens", c) for c in cell["opens"]] + [("closes", c) for c in cell["closes"]]
        for what, c in changes or [("no change", None)]:
            rows.append(
                f"<tr class='{e(what.replace(' ', '-'))}'><td>{e(cell['scenario'])}</td>"
                f"<td>{e(cell['policy'])}</td><td>{e(what)}</td>"
                f"<td>{e(c['invariant']) if c else ''}</td>"
                f"<td>{e(str(c['reach'])) if c else ''}</td>"
                f"<td>{c['runs'] if c else ''}</td>"
                f"<td><code>{e(c.get('replay') or '') if c else ''}</code></td>"
                f"<td>{e(', '.join(cell['unchanged']))}</td></tr>")
    return ("<!doctype html><meta charset='utf-8'><title>racesim diff</title><style>"
            "body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:4px}"
            "table{border-collapse:collapse}.opens{background:#fdd}.closes{background:#dfd}"
            "</style><h1>racesim diff</h1>"
            f"<p>baseline: {e(doc['baseline']['label'])}<br>candidate: "
            f"{e(doc['candidate']['label'])}<br>{doc['budget']} runs per cell on each side, "
            f"seed {doc['seed']}, reach {e(doc['reach'])}</p><table><tr><th>scenario</th>"
            "<th>policy</th><th>change</th><th>invariant</th><th>reach</th><th>schedules</th>"
            "<th>replay</th><th>unchanged</th></tr>" + "".join(rows) + "</table>\n")
