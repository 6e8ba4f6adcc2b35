"""P/D disaggregation: the prefill side holds a finished request's blocks until the decode side
has read them, or until the hold times out (vLLM 0.33 NIXL connector: ``request_finished``,
distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py:191, records the hold at
:264-266)."""

from __future__ import annotations

from racesim.engine_model import (
    EngineConfig,
    PDConfig,
    RequestSpec,
    RunResult,
    Workload,
    load_policy,
    run_workload,
)
from racesim.sim import DelayPlan


def _pd(hold_timeout: float = 480.0, read: float | None = None) -> RunResult:
    workload = Workload(engine=EngineConfig(vllm="0.8"), topology="pd",
                        pd=PDConfig(hold_timeout=hold_timeout),
                        requests=(RequestSpec("X", prompt_tokens=32, max_tokens=3),))
    overrides = [("pd.kv:read", None, read)] if read is not None else []
    return run_workload(workload, load_policy("buggy"), plan=DelayPlan(overrides=overrides))


_PD_KINDS = ("sched.finish", "pd.hold", "pd.read", "pd.notice", "pd.notice_unknown",
             "pd.release", "kv.free", "engine.fatal")


def _story(result: RunResult) -> list[tuple[str, float]]:
    return [(f"{e.component} {e.kind}", round(e.time, 9)) for e in result.trace
            if e.kind in _PD_KINDS]


def test_prefill_holds_its_blocks_until_the_decode_side_has_read_them() -> None:
    result = _pd()
    assert _story(result) == [
        ("prefill.scheduler sched.finish", 0.0105),   # max_tokens = 1: LENGTH_CAPPED
        ("prefill.connector pd.hold", 0.0105),         # blocks kept, TTL armed
        ("decode.connector pd.read", 0.0135),          # ADD at 0.0115 + 2 ms transfer
        ("prefill.core pd.notice", 0.014),             # "<id>:<n>" over the side channel
        ("prefill.scheduler pd.release", 0.014),
        ("prefill.kv kv.free", 0.014),                 # only now are P's blocks free
        ("decode.scheduler sched.finish", 0.0435),
        ("decode.kv kv.free", 0.0435)]
    (hold,) = [e for e in result.trace if e.kind == "pd.hold"]
    (read,) = [e for e in result.trace if e.kind == "pd.read"]
    assert read.detail.remote_blocks == hold.detail.blocks == [0, 1]
    assert read.detail.remote_inc == hold.inc
    (release,) = [e for e in result.trace if e.kind == "pd.release"]
    assert release.detail.cause == "notify"
    assert [(r.tokens, r.finish_reason) for r in result.requests] == [(3, "length")]
    assert not result.violations


def test_a_slow_read_keeps_the_blocks_held_for_as_long_as_it_takes() -> None:
    result = _pd(read=0.5)
    story = _story(result)
    hold = story.index(("prefill.connector pd.hold", 0.0105))
    release = next(i for i, (what, _) in enumerate(story) if what.endswith("pd.release"))
    assert [what for what, _ in story[hold + 1:release]] == [
        "decode.connector pd.read", "prefill.core pd.notice"]
    assert story[release] == ("prefill.scheduler pd.release", 0.512)
    assert story[release + 1] == ("prefill.kv kv.free", 0.512)
    assert not result.violations


def test_hold_timeout_releases_the_blocks_when_no_notice_comes() -> None:
    result = _pd(hold_timeout=0.005, read=1.0)
    assert _story(result)[:6] == [
        ("prefill.scheduler sched.finish", 0.0105),
        ("prefill.connector pd.hold", 0.0105),
        ("prefill.scheduler pd.release", 0.0155),      # the TTL expired: released anyway
        ("prefill.kv kv.free", 0.0155),
        ("decode.connector pd.read", 1.0115),          # reads blocks P already freed
        ("prefill.core pd.notice_unknown", 1.012)]     # logged and ignored, as NIXL does
    (release,) = [e for e in result.trace if e.kind == "pd.release"]
    assert release.detail.cause == "timeout"
    assert not [e for e in result.trace if e.kind == "engine.fatal"]
    # The damage is the read of freed blocks; the engines survive and the client finishes.
    assert result.violated == ("kv-ownership",)
    assert "block is free" in result.violations[0].detail
    assert [(r.tokens, r.finish_reason) for r in result.requests] == [(3, "length")]
