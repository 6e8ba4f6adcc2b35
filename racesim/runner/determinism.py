"""``--check-determinism``: run one schedule twice and show the first event where they differ.

racesim's contract is that a scenario, policy, seed and schedule give a byte-identical trace.
On the vllm backend that also rests on vLLM's code (no wall clock, no unseeded randomness that
reaches the trace); this check makes the second run and compares the two traces event by event.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from racesim.engine_model import RunResult
from racesim.sim.trace import TraceEvent

__all__ = ["DeterminismCheck", "check_determinism"]


@dataclass(frozen=True, slots=True)
class DeterminismCheck:
    """Two runs of one schedule: their hashes and, when they differ, the first differing
    position and each run's event there (None: that trace had already ended)."""

    first_hash: str
    second_hash: str
    index: int | None = None
    first: TraceEvent | None = None
    second: TraceEvent | None = None

    @property
    def same(self) -> bool:
        return self.index is None and self.first_hash == self.second_hash

    def lines(self) -> list[str]:
        """What to print: one line when the runs agree, else the first difference."""
        if self.same:
            return [f"determinism: two runs of the schedule gave the same trace "
                    f"({self.first_hash[:16]}...)"]
        out = [f"determinism: the two runs DIFFER (trace hashes {self.first_hash[:16]}... and "
               f"{self.second_hash[:16]}...)"]
        if self.index is not None:
            out.append(f"first differing event: #{self.index}")
            out.append(f"  run 1: {_show(self.first)}")
            out.append(f"  run 2: {_show(self.second)}")
        return out

    def as_dict(self) -> dict[str, object]:
        return {"same": self.same, "trace_hashes": [self.first_hash, self.second_hash],
                "first_difference": None if self.index is None else {
                    "index": self.index,
                    "run1": self.first.as_list() if self.first is not None else None,
                    "run2": self.second.as_list() if self.second is not None else None}}


def _show(ev: TraceEvent | None) -> str:
    if ev is None:
        return "(the trace had already ended)"
    return json.dumps(ev.as_list(), ensure_ascii=False, default=str)


def check_determinism(first: RunResult, again: Callable[[], RunResult],
                      asked: bool = True) -> DeterminismCheck | None:
    """Compare ``first`` (a run with its trace kept) with ``again()``, a second run of the same
    spec and schedule (None when not ``asked``: ``--check-determinism`` was not given)."""
    if not asked:
        return None
    second = again()
    a, b = first.trace, second.trace
    for i in range(max(len(a), len(b))):
        ea = a[i] if i < len(a) else None
        eb = b[i] if i < len(b) else None
        if ea is None or eb is None or ea.as_list() != eb.as_list():
            return DeterminismCheck(first.trace_hash, second.trace_hash, i, ea, eb)
    return DeterminismCheck(first.trace_hash, second.trace_hash)
