"""``racesim conform``: the model against vLLM's own engine code (parse, call, render)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from racesim.cli.support import BUDGET, check_workers, console, emit_json, output_dir, output_file
from racesim.cli.support import parse_options as _options
from racesim.conform import ENGINES, STRATEGIES, check_comparable, conform, lifecycle
from racesim.conform.frontend import SIDES as FRONTEND_SIDES
from racesim.conform.frontend import default_policies as frontend_policies
from racesim.engine_model.versions import ALIASES, PROFILES, model_gap, profile_gap
from racesim.cli.progress import ProgressBar
from racesim.reports.text import printable
from racesim.scenarios import bundled_names, load_scenario

__all__ = ["conform_cmd"]


@click.command("conform")
@click.argument("scenarios", nargs=-1)
@click.option("--vllm", type=click.Choice([*PROFILES, *ALIASES]), default=None,
              help="vLLM release profile [default: the scenario's, else 0.33]; the vLLM "
                   "backend runs the installed release, which must be this one.")
@click.option("-p", "--policy", "policies", multiple=True,
              help="Policy (repeatable) [default: the lifecycle vLLM has on the profile: "
                   "buggy before 0.14, internal-id from 0.14].")
@click.option("--policy-opt", "policy_opts", multiple=True, metavar="KEY=VALUE",
              help="A policy option for every -p policy (repeatable).")
@click.option("--budget", type=BUDGET, default=100, show_default=True,
              help="Schedules per scenario and policy (run 0 is the unperturbed baseline).")
@click.option("--strategy", type=click.Choice(list(STRATEGIES)), default="random",
              show_default=True, help="How the model draws each schedule.")
@click.option("--seed", type=int, default=0, show_default=True, help="Base seed.")
@click.option("--workers", type=int, default=None,
              help="Worker processes [default: all cores]; each imports vLLM once.")
@click.option("--skip", multiple=True, metavar="INVARIANT",
              help="Leave an invariant unchecked on both sides (repeatable).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="racesim-out",
              show_default=True, help="Where each mismatch's counterexample file is written.")
@click.option("--frontend", "frontends", is_flag=True,
              help="Compare the model's frontend with vLLM's own AsyncLLM instead, both on "
                   "vLLM's engine classes (--engine vllm), on the points both pass; default "
                   "policies: buggy and internal-id.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False),
              help="Write the HTML conformance report.")
def conform_cmd(scenarios: Sequence[str], vllm: str | None, policies: Sequence[str],
                policy_opts: Sequence[str], budget: int, strategy: str, seed: int,
                workers: int | None, skip: Sequence[str], frontends: bool, out_dir: str,
                as_json: bool, html_file: str | None) -> None:
    """Replay the same schedules on the model and on vLLM's own code, and compare.

    Each SCENARIO (default: every bundled one) gets --budget schedules drawn on the model;
    each exact schedule then runs on both backends, which must agree on every client's tokens,
    finish reason and token owners, on the violated invariants and their reach, and on engine
    death. Exit 1 on a mismatch the known-mismatch table does not list, else 0. The vllm
    side runs vLLM's own frontend where it runs (then only the points both sides pass are
    perturbed); RACESIM_VLLM_FRONTEND=model compares the engine alone.

    With --frontend the two sides are the model's frontend and vLLM's own AsyncLLM, both on
    vLLM's engine classes; a scenario vLLM's frontend does not run is left out, with why."""
    scens = [load_scenario(n).with_vllm(vllm) for n in (scenarios or bundled_names())]
    if not scenarios:
        # every bundled one: those needing a feature this release lacks are left out
        from racesim.engine_vllm.support import release_gap
        from racesim.runner.engines import installed_vllm

        release = installed_vllm()
        kept = []
        for scen in scens:
            gap = (profile_gap(scen.workload) or release_gap(scen.workload, release)
                   or (None if frontends else model_gap(scen.workload)))  # the model's side
            if gap is None:
                kept.append(scen)
            else:
                click.echo(f"racesim: {scen.name}: {gap}; not conformed", err=True)
        scens = kept
    for scen in scens:  # before --out is made: bad input writes nothing
        if not frontends:  # --frontend runs vLLM's engine on both sides
            check_comparable(scen)
    options = _options(policy_opts)
    engines = FRONTEND_SIDES if frontends else ENGINES
    if frontends:
        from racesim.runner.engines import installed_vllm

        defaults = frontend_policies(installed_vllm())
    else:
        defaults = _default_policies(scens)
    cells = ([(p, options) for p in policies]
             or [(p, {**o, **options}) for p, o in defaults])
    output_file("--html", html_file)
    out = output_dir("--out", out_dir)
    check_workers(workers, None)
    bar = ProgressBar(not as_json, "conform")

    def on_cell(done: int, total: int, cell: dict[str, Any] | None) -> None:
        if cell is None:  # a cell starts: on a terminal its bar, in a log its line when done
            scenario, policy = divmod(done, len(cells))
            bar.start(f"{scens[scenario].name} / {cells[policy][0]}", steps=total)
        elif cell["model_only"]:
            bar.finish("left out" if frontends else "model only")
        else:
            bar.finish(f"{cell['mismatching_runs']} of {cell['runs']} runs differ"
                       + (f", {cell['unlisted']} not in the known table"
                          if cell["unlisted"] else ""))

    try:
        res = conform(scens, cells, budget=budget, strategy=strategy, seed=seed,
                      workers=workers, skip=skip, out_dir=out, progress=bar, on_cell=on_cell,
                      engines=engines)
    finally:
        bar.close()
    doc = res.document()
    if html_file:
        from racesim.reports.conform import write_conform_report
        write_conform_report(Path(html_file), doc)
    if as_json:
        emit_json(doc)
    else:
        _print(doc)
        if html_file:
            click.echo(f"report: {html_file}")
    if res.interrupted:
        click.echo("racesim: interrupted; kept the mismatches found so far", err=True)
        sys.exit(130)
    sys.exit(1 if res.unlisted else 0)


def _default_policies(scens: Sequence[Any]) -> list[tuple[str, dict[str, str]]]:
    """The lifecycle vLLM has on each profile among the scenarios', once each."""
    names = dict.fromkeys(s.vllm for s in scens)
    return list({lifecycle(v)[0]: lifecycle(v) for v in names}.values())


