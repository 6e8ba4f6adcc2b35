"""The known differences between the model and vLLM 0.33's own code, each with its cause.

This table is the one list: ``racesim conform`` exits 1 on any mismatch it does not explain,
and docs/conform.md shows it (``tests/test_conform.py`` checks that page's table is this one). An
entry explains a mismatch when its scenario and policy match and every difference in the
mismatch has a key (the text before the first space, e.g. ``invariant:no-hang`` or
``finish_reason:client1``) that one of the entry's patterns matches (``fnmatch`` patterns).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

__all__ = ["KnownMismatch", "KNOWN", "explain", "markdown_table"]


@dataclass(frozen=True, slots=True)
class KnownMismatch:
    """One listed disagreement: where it shows, which differences it covers, and why."""

    scenario: str  # a bundled scenario name, or "*"
    policy: str  # a policy name, or "*"
    differences: tuple[str, ...]  # fnmatch patterns over difference keys
    cause: str  # why the backends differ, citing vLLM 0.33's source (file:line)
    #: only in runs where an engine died on both backends
    after_engine_death: bool = False
    #: the profiles (``--vllm``) whose runs it explains; empty: every release
    releases: tuple[str, ...] = ()

    def covers(self, scenario: str, policy: str, keys: Sequence[str],
               engine_died: bool = False, release: str = "") -> bool:
        return (fnmatchcase(scenario, self.scenario) and fnmatchcase(policy, self.policy)
                and (engine_died or not self.after_engine_death)
                and (not self.releases or release in self.releases)
                and all(any(fnmatchcase(k, p) for p in self.differences) for k in keys))


#: Every known mismatch. Empty means: the model and vLLM 0.33 agree on every schedule tried.
KNOWN: tuple[KnownMismatch, ...] = (
    KnownMismatch(
        "*", "*", ("invariant:one-terminal-output",),
        "After EngineCore died, vLLM keeps every request state: the output handler's "
        "`OutputProcessor.propagate_error` only queues the EngineDeadError "
        "(`v1/engine/output_processor.py:593-597`, `v1/engine/async_llm.py:936-945`). A later "
        "abort of the same ID pops that state and puts a final \"abort\" output into its queue "
        "(`output_processor.py:632-651`), after the error that ended its `generate()`: an output "
        "no client reads. The model drops each state on engine death, so the abort finds none.",
        after_engine_death=True),
    KnownMismatch(
        "preempt-reuse", "buggy",
        ("finish_reason:*", "tokens:*", "received:*", "invariant:engine-alive",
         "engine-death:*"),
        "On vLLM 0.14.0 and 0.20.0's own code (`conform --vllm 0.14` / `0.20`), with equal IDs "
        "under async scheduling and a preemption, some schedules kill the engine on "
        "`assert request.num_output_placeholders >= 0` (0.20.0 "
        "`v1/core/sched/async_scheduler.py:52-53`, 0.14.0 `:59`): a sampled token is counted "
        "against the re-sent X, which reserved no placeholder for it (#42492's assert). The "
        "model's 0.14 and 0.20 profiles do not reach that assert (the corpus's #42492 model "
        "cell says so too); vLLM 0.33 and the model agree. vLLM wins: the model's placeholder "
        "count under a re-used ID is to be corrected.",
        releases=("0.14", "0.20")),
    KnownMismatch(
        "abort-storm", "buggy", ("tokens:*", "finish_reason:*", "received:*"),
        "On vLLM 0.10.1.1 and 0.11.0's own code (`conform --vllm 0.10` / `0.11`), a re-sent ID "
        "whose old request still has its row in the runner's persistent batch kills the engine "
        "in both, but not at the same step: the model's 0.10/0.11 profiles die at once in "
        "`_prepare_inputs` (the `ValueError` of 0.10.1.1 `v1/worker/gpu_model_runner.py:718`), "
        "while vLLM's own runner can step the two rows first, feeding one the other's tokens "
        "(`input-integrity`), and die later, e.g. of `IndexError` in `update_from_output` "
        "(0.10.1.1 `v1/core/sched/scheduler.py:788`). The clients' token counts up to the death "
        "differ; both sides report the same invariants. vLLM wins: the model's rule that the "
        "second row dies at once is to be narrowed.",
        after_engine_death=True, releases=("0.10", "0.11")),
)


def key_of(difference: str) -> str:
    return difference.split(" ", 1)[0]


def explain(scenario: str, policy: str, differences: Sequence[str],
            known: Sequence[KnownMismatch] | None = None, *,
            engine_died: bool = False, release: str = "") -> str | None:
    """The cause of a listed mismatch, or None when no entry explains all its differences
    (``engine_died``: an engine died in the run on both backends; ``release``: the run's
    profile)."""
    keys = [key_of(d) for d in differences]
    for entry in KNOWN if known is None else known:
        if entry.covers(scenario, policy, keys, engine_died, release):
            return entry.cause
    return None


def markdown_table(known: Sequence[KnownMismatch] | None = None) -> str:
    """docs/conform.md's table of known mismatches (one row saying none when there are none)."""
    known = KNOWN if known is None else known
    lines = ["| scenario | policy | differences | cause |", "| --- | --- | --- | --- |"]
    for e in known:
        when = " after an engine died" if e.after_engine_death else ""
        where = f" (vLLM {', '.join(e.releases)} only)" if e.releases else ""
        lines.append(f"| {e.scenario} | {e.policy} | {', '.join(f'`{d}`' for d in e.differences)}"
                     f"{when}{where} | {e.cause} |")
    if not known:
        lines.append("| (none) | | | the model and vLLM 0.33 agree on every schedule tried |")
    return "\n".join(lines)
