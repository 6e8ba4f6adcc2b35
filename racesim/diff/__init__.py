"""``racesim diff``: what a vLLM change opens, closes and leaves alone, scenario by scenario.

The same scenarios, policies, seeds, strategy and budget are explored on a baseline (the
installed release, or a tree or patch) and on a candidate (a tree or patch), each in its own
process (:mod:`racesim.diff.sides`). Every schedule that violates an invariant on one side is
then replayed, exactly, on the other:

- the change **opens** invariant X when a schedule violates X on the candidate and the same
  schedule on the baseline does not;
- it **closes** X in the converse case;
- X is **unchanged** when the schedules that violate it violate it on both sides.

So a scenario whose baseline already races still shows what the change added. Each opened
invariant is shrunk (racesim.explore.shrink, judged on both sides: it must still fail on the
candidate and still pass on the baseline), labelled live or latent by its reach on the
candidate, and written as a counterexample file of the candidate's backend.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from racesim.diff.sides import Side
from racesim.explore.shrink import shrink
from racesim.reports.commands import replay_command
from racesim.reports.verdict import RACE, verdict
from racesim.documents import safe_file_name as safe_name
from racesim.runner import Backend, RunSpec, import_from_cwd
from racesim.scenarios import Scenario
from racesim.sim import Decision, InputError

__all__ = ["diff", "DiffResult", "DiffCell", "Change"]

Progress = Callable[[str], None]


@dataclass
class Change:
    """One invariant the change opens (or closes) in one cell."""

    invariant: str
    runs: int  # exploration runs (of the side where it fails) that show it
    first_run: int
    reach: str | None  # on the side where it fails: live, latent
    schedule: tuple[Decision, ...]  # shrunk (opened) or as found (closed)
    requests: int = 0
    shrink_runs: int = 0
    counterexample: str | None = None
    replay: str | None = None

    @property
    def is_race(self) -> bool:
        return verdict((self.invariant,)) == RACE

    def as_dict(self) -> dict[str, Any]:
        return {"invariant": self.invariant, "runs": self.runs, "first_run": self.first_run,
                "reach": self.reach, "verdict": verdict((self.invariant,)),
                "schedule": [d.as_dict() for d in self.schedule], "requests": self.requests,
                "shrink_runs": self.shrink_runs, "counterexample": self.counterexample,
                "replay": self.replay}


@dataclass
class DiffCell:
    scenario: str
    policy: str
    runs: dict[str, int] = field(default_factory=dict)
    opens: list[Change] = field(default_factory=list)
    closes: list[Change] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "policy": self.policy, "runs": self.runs,
                "opens": [c.as_dict() for c in self.opens],
                "closes": [c.as_dict() for c in self.closes],
                "unchanged": self.unchanged, "warnings": self.warnings}


@dataclass
class DiffResult:
    baseline: Backend
    candidate: Backend
    settings: dict[str, Any]
    cells: list[DiffCell] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def opens_live_race(self) -> bool:
        return any(c.is_race and c.reach == "live" for cell in self.cells for c in cell.opens)

    def document(self) -> dict[str, Any]:
        return {"baseline": {"label": self.baseline.label, **self.baseline.as_dict()},
                "candidate": {"label": self.candidate.label, **self.candidate.as_dict()},
                **self.settings, "cells": [c.as_dict() for c in self.cells],
                "opens_live_race": self.opens_live_race,
                "elapsed_s": round(self.elapsed_s, 3)}


def diff(scenarios: Sequence[Scenario], policies: Sequence[str], *, baseline: Backend,
         candidate: Backend, budget: int = 100, seed: int = 0, strategy: str = "random",
         reach: str = "all", skip: Sequence[str] = (), options: dict[str, str] | None = None,
         time_limit: float | None = None, shrink_runs: int = 100,
         out_dir: Path | None = None, call_limit: float = 7200.0,
         progress: Progress | None = None) -> DiffResult:
    """Explore each (scenario, policy) on both backends and compare, schedule by schedule."""
    if not candidate.is_vllm or not baseline.is_vllm:
        raise InputError("racesim diff compares two vLLM trees: the candidate needs "
                         "--vllm-src or --vllm-patch")
    if baseline.base != candidate.base:
        raise InputError(f"baseline {baseline.label} runs as vLLM {baseline.base} and candidate "
                         f"{candidate.label} as {candidate.base}: give both one --vllm-base")
    for p in policies:
        import_from_cwd(p)
    started = time.monotonic()
    result = DiffResult(baseline, candidate, {
        "budget": budget, "seed": seed, "strategy": strategy, "reach": reach,
        "skip": sorted(skip), "time_limit": time_limit, "vllm": candidate.base})
    say = progress or (lambda _line: None)
    with Side("baseline", baseline, call_limit) as base, \
            Side("candidate", candidate, call_limit) as cand:
        say(f"starting the baseline ({baseline.label}) and candidate ({candidate.label}) "
            f"workers")
        base.start()
        cand.start()
        base.receive()
        cand.receive()
        for scen in scenarios:
            for policy in policies:
                spec_b = RunSpec.of(scen, policy, options=options, seed=seed, skip=skip,
                                    engine=baseline)
                spec_c = RunSpec.of(scen, policy, options=options, seed=seed, skip=skip,
                                    engine=candidate)
                say(f"{scen.name} / {policy}: exploring {budget} schedules on each side")
                result.cells.append(_cell(spec_b, spec_c, base, cand, budget, strategy, reach,
                                          time_limit, shrink_runs, out_dir, say))
    result.elapsed_s = time.monotonic() - started
    return result


def _cell(spec_b: RunSpec, spec_c: RunSpec, base: Side, cand: Side, budget: int,
          strategy: str, reach: str, time_limit: float | None, shrink_runs: int,
          out_dir: Path | None, say: Progress) -> DiffCell:
    cell = DiffCell(spec_c.scenario.name, spec_c.policy)
    job = {"op": "explore", "strategy": strategy, "budget": budget, "reach": reach,
           "time_limit": time_limit}
    base.send({**job, "spec": spec_b})
    cand.send({**job, "spec": spec_c})
    b_res, c_res = base.receive(), cand.receive()
    cell.runs = {"baseline": b_res["runs"], "candidate": c_res["runs"]}
    cell.warnings = list(dict.fromkeys([*b_res["warnings"], *c_res["warnings"]]))
    b_runs, c_runs = _by_schedule(b_res["violating"]), _by_schedule(c_res["violating"])
    # each side's violating schedules, replayed exactly on the other side
    base.send({"op": "replay", "spec": spec_b, "items": [(None, s) for s in c_runs]})
    cand.send({"op": "replay", "spec": spec_c, "items": [(None, s) for s in b_runs]})
    on_base, on_cand = base.receive()["results"], cand.receive()["results"]
    opened = _changes(c_runs, on_base)
    closed = _changes(b_runs, on_cand)
    unchanged = {inv for runs, other in ((c_runs, on_base), (b_runs, on_cand))
                 for run, theirs in zip(runs.values(), other, strict=True)
                 for inv in run["violated"] if inv in theirs["violated"]}
    cell.unchanged = sorted(unchanged - set(opened) - set(closed))
    for inv, found in opened.items():
        say(f"{cell.scenario} / {cell.policy}: the change opens {inv}; shrinking")
        cell.opens.append(_shrunk(inv, found, spec_b, spec_c, base, cand, shrink_runs,
                                  out_dir))
    for inv, found in closed.items():
        first = found[0]
        cell.closes.append(Change(inv, len(found), first["run"], first["reach"],
                                  first["schedule"],
                                  len(spec_b.scenario.workload.requests)))
    return cell


def _by_schedule(runs: list[dict[str, Any]]) -> dict[tuple[Decision, ...], dict[str, Any]]:
    """Violating runs by schedule (the first run of each), schedules as Decisions."""
    out: dict[tuple[Decision, ...], dict[str, Any]] = {}
    for r in runs:
        sched = tuple(Decision(p, int(k), float(d)) for p, k, d in r["schedule"])
        out.setdefault(sched, {**r, "schedule": sched})
    return out


def _changes(runs: dict[tuple[Decision, ...], dict[str, Any]],
             other: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Invariant -> the runs that violate it on their own side and not on the other."""
    out: dict[str, list[dict[str, Any]]] = {}
    for run, theirs in zip(runs.values(), other, strict=True):
        for inv in run["violated"]:
            if inv not in theirs["violated"]:
                out.setdefault(inv, []).append(run)
    return {inv: sorted(found, key=lambda r: r["run"]) for inv, found in out.items()}


