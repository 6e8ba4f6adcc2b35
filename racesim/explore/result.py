"""What one exploration found (:class:`ExploreResult`) and where its counterexample file goes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from racesim.documents import Counterexample, safe_file_name
from racesim.engine_model import RunResult
from racesim.engine_model.versions import unverified_note
from racesim.reports.provenance import components_doc
from racesim.reports.verdict import verdict
from racesim.runner.summary import RunSummary
from racesim.runner import RunSpec
from racesim.scenarios import Scenario

__all__ = ["ExploreResult", "counterexample_path", "unshrunk_path"]


@dataclass
class ExploreResult:
    """What one exploration found: counts, coverage, and its (shrunk) counterexample."""

    spec: RunSpec
    strategy: str
    runs: int = 0
    violating_runs: int = 0
    #: runs that broke a safety or liveness invariant (a race)
    racing_runs: int = 0
    #: runs that broke only accounting invariants (metrics-exact)
    accounting_runs: int = 0
    elapsed_s: float = 0.0
    distinct_traces: int = 0
    #: ``distinct_traces`` is a sketch's estimate (past 2**18 distinct schedules)
    distinct_estimated: bool = False
    coverage: dict[str, int] = field(default_factory=dict)
    baseline_violations: tuple[str, ...] = ()
    invariants: tuple[str, ...] = ()
    strategy_info: dict[str, Any] = field(default_factory=dict)
    counterexample: Counterexample | None = None
    counterexample_path: str | None = None
    #: the first run violating something beyond the baseline (else the first violating run)
    found_run: RunSummary | None = None
    #: the shrunk counterexample's run, trace kept (for reports)
    final_run: RunResult | None = None
    shrink_runs: int = 0
    interrupted: bool = False
    #: "all" await points, or only the "live" ones (live and yield widths) of the profile
    reach: str = "all"
    #: the baseline's reach (only the scenario's fixed delays can make it latent)
    baseline_reach: str = "live"
    #: whose frontend ran and why the model's (``RunResult.frontend``, ``frontend_note``)
    frontend: tuple[str, str] = ("model", "")
    #: a user policy raised (one line, file:line); the cell has no verdict
    error: str | None = None
    #: what makes two explorations the same (a file one wrote may be replaced by the other)
    key: dict[str, Any] = field(default_factory=dict)
    #: where its counterexample goes (claimed at the start: never a file another run wrote)
    out_path: Path | None = None
    #: what the user should know about how it ran (a [delays] entry no run reached, ...)
    warnings: list[str] = field(default_factory=list)
    #: why it made fewer runs than its budget (None: it did not stop early)
    stopped_early: str | None = None
    #: the invariant a caller looks for (``racesim corpus``), the first run that violated it
    #: and the seconds from the start to that run's end
    target: str | None = None
    target_run: int | None = None
    target_s: float | None = None
    #: the ``.unshrunk.json`` stand-in this exploration wrote (removed once shrunk)
    stand_in: Path | None = None
    #: what the search reached (``racesim.explore.reached``); {} until it ran
    reached: dict[str, Any] = field(default_factory=dict)
    #: how many distinct schedules the strategy has (grid: bounded), None when unbounded
    space: int | None = None

    @property
    def exhaustive(self) -> bool:
        """The search tried every schedule of a bounded space (the grid, to its end)."""
        return (self.space is not None and self.runs >= self.space and not self.interrupted
                and self.error is None)

    def finding(self) -> str:
        """The result in words: "live race", "latent hazard", "accounting gap", or, with
        nothing found, "not found in N runs" ("safe" only for an exhaustive search, over the
        bounded space it names)."""
        from racesim.reports.verdict import found_words

        return found_words(self.invariants, self._reach(), self.runs, self.exhaustive)

    def _reach(self) -> str | None:
        if verdict(self.baseline_violations) == "race":
            return self.baseline_reach
        return self.counterexample.reach if self.counterexample is not None else None

    def ours(self, data: Any) -> bool:
        """``data`` (a counterexample file's JSON) was written by this same exploration, asked
        for again: replacing it loses nothing."""
        return isinstance(data, dict) and isinstance(data.get("found_by"), dict) \
            and data["found_by"].get("exploration") == self.key

    def first_path(self, out_dir: Path) -> Path:
        """The name this exploration's counterexample takes when no other file has it."""
        spec = self.spec
        from racesim.engine_model.policies import policy_spec

        tag = spec.policy
        if spec.ids is not None and spec.id_scheme != policy_spec(spec.policy).ids:
            tag += f"+ids-{spec.id_scheme}"  # not the policy's default: say so in the name
        return counterexample_path(out_dir, spec.scenario.name, tag, self.strategy,
                                   spec.seed, spec.backend.file_tag)

    @property
    def scenario(self) -> Scenario:
        return self.spec.scenario

    @property
    def policy(self) -> str:
        return self.spec.policy

    @property
    def options(self) -> dict[str, str]:
        return self.spec.option_dict

    @property
    def seed(self) -> int:
        return self.spec.seed

    @property
    def skip(self) -> tuple[str, ...]:
        return self.spec.skip

    @property
    def engine(self) -> str:
        """The backend every run used: "model" or "vllm"."""
        return self.spec.engine

    @property
    def first_violation_run(self) -> int | None:
        return self.found_run.run if self.found_run is not None else None

    def confidence(self) -> dict[str, Any]:
        """For a clean result: the failure probability per run it bounds (95 %)."""
        n = self.runs
        clean = self.violating_runs == 0 and n > 0
        out: dict[str, Any] = {"runs": n, "rule_of_three": 3.0 / n if clean else None}
        bound = self.strategy_info.get("bound")
        if clean and isinstance(bound, float) and bound > 0:
            out["pct_bound"] = bound
            out["pct_confidence"] = 1.0 - math.exp(n * math.log1p(-min(bound, 1.0 - 1e-12)))
        else:
            out["pct_bound"] = None
        return out

    def document(self) -> dict[str, Any]:
        cx = None
        if self.counterexample is not None:
            c = self.counterexample
            cx = {"seed": c.seed, "schedule": [d.as_dict() for d in c.schedule],
                  "violations": list(c.violations), "trace_hash": c.trace_hash,
                  "shrunk_from": c.shrunk_from, "shrunk": c.shrunk_from is not None,
                  "path": self.counterexample_path, "reach": c.reach,
                  "requests": len(c.scenario.workload.requests),
                  "found_at_run": self.found_run.run if self.found_run else None}
        return {
            "scenario": self.scenario.name,
            "policy": self.policy,
            "policy_options": self.options,
            "ids": self.spec.id_scheme if self.error is None else self.spec.ids,
            "vllm": self.scenario.vllm,
            "engine": self.engine,
            **({"vllm_tree": self.spec.backend.tree_record()} if self.spec.backend.has_tree
               else {}),
            "search": self.reach,
            "strategy": self.strategy,
            "seed": self.seed,
            "runs": self.runs,
            "violating_runs": self.violating_runs,
            "racing_runs": self.racing_runs,
            "accounting_runs": self.accounting_runs,
            "first_violation_run": self.first_violation_run,
            "elapsed_s": round(self.elapsed_s, 3),
            "distinct_traces": self.distinct_traces,
            "distinct_traces_estimated": self.distinct_estimated,
            "coverage": self.coverage,
            "reached": self.reached,
            "exhaustive": self.exhaustive,
            "finding": self.finding(),
            "baseline_violations": list(self.baseline_violations),
            "baseline_reach": self.baseline_reach,
            "unverified": unverified_note(self.scenario.vllm,
                                          self.scenario.workload.topology) or None,
            "invariants": list(self.invariants),
            "verdict": verdict(self.invariants),
            "pct": self.strategy_info if self.strategy == "pct" else None,
            "confidence": self.confidence(),
            "counterexample": cx,
            "interrupted": self.interrupted,
            "stopped_early": self.stopped_early,
            "warnings": list(self.warnings),
            "error": self.error,
            "components": components_doc(self.engine, self.scenario.workload.topology,
                                         *self.frontend, self.spec.backend.runner or ""),
        }


def counterexample_path(out_dir: Path, scenario: str, policy: str, strategy: str,
                        seed: int, engine: str = "model") -> Path:
    """The file name of (scenario, policy, strategy, seed, backend). ``explore`` takes the next
    free ``-2``, ``-3``... name when another exploration (another budget, profile, reach...)
    already wrote it, so no exploration overwrites another's."""
    on = "" if engine == "model" else f"__{engine}"
    return out_dir / f"{safe_file_name(f'{scenario}__{policy}__{strategy}__seed{seed}{on}')}.json"


def unshrunk_path(path: Path) -> Path:
    """Where a found, not yet shrunk, counterexample waits: never over a shrunk file."""
    return path.with_name(path.stem + ".unshrunk.json")
