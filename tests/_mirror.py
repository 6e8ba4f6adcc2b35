"""The frame of the vLLM mirrors (test_vllm_mirror.py): a :class:`Mirror` record, how one runs,
and the trace helpers its checks read a run with."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from racesim.engine_model import RunResult
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario

__all__ = ["FIXTURES", "GAP", "LIFECYCLE", "Check", "Mirror", "abort_ids", "events", "external",
           "only_gap_on", "outputs", "run_mirror", "statuses", "stream_ends"]

FIXTURES = Path(__file__).parent / "fixtures" / "vllm_mirror"
#: The lifecycle policy real vLLM has on each profile, with its options.
LIFECYCLE: dict[str, tuple[str, dict[str, str]]] = {
    "0.8": ("buggy", {}),
    "0.33": ("internal-id", {}),
}
GAP = ("metrics-exact",)  # the only violation a frontend-initiated abort may leave

Check = Callable[[RunResult, str], None]


@dataclass(frozen=True)
class Mirror:
    """One mirrored vLLM test. ``policy`` None: the lifecycle vLLM has on the profile."""

    name: str
    toml_file: str
    policy: str | None
    options: Mapping[str, str]
    profiles: tuple[str, ...]
    check: Check
    xfail: Mapping[str, str] = field(default_factory=dict)  # profile -> documented disagreement


def run_mirror(mirror: Mirror, profile: str, engine: str = "model") -> RunResult:
    """Run ``mirror``'s scenario on ``profile`` (the one place a second backend plugs in)."""
    policy, options = LIFECYCLE[profile]
    if mirror.policy is not None:
        policy, options = mirror.policy, dict(mirror.options)
    scenario = load_scenario(str(FIXTURES / mirror.toml_file)).with_vllm(profile)
    return run_scenario(scenario, policy, options=options, witness=False, engine=engine)


# --------------------------------------------------------------------------- trace helpers

def events(r: RunResult, kind: str, component: str = "") -> list[Any]:
    return [e for e in r.trace if e.kind == kind and e.component.startswith(component)]


def outputs(r: RunResult, client: int) -> list[tuple[int, str | None]]:
    """(tokens, finish reason) of every output client ``client`` took, in order."""
    return [(len(e.detail.tokens), e.detail.finish)
            for e in events(r, "client.output", f"client{client}")
            if e.component == f"client{client}"]


def external(r: RunResult) -> dict[str, str]:
    """Engine-side (internal, or child) request ID -> the external ID its client used."""
    return {e.request: e.detail.external for e in events(r, "fe.add")}


def statuses(r: RunResult, component: str = "") -> dict[str, list[str]]:
    """External ID -> the statuses its engine requests finished with, in order."""
    ext = external(r)
    out: dict[str, list[str]] = {}
    for e in events(r, "sched.finish", component):
        out.setdefault(ext[e.request], []).append(e.detail.status)
    return out


def abort_ids(r: RunResult) -> list[str]:
    return [i for e in events(r, "ipc.send") if e.detail.type == "AbortMessage"
            for i in e.detail.ids]


def only_gap_on(r: RunResult, aborted: set[str]) -> None:
    """Nothing violated but metrics-exact, and that only on the frontend-aborted requests."""
    assert r.violated == GAP, r.violations
    ext = external(r)
    assert {ext[v.request or ""] for v in r.violations} == aborted


def stream_ends(outs: list[tuple[int, str | None]], reason: str) -> None:
    """vLLM's "only the last output has finished=True" (finish reason set <=> finished)."""
    assert outs, "no output at all"
    assert all(f is None for _, f in outs[:-1]), outs
    assert outs[-1][1] == reason, outs
