"""The policy matrix: every chosen scenario explored under every chosen policy, same seeds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from racesim.explore import ExploreResult, explore
from racesim.reports.verdict import RACE, found_words, verdict
from racesim.runner import Backend, PolicyError, RunSpec, as_backend
from racesim.scenarios import Scenario

__all__ = ["MatrixResult", "run_matrix", "DEFAULT_POLICIES", "table_groups"]

#: The matrix's policies when none is named: the shipped configuration first, then the other
#: configurations (internal-id is shipped on 0.14 and later, same traces: -p internal-id runs
#: it). On the vllm backend only the policies that are vLLM's own code.
DEFAULT_POLICIES = {"model": ("shipped", "buggy", "abort-scope", "engine-final"),
                    "vllm": ("shipped", "buggy")}

SHIPPED_TITLE = ("What each release ships: {releases} as shipped (policy shipped: IDs as the "
                 "release assigns them, internal 'ID-<8 hex>' from 0.14; abort pops frontend "
                 "state, then sends the ABORT, as every release 0.8-0.33 does)")
OTHER_TITLE = ("Other configurations (not a release's default: buggy = IDs as given, "
               "VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1 on 0.20/0.33; abort-scope and "
               "engine-final change vLLM's abort code; each with the IDs in its column)")


def table_groups(policies: Sequence[str], profiles: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The matrix's tables in order: the shipped configuration of each release profile first
    (when it ran), then the other configurations. Each is {"title", "policies"}."""
    from racesim.engine_model.versions import RELEASE_OF

    first = [p for p in policies if p == "shipped"]
    rest = [p for p in policies if p != "shipped"]
    groups = []
    if first:
        releases = ", ".join(f"vLLM {RELEASE_OF.get(v, v)}" for v in profiles) or "each release"
        groups.append({"title": SHIPPED_TITLE.format(releases=releases), "policies": first})
    if rest:
        groups.append({"title": OTHER_TITLE if first else "Results", "policies": rest})
    return groups


@dataclass
class MatrixResult:
    """Every cell of one matrix run, with the parameters it ran with."""

    scenarios: list[str]
    policies: list[str]
    cells: list[ExploreResult]
    #: what every cell shared: budget, strategy, seed, skip, time limit, racesim version
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def interrupted(self) -> bool:
        return any(c.interrupted for c in self.cells)

    @property
    def errors(self) -> list[str]:
        return [c.error for c in self.cells if c.error]

    @staticmethod
    def _cell(doc: dict[str, Any]) -> dict[str, Any]:
        """A cell is its exploration's evidence, minus what every cell shares, and its verdict:
        the reach is its shrunk counterexample's (shrinking prefers a live one)."""
        cell = {k: doc[k] for k in _CELL_KEYS}
        cx = doc["counterexample"]
        cell["reach"] = cx["reach"] if cx is not None else None
        if verdict(doc["baseline_violations"]) == RACE:
            cell["reach"] = doc["baseline_reach"]  # a race with no delay at all
        # "not found in N runs" unless the search was exhaustive: never a bare "safe"
        cell["label"] = found_words(doc["invariants"], cell["reach"], doc["runs"],
                                    doc["exhaustive"])
        if doc.get("unverified"):
            cell["label"] += " (unverified)"  # P/D on 0.8: see cell["unverified"]
        return cell

    def document(self) -> dict[str, Any]:
        return {
            "scenarios": self.scenarios,
            "policies": self.policies,
            "tables": table_groups(self.policies, self.parameters.get("vllm") or ()),
            "parameters": self.parameters,
            "cells": [self._cell(c.document()) for c in self.cells],
        }


_CELL_KEYS = ("scenario", "vllm", "policy", "ids", "runs", "violating_runs", "racing_runs",
              "accounting_runs", "invariants", "verdict",
              "first_violation_run", "baseline_violations", "distinct_traces", "coverage",
              "confidence", "counterexample", "interrupted", "stopped_early", "warnings",
              "error", "unverified", "reached", "exhaustive")


def cell_outcome(res: ExploreResult) -> str:
    """One cell's verdict in a few words, for a progress line: "live race (engine-alive)"."""
    if res.error:
        return f"error: {res.error}"
    cell = MatrixResult._cell(res.document())
    invariants = f" ({', '.join(cell['invariants'])})" if cell["invariants"] else ""
    return (f"{cell['label']}{invariants}, {res.runs} runs"
            + (" (interrupted)" if res.interrupted else ""))


def run_matrix(scenarios: Sequence[Scenario], policies: Sequence[str], *, budget: int,
               seed: int, strategy: str, workers: int | None, dask: str | None,
               skip: Sequence[str], out_dir: Path | None,
               on_cell: Callable[[int, int, ExploreResult | None], None] | None = None,
               progress: Callable[[int, int, int], None] | None = None,
               time_limit: float | None = None,
               engine: str | Backend = "model", ids: str | None = None) -> MatrixResult:
    """Explore every cell; ``time_limit`` bounds each cell's exploration (seconds). A user
    policy that raises marks its cells with the error and the matrix goes on."""
    from importlib.metadata import PackageNotFoundError, version

    backend = as_backend(engine)
    try:
        racesim_version = version("racesim")
    except PackageNotFoundError:  # a source tree that was never installed
        racesim_version = "unknown"
    result = MatrixResult([s.name for s in scenarios], list(policies), [], {
        "vllm": sorted({s.vllm for s in scenarios}), "budget": budget, "strategy": strategy,
        "seed": seed, "skip": sorted(skip), "time_limit": time_limit,
        "racesim": racesim_version, "engine": backend.engine, "ids": ids,
        **({"vllm_tree": backend.tree_record()} if backend.has_tree else {})})
    total = len(scenarios) * len(policies)
    for scen in scenarios:
        for policy in policies:
            if on_cell is not None:
                on_cell(len(result.cells), total, None)
            try:
                res = explore(scen, policy, strategy=strategy, budget=budget, seed=seed,
                              workers=workers, dask=dask, skip=skip, out_dir=out_dir,
                              progress=progress, time_limit=time_limit, engine=backend,
                              ids=ids)
            except PolicyError as exc:
                res = ExploreResult(RunSpec(scen, policy, (), seed, tuple(skip), backend, ids),
                                    strategy, error=str(exc))
            result.cells.append(res)
            if on_cell is not None:
                on_cell(len(result.cells), total, res)
            if res.interrupted:
                return result
    return result