def _shrunk(inv: str, found: list[dict[str, Any]], spec_b: RunSpec, spec_c: RunSpec,
            base: Side, cand: Side, shrink_runs: int, out_dir: Path | None) -> Change:
    """Shrink the first run that opens ``inv``: it must keep failing ``inv`` on the
    candidate and keep passing it on the baseline."""
    first = found[0]

    def judge(scen: Scenario, sched: Sequence[Decision]) -> bool:
        item = [(scen, tuple(sched))]
        if inv not in cand.call({"op": "replay", "spec": spec_c, "items": item}
                                )["results"][0]["violated"]:
            return False
        return inv not in base.call({"op": "replay", "spec": spec_b, "items": item}
                                    )["results"][0]["violated"]

    shrunk = shrink(spec_c, first["schedule"], frozenset({inv}), max_runs=shrink_runs,
                    judge=judge)
    final = spec_c.with_scenario(shrunk.scenario)
    change = Change(inv, len(found), first["run"], None, shrunk.schedule,
                    len(shrunk.scenario.workload.requests), shrunk.runs)
    if out_dir is not None:
        path = out_dir / (safe_name(f"{spec_c.scenario.name}__{spec_c.policy}__opens-{inv}__"
                                    f"seed{spec_c.seed}__{spec_c.backend.file_tag}") + ".json")
        rec = cand.call({"op": "record", "spec": final, "schedule": shrunk.schedule,
                         "path": str(path), "shrunk_from": len(first["schedule"]),
                         "found_by": {"diff": {"opens": inv, "run": first["run"],
                                               "baseline": spec_b.backend.as_dict()}}})
        change.counterexample = rec["path"]
        change.replay = replay_command(rec["path"], spec_c.policy, "vllm",
                                       spec_c.backend.cli_args())
        change.reach = rec["reaches"].get(inv)
    else:
        rerun = cand.call({"op": "replay", "spec": final, "items": [(None, shrunk.schedule)]})
        change.reach = rerun["results"][0]["reaches"].get(inv)
    return change
