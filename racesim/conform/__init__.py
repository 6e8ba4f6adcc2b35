"""Conformance: the model against vLLM's own engine code, schedule by schedule.

For each scenario and policy, a strategy draws schedules on the model (run 0 is the unperturbed
baseline, as in ``explore``); each exact schedule is then replayed on the vLLM backend, and the
two runs are compared on what a user of vLLM can observe and what the checker concludes:

- per client request: tokens received, finish reason, and whose tokens they were (each token's
  incarnation mapped back to the client that sent it, so crosstalk shows as another client's
  number);
- invariant verdicts: the violated invariants' names, each with its reach;
- engine death: which engines reached a fatal error.

Any difference is a mismatch. A mismatch is saved as a counterexample file (it replays on either
backend) and is *known* when :mod:`racesim.conform.known` explains every difference in it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from racesim.conform.frontend import (
    explain_frontend,
    frontend_skip,
    shared_occurrences,
    split_side,
    with_frontend,
)
from racesim.conform.outcome import Outcome, differences, outcome_of
from racesim.documents import (
    Counterexample,
    free_path,
    safe_file_name,
    violation_dicts,
    write_claimed,
)
from racesim.engine_model import RunResult
from racesim.engine_model.checker import check_invariant_names
from racesim.engine_model.policies import policy_spec
from racesim.engine_model.versions import model_gap
from racesim.runner.backend import refuse_model_runner
from racesim.runner.engines import check_engine
from racesim.explore.parallel import executor, ordered_map
from racesim.runner import import_from_cwd, run_scenario, vllm_frontend
from racesim.scenarios import Scenario
from racesim.sim import Decision, InputError
from racesim.sim.strategies import StrategyConfig, make_strategy

__all__ = ["ConformResult", "Mismatch", "conform", "STRATEGIES", "ENGINES", "LIFECYCLE",
           "lifecycle", "check_backend", "check_comparable", "model_only", "run_on",
           "mismatch_path"]

#: The strategies that draw a schedule per run index (hypothesis drives its own search).
STRATEGIES = ("random", "pct", "grid")
#: The reference side first: the model is checked against vLLM's code.
ENGINES = ("model", "vllm")

#: The lifecycle real vLLM has on each profile: IDs as given before #15326 (0.8), and internal
#: IDs with an 8-hex random suffix on 0.33 (#27987, ``v1/engine/input_processor.py:354-371``).
LIFECYCLE: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "0.8": ("buggy", ()),
    "0.9": ("buggy", ()),
    "0.10": ("buggy", ()),  # one ID end to end before 0.14 (v1/engine/processor.py)
    "0.11": ("buggy", ()),
    "0.14": ("internal-id", ()),  # InputProcessor.assign_request_id from 0.14
    "0.20": ("internal-id", ()),
    "0.33": ("internal-id", ()),
}

Progress = Callable[[int, int, int], None]


def lifecycle(profile: str) -> tuple[str, dict[str, str]]:
    """The policy (and options) vLLM itself has on ``profile``: conform's default."""
    policy, options = LIFECYCLE.get(profile, LIFECYCLE["0.33"])
    return policy, dict(options)


def _uses_vllm(engines: Sequence[str]) -> bool:
    return any(split_side(e)[0] == "vllm" for e in engines)


def check_backend(scenario: Scenario) -> None:
    """An InputError, before any work, when the vLLM backend cannot run ``scenario``'s profile
    here (another release, or vLLM not installed: the line names the install command)."""
    check_engine("vllm", scenario.vllm)


def check_comparable(scenario: Scenario) -> None:
    """One InputError line when the model cannot run ``scenario`` at all, so there is nothing
    to compare (conform always runs the model's side)."""
    if (gap := model_gap(scenario.workload)) is not None:
        raise InputError(f"{scenario.name}: conform compares the model with vLLM, and the "
                         f"model does not run this scenario ({gap})")


