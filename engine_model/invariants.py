"""The invariant catalogue: names, meanings, and the violation record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from racesim.sim.errors import InputError

__all__ = ["RUNNER_INVARIANTS", "INVARIANTS", "SAFETY_INVARIANTS", "ACCOUNTING_INVARIANTS", "Violation",
           "check_invariant_names"]

INVARIANTS: dict[str, str] = {
    "unique-live-id": "an engine never holds two live incarnations under one ID (live: waiting, "
                      "running, in a step in flight, or held for transfer)",
    "frontend-covers-engine": "every running engine request is tracked by its frontend, has an "
                              "ABORT issued and not yet applied, or is a finished prefill request "
                              "held for transfer",
    "kv-ownership": "no block owned by two incarnations; no block freed while its owner still "
                    "runs or is held for transfer; no double free; P/D reads only the blocks "
                    "of the prefill it names",
    "no-leak": "at the end every block is free and every ID-keyed table is empty, except for "
               "clients still waiting and holds whose timeout has not passed",
    "one-terminal-output": "every client request gets exactly one terminal output, and nothing "
                           "after it",
    "no-crosstalk": "every token a client receives was generated for that incarnation (and, "
                    "under async scheduling, from its own previous token)",
    "abort-precision": "an abort ends only the incarnations that were live (or whose ADD was in "
                       "flight) under its ID when it was issued",
    "abort-isolation": "a client's abort (a router's /abort_requests, a disconnect) never ends "
                       "another client's request",
    "orphan-run": "no engine keeps stepping a request whose client's abort or cancel ended "
                  "nothing of its own, while its frontend still tracks it",
    "no-hang": "every client request terminates before the horizon",
    "engine-alive": "no engine reached a fatal error",
    "metrics-exact": "every request a frontend accepted and ended (not by an engine error) is "
                     "counted once in finished-request stats",
    "kv-destination": "a remote KV read completes only into blocks that the reading incarnation "
                      "still owns (P/D decode side)",
    "runner-books": "after each step the model runner's requests and batch rows are exactly the "
                    "scheduler's live requests (or ones it finished and has not yet told the "
                    "runner), each once, and each runner state is the incarnation the "
                    "scheduler holds under its ID (vllm backend, 0.11+)",
    "input-integrity": "every token of a request's model input belongs to its incarnation (the "
                       "fake vocabulary tells) and equals its true sequence where known, at the "
                       "positions that incarnation's computed tokens give, after preemption and "
                       "recompute too (vllm backend, 0.11+)",
    "stranded-hold": "no prefill-side hold outlives its decode request: a hold whose decode "
                     "request is gone, and that no transfer-done notice ends, is reported with "
                     "how long it was held, even when its lease or timeout ends it later",
}

#: Bookkeeping invariants: a violation is a warning (exit 0 unless ``--strict``), not a race.
#: ``metrics-exact`` is a stats gap still open upstream (#55634). ``stranded-hold`` is lost
#: capacity that the hold's lease or timeout gives back (vLLM #25067: blocks nobody reads "should
#: be freed by the connector after a timeout"): no request gets a wrong answer, crashes or hangs;
#: a hold that never ends is also a ``no-leak`` violation, which is safety.
ACCOUNTING_INVARIANTS = ("metrics-exact", "stranded-hold")

#: Checked over vLLM's own model runner (vllm backend) only: conform leaves them out.
RUNNER_INVARIANTS = ("runner-books", "input-integrity")

#: The invariants whose violation is a race.
SAFETY_INVARIANTS = tuple(n for n in INVARIANTS if n not in ACCOUNTING_INVARIANTS)


def check_invariant_names(names: list[str] | tuple[str, ...]) -> frozenset[str]:
    for n in names:
        if n not in INVARIANTS:
            raise InputError(f"unknown invariant {n!r} (known: {', '.join(INVARIANTS)})")
    return frozenset(names)


@dataclass(frozen=True, slots=True)
class Violation:
    """One invariant violation and the first event that broke it."""

    invariant: str
    time: float
    request: str | None
    detail: str
    event: int  # seq of the first event that broke it (-1: end of run)
    #: vLLM's ``file:line`` (relative to the vllm package) when vLLM's own code raised it
    where: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"invariant": self.invariant, "time": self.time,
                               "request": self.request, "detail": self.detail,
                               "event": self.event}
        if self.where is not None:
            out["vllm_where"] = self.where
        return out