def _print(doc: dict[str, Any]) -> None:
    out = console()
    frontends = doc["parameters"].get("engines") == list(FRONTEND_SIDES)
    title = "model frontend vs vLLM's AsyncLLM (vLLM's engine)" if frontends else "model vs vLLM"
    only = "not on vLLM's frontend" if frontends else "model only"
    t = Table(title=title, title_justify="left")
    t.add_column("scenario / policy", no_wrap=True)
    t.add_column("runs", justify="right")
    t.add_column("violating", justify="right")
    t.add_column("mismatching", justify="right")
    t.add_column("unlisted", justify="right")
    for c in doc["cells"]:
        name = Text(printable(f"{c['scenario']} / {c['policy']}"))
        if c["model_only"]:
            t.add_row(name, Text("left out" if frontends else "model only", style="dim"),
                      "", "", "")
            continue
        t.add_row(name, str(c["runs"]), str(c["violating_runs"]), str(c["mismatching_runs"]),
                  Text(str(c["unlisted"]), style="bold red" if c["unlisted"] else "green"))
    out.print(t)
    for why in dict.fromkeys(c["model_only"] for c in doc["cells"] if c["model_only"]):
        out.print(Text(printable(f"{only}: {why}"), style="dim"))
    for m in doc["mismatches"]:
        tag = "known" if m["known"] else "UNLISTED"
        out.print(Text(printable(f"{tag}: {m['scenario']} / {m['policy']} run {m['run']} "
                                 f"(seed {m['seed']}) -> {m['path'] or '(not saved)'}"),
                       style="dim" if m["known"] else "bold red"))
        for d in m["differences"][:6]:
            out.print(Text(printable(f"    {d}")))
        if m["known"]:
            out.print(Text(printable(f"    cause: {m['known']}"), style="dim"))
    out.print(Text(f"{doc['agreeing_runs']}/{doc['runs']} runs agree; "
                   f"{doc['unlisted_mismatches']} unlisted mismatches "
                   f"({doc['elapsed_s']} s)"))