def model_only(scenario: Scenario, policy: str, options: Mapping[str, str],
               engines: Sequence[str]) -> str | None:
    """Why this cell runs on the model only (none bundled today), else None. A policy the
    vllm backend cannot express is bad input: one InputError line. Comparing frontends
    (``vllm@asyncllm``), a cell vLLM's own frontend does not run is left out likewise."""
    if not _uses_vllm(engines):
        return None
    from racesim.engine_vllm import model_only_reason

    why = model_only_reason(scenario.workload)
    if why is not None:
        return why
    from racesim.runner.engines import installed_vllm

    release = installed_vllm()
    if any(split_side(e)[1] == "asyncllm" for e in engines):
        if (why := frontend_skip(scenario.workload, policy, release)) is not None:
            return why
    for engine, asked in map(split_side, engines):
        if engine == "vllm":  # as run_scenario will check it, before any run
            vllm_frontend(scenario.workload, policy, options, release,
                          with_frontend(engine, asked).frontend)
    return None


def run_on(engine: str, scenario: Scenario, policy: str, **kwargs: Any) -> RunResult:
    """``run_scenario`` on one backend (tests replace this to perturb one side); a side
    ``vllm@<frontend>`` is the vllm backend with that frontend (:mod:`.frontend`)."""
    backend, frontend = split_side(engine)
    return run_scenario(scenario, policy, engine=with_frontend(backend, frontend), **kwargs)


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One schedule on which the two backends disagree."""

    scenario: str
    policy: str
    options: Mapping[str, str]
    vllm_profile: str
    seed: int
    run: int
    schedule: tuple[Decision, ...]
    outcomes: tuple[Outcome, Outcome]
    differences: tuple[str, ...]
    #: the cause from the known-mismatch table, None when it is not listed
    known: str | None = None
    path: str | None = None

    def document(self) -> dict[str, Any]:
        model, vllm = self.outcomes
        return {"scenario": self.scenario, "policy": self.policy, "vllm_profile": self.vllm_profile,
                "seed": self.seed, "run": self.run,
                "schedule": [d.as_dict() for d in self.schedule],
                "model": model.as_dict(), "vllm": vllm.as_dict(),
                "differences": list(self.differences), "known": self.known, "path": self.path}


@dataclass
class ConformResult:
    """Every compared run of one ``conform`` call, and the mismatches among them."""

    scenarios: list[str]
    policies: list[str]
    parameters: dict[str, Any]
    runs: int = 0
    agreeing_runs: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    #: runs per (scenario, policy) cell, and the cell's mismatching runs
    cells: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0
    interrupted: bool = False

    @property
    def unlisted(self) -> list[Mismatch]:
        return [m for m in self.mismatches if m.known is None]

    def document(self) -> dict[str, Any]:
        return {"runs": self.runs, "agreeing_runs": self.agreeing_runs,
                "mismatches": [m.document() for m in self.mismatches],
                "unlisted_mismatches": len(self.unlisted),
                "scenarios": self.scenarios, "policies": self.policies,
                "parameters": self.parameters, "cells": self.cells,
                "elapsed_s": round(self.elapsed_s, 3), "interrupted": self.interrupted}


@dataclass(frozen=True, slots=True)
class _Context:
    """What a worker needs to run schedule i of one cell on both backends (pickled per batch)."""

    scenario: Scenario
    policy: str
    options: tuple[tuple[str, str], ...]
    seed: int
    strategy: str
    config: StrategyConfig
    skip: tuple[str, ...]
    engines: tuple[str, str]


def _both(ctx: _Context, runs: Sequence[int]) -> list[tuple[int, tuple[Decision, ...],
                                                                 Outcome, Outcome]]:
    """Each run drawn on the first engine, its exact schedule replayed on the second."""
    strategy = make_strategy(ctx.strategy, ctx.config)
    options = dict(ctx.options)
    first, second = ctx.engines
    out = []
    for i in runs:
        decider = strategy.decider(i) if i > 0 else None
        a = run_on(first, ctx.scenario, ctx.policy, options=options, seed=ctx.seed,
                   decider=decider, skip=ctx.skip, hash_trace=False)
        b = run_on(second, ctx.scenario, ctx.policy, options=options, seed=ctx.seed,
                   schedule=a.schedule, skip=ctx.skip, hash_trace=False)
        out.append((i, a.schedule, outcome_of(a), outcome_of(b)))
    return out


def conform(scenarios: Sequence[Scenario], policies: Sequence[tuple[str, Mapping[str, str]]], *,
            budget: int = 100, strategy: str = "random", seed: int = 0,
            workers: int | None = 1, skip: Sequence[str] = (), out_dir: Path | None = None,
            progress: Progress | None = None,
            known: Callable[..., str | None] | None = None,
            engines: tuple[str, str] = ENGINES,
            on_cell: Callable[[int, int, dict[str, Any] | None], None] | None = None,
            ) -> ConformResult:
    """Compare ``budget`` schedules per (scenario, policy) on the two ``engines``.

    ``on_cell(done, total, cell)`` is called as each (scenario, policy) cell starts (``cell``
    None; ``done`` cells finished of ``total``) and when it ends (its document).

    ``known(scenario, policy, differences, engine_died=, release=)`` gives a listed mismatch's cause
    (default: the table in :mod:`racesim.conform.known`)."""
    if strategy not in STRATEGIES:
        raise InputError(f"--strategy {strategy!r}: conform draws schedules with "
                         f"{', '.join(STRATEGIES)}")
    if budget < 1:
        raise InputError(f"--budget must be >= 1, got {budget}")
    skip = tuple(sorted(check_invariant_names(tuple(skip))))
    if _uses_vllm(engines):
        refuse_model_runner("racesim conform", "compares the model with vLLM's own code, "
                            "its runner included")
    for scen in scenarios:
        if "model" in engines:  # the frontend sides both run vLLM's engine
            check_comparable(scen)
    for name, opts in policies:
        import_from_cwd(name)
        policy_spec(name)
        for scen in scenarios:
            model_only(scen, name, opts, engines)
            if _uses_vllm(engines):
                check_backend(scen)
    if known is None and split_side(engines[1])[1] is not None:
        known = explain_frontend
    elif known is None:
        from racesim.conform.known import explain as known
    started = time.monotonic()
    result = ConformResult([s.name for s in scenarios], [p for p, _ in policies], {
        "budget": budget, "strategy": strategy, "seed": seed, "skip": list(skip),
        "vllm": sorted({s.vllm for s in scenarios}), "engines": list(engines)})
    total = budget * sum(1 for scen in scenarios for name, opts in policies
                         if model_only(scen, name, opts, engines) is None)
    try:
        with executor(workers, None) as ex:
            cells = len(scenarios) * len(policies)
            for scen in scenarios:
                for policy, options in policies:
                    if on_cell is not None:
                        on_cell(len(result.cells), cells, None)
                    _cell(result, scen, policy, dict(options), budget, strategy, seed, skip,
                          engines, ex, out_dir, known, progress, total)
                    if on_cell is not None:
                        on_cell(len(result.cells), cells, result.cells[-1])
    except KeyboardInterrupt:
        result.interrupted = True
    result.elapsed_s = time.monotonic() - started
    return result


def _cell(result: ConformResult, scen: Scenario, policy: str, options: dict[str, str],
          budget: int, strategy: str, seed: int, skip: tuple[str, ...],
          engines: tuple[str, str], ex: Any, out_dir: Path | None,
          known: Callable[..., str | None],
          progress: Progress | None, total: int) -> None:
    cell: dict[str, Any] = {"scenario": scen.name, "policy": policy, "runs": 0,
                            "mismatching_runs": 0, "unlisted": 0, "model_only": None,
                            # what the compared runs covered: races, not only quiet runs
                            "violating_runs": 0, "engine_death_runs": 0}
    result.cells.append(cell)
    why = model_only(scen, policy, options, engines)
    if why is not None:
        cell["model_only"] = why
        return
    baseline = run_on(engines[0], scen, policy, options=options, seed=seed, skip=skip,
                      retain_trace=False, hash_trace=False)
    occurrences = baseline.occurrences
    other = run_on(engines[1], scen, policy, options=options, seed=seed, skip=skip,
                   retain_trace=False, hash_trace=False)
    cell["frontends"] = [baseline.frontend, other.frontend]
    if split_side(engines[0])[1] != split_side(engines[1])[1] \
            or baseline.frontend != other.frontend:
        # two frontends (asked for, or vLLM's own as the vllm backend's default): perturb
        # only the points both pass, since each frontend names its own await points
        occurrences = shared_occurrences(occurrences, other.occurrences)
    config = StrategyConfig(occurrences=occurrences,
                            scale=scen.workload.engine.step_time, seed=seed)
    size = make_strategy(strategy, config).size()
    runs = budget if size is None else min(budget, size + 1)
    ctx = _Context(scen, policy, tuple(sorted(options.items())), seed, strategy, config, skip,
                   engines)
    for i, schedule, a, b in ordered_map(_both, ctx, range(runs), ex):
        result.runs += 1
        cell["runs"] += 1
        cell["violating_runs"] += bool(a.invariants)
        cell["engine_death_runs"] += bool(a.dead_engines)
        diffs = differences(a, b)
        if not diffs:
            result.agreeing_runs += 1
        else:
            cause = known(scen.name, policy, diffs,
                          engine_died=bool(a.dead_engines and b.dead_engines),
                          release=scen.vllm)
            m = Mismatch(scen.name, policy, options, scen.vllm, seed, i, schedule, (a, b),
                         tuple(diffs), cause)
            if out_dir is not None:
                m = _save(m, scen, skip, engines, strategy, out_dir)
            result.mismatches.append(m)
            cell["mismatching_runs"] += 1
            cell["unlisted"] += cause is None
        if progress is not None:
            progress(result.runs, total, len(result.unlisted))


def mismatch_path(out_dir: Path, m: Mismatch, strategy: str,
                  engines: tuple[str, str] = ENGINES) -> Path:
    """One file per (scenario, policy, strategy, seed, run): conform runs never collide
    (a comparison of frontends has its own prefix)."""
    kind = "conform-frontend" if split_side(engines[1])[1] is not None else "conform"
    stem = safe_file_name(f"{kind}__{m.scenario}__{m.policy}__{strategy}__seed{m.seed}"
                          f"__run{m.run}")
    return out_dir / f"{stem}.json"


def _ours(data: Any) -> bool:
    """Whether a file's JSON is one an earlier ``conform`` wrote (so replacing it loses nothing)."""
    return isinstance(data, dict) and isinstance(data.get("found_by"), dict) \
        and data["found_by"].get("by") == "conform"


