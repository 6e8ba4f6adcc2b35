"""Fidelity: vLLM's P/D lifecycle tests (in vLLM's tests/v1/kv_connector/ and tests/v1/engine/)
as tests of the model:
test_remote_decode_lifecycle.py::test_abort_during_kv_transfer (#25067),
test_abort_final_step.py::test_abort_during_final_step (#29987) and
test_nixl_connector.py::test_abort_timeout_on_prefiller."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from racesim.engine_model import EngineConfig, PDConfig, RequestSpec, RunResult, System, Workload
from racesim.engine_model.messages import AbortMessage

Simulate = Callable[..., tuple[RunResult, System]]  # the conftest fixture


def _prefill_story(result: RunResult) -> list[tuple[str, float]]:
    kinds = ("sched.finish", "sched.abort_miss", "pd.hold", "pd.read", "pd.notice",
             "pd.release", "kv.free")
    return [(e.kind, round(e.time, 9)) for e in result.trace
            if e.kind in kinds and (e.component.startswith("prefill") or e.kind == "pd.read")]


def test_abort_during_kv_transfer_keeps_the_blocks_until_the_transfer_finishes(
        simulate: Simulate) -> None:
    # #25067: X finished on P and is held; an ABORT for it arrives while D is still reading.
    def setup(system: System) -> None:
        env = system.world.env
        prefill = system.engines[0]

        def late_abort() -> Any:
            yield env.timeout(0.03)
            prefill.deliver(AbortMessage(("X",)))

        env.process(late_abort())

    workload = Workload(engine=EngineConfig(vllm="0.8"), topology="pd",
                        requests=(RequestSpec("X", prompt_tokens=32,
                                                             max_tokens=3),))
    result, system = simulate(workload, "buggy", delays=[("pd.kv:read", 0, 0.05)],
                              setup=setup)
    assert _prefill_story(result) == [
        ("sched.finish", 0.0105),          # LENGTH_CAPPED after its one token
        ("pd.hold", 0.0105),
        ("sched.abort_miss", 0.03),        # the ABORT for a finished, held request: ignored
        ("pd.read", 0.0615),               # D reads blocks that are still P's
        ("pd.notice", 0.062),
        ("pd.release", 0.062),
        ("kv.free", 0.062)]                # freed only when the transfer finished
    assert [(r.tokens, r.finish_reason) for r in result.requests] == [(3, "length")]
    assert not result.violations
    prefill = system.engines[0]
    assert prefill.kv.num_free_blocks == prefill.kv.num_blocks


@pytest.mark.parametrize(("eager", "status", "freed_at"), [
    (False, "FINISHED_LENGTH_CAPPED", 0.5105),   # before #29987: held until the timeout
    (True, "FINISHED_ABORTED", 0.0105),          # #29987: aborted, blocks freed at once
])
def test_abort_during_final_step(simulate: Simulate, eager: bool, status: str,
                                 freed_at: float) -> None:
    # The client aborts while P runs its only (final) forward pass.
    workload = Workload(topology="pd", engine=EngineConfig(vllm="0.8", eager_aborts=eager),
                        pd=PDConfig(hold_timeout=0.5),
                        requests=(RequestSpec("X", prompt_tokens=32, max_tokens=3,
                                              abort_at=0.005),))
    result, _ = simulate(workload, "abort-scope")
    finishes = [e.detail.status for e in result.trace
                if e.kind == "sched.finish" and e.component.startswith("prefill")]
    assert finishes == [status]
    (free,) = [e for e in result.trace if e.kind == "kv.free" and e.component == "prefill.kv"]
    assert round(free.time, 9) == freed_at
    assert bool([e for e in result.trace if e.kind == "pd.hold"]) is not eager
    assert [(r.tokens, r.finish_reason) for r in result.requests] == [(0, "abort")]
    assert not [e for e in result.trace if e.kind == "pd.decode"], "no decode after an abort"


def test_abort_timeout_on_prefiller_holds_the_request_until_the_lease_expires(
        simulate: Simulate) -> None:
    # Nobody ever reads the blocks: P keeps X in requests/req_to_blocks until the timeout.
    seen: list[tuple[float, bool, list[int]]] = []

    def setup(system: System) -> None:
        env = system.world.env
        prefill = system.engines[0]

        def probe() -> Any:
            for t in (0.005, 0.05, 0.099, 0.2):
                yield env.timeout(t - env.now)
                seen.append((t, "X" in prefill.scheduler.requests,
                             list(prefill.kv.req_to_blocks.get("X", []))))

        env.process(probe())

    workload = Workload(engine=EngineConfig(vllm="0.8"), topology="pd",
                        pd=PDConfig(hold_timeout=0.09),
                        requests=(RequestSpec("X", prompt_tokens=32, max_tokens=3),))
    result, _ = simulate(workload, "buggy", delays=[("pd.kv:read", 0, 100.0)], setup=setup)
    assert seen == [(0.005, True, [0, 1]),     # running its prefill
                    (0.05, True, [0, 1]),      # finished, held for the decode side
                    (0.099, True, [0, 1]),
                    (0.2, False, [])]          # the hold expired at 0.1005
    (release,) = [e for e in result.trace if e.kind == "pd.release"]
    assert (release.detail.cause, round(release.time, 9)) == ("timeout", 0.1005)


@pytest.mark.parametrize(("vllm", "held"), [("0.33", True), ("0.8", False)])
def test_prefill_stopped_on_eos_is_held_for_the_decode_side_on_033_only(
        simulate: Simulate, vllm: str, held: bool) -> None:
    # EOS as P's one token finishes it STOPPED. vLLM 0.33's NIXL connector holds STOPPED as it
    # holds LENGTH_CAPPED (nixl/pull_scheduler.py:235-244), so D still reads P's blocks; the
    # connector of #20139 held LENGTH_CAPPED only, so P frees at once and returns no params.
    workload = Workload(topology="pd", engine=EngineConfig(vllm=vllm),
                        requests=(RequestSpec("X", prompt_tokens=32, max_tokens=5, eos_at=1),))
    result, system = simulate(workload, "internal-id")
    finishes = [e.detail.status for e in result.trace
                if e.kind == "sched.finish" and e.component.startswith("prefill")]
    assert finishes == ["FINISHED_STOPPED"]
    kinds = [e.kind for e in result.trace]
    assert ("pd.hold" in kinds) is held
    assert ("pd.read" in kinds) is held and ("pd.release" in kinds) is held
    assert [(r.tokens, r.finish_reason) for r in result.requests] == [(1, "stop")]
    assert result.violated == () or set(result.violated) <= {"metrics-exact"}
    for engine in system.engines:
        assert engine.kv.num_free_blocks == engine.kv.num_blocks
