"""The policy matrix: every chosen scenario explored under every chosen policy, same seeds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from racesim.explore import ExploreResult, explore
from racesim.scenarios import Scenario

__all__ = ["MatrixResult", "run_matrix"]


@dataclass
class MatrixResult:
    scenarios: list[str]
    policies: list[str]
    cells: list[ExploreResult]

    @staticmethod
    def _cell(doc: dict[str, Any]) -> dict[str, Any]:
        """A cell is its exploration's evidence, minus what every cell shares."""
        return {k: doc[k] for k in _CELL_KEYS}

    def document(self) -> dict[str, Any]:
        return {
            "scenarios": self.scenarios,
            "policies": self.policies,
            "cells": [self._cell(c.document()) for c in self.cells],
        }


_CELL_KEYS = ("scenario", "policy", "runs", "violating_runs", "invariants", "first_violation_run",
              "baseline_violations", "distinct_traces", "coverage", "confidence", "counterexample")


def run_matrix(scenarios: Sequence[Scenario], policies: Sequence[str], *, budget: int,
               seed: int, strategy: str, workers: int | None, dask: str | None,
               skip: Sequence[str], out_dir: Path | None,
               on_cell: Callable[[int, int, ExploreResult | None], None] | None = None,
               progress: Callable[[int, int, int], None] | None = None) -> MatrixResult:
    cells = []
    total = len(scenarios) * len(policies)
    for scen in scenarios:
        for policy in policies:
            if on_cell is not None:
                on_cell(len(cells), total, None)
            res = explore(scen, policy, strategy=strategy, budget=budget, seed=seed,
                          workers=workers, dask=dask, skip=skip, out_dir=out_dir,
                          progress=progress)
            cells.append(res)
            if on_cell is not None:
                on_cell(len(cells), total, res)
            if res.interrupted:
                return MatrixResult([s.name for s in scenarios], list(policies), cells)
    return MatrixResult([s.name for s in scenarios], list(policies), cells)