def _save(m: Mismatch, scen: Scenario, skip: tuple[str, ...], engines: tuple[str, str],
          strategy: str, out_dir: Path) -> Mismatch:
    """The mismatch as a counterexample file: its drawn schedule and the reference side's
    (vLLM's) run, which the file's trace hash is; both sides are re-run with their trace hashed
    (exploration runs skip hashing)."""
    runs = [run_on(e, scen, m.policy, options=m.options, seed=m.seed, schedule=m.schedule,
                   skip=skip) for e in engines]
    outcomes = (dataclasses.replace(m.outcomes[0], trace_hash=runs[0].trace_hash),
                dataclasses.replace(m.outcomes[1], trace_hash=runs[1].trace_hash))
    r = runs[1]
    cx = Counterexample(scen, m.policy, dict(m.options), m.seed, m.schedule, skip,
                        tuple(violation_dicts(r)), r.trace_hash, None,
                        {"by": "conform", "run": m.run,
                         "strategy": strategy if m.run > 0 else "baseline",
                         "differences": list(m.differences),
                         "outcomes": {engines[0]: outcomes[0].as_dict(),
                                      engines[1]: outcomes[1].as_dict()},
                         "known": m.known},
                        r.reach().reach if r.violations else None,
                        engine=split_side(engines[1])[0],
                        frontend=r.frontend if split_side(engines[1])[0] == "vllm" else "")
    first = mismatch_path(out_dir, m, strategy, engines)
    path = write_claimed(free_path(first, _ours), cx, _ours, first=first)
    return dataclasses.replace(m, outcomes=outcomes, path=str(path))
