"""vLLM's own lifecycle tests, mirrored as scenarios with asserted outcomes (issue 12, item 4).

Each :class:`Mirror` names one vLLM test, the scenario in ``tests/fixtures/vllm_mirror/`` that
replays its workload, the vLLM profiles on which vLLM has the behaviour, and a ``check`` that
asserts on the run what the vLLM test asserts and the model can express. A check reads only
the :class:`RunResult` (per-client outcomes, violated invariants, trace events by kind and
request ID), so the same records can be run on another engine backend by swapping
:func:`run_mirror`. The record, its runner and the trace helpers are in ``_mirror.py``.

Every run uses the lifecycle real vLLM has on its profile (``LIFECYCLE``): ``buggy`` on 0.8
(IDs as given, before #15326) and ``internal-id`` with its default 8-hex suffix on 0.33
(#27987). No delay is injected anywhere: these are plain lifecycle checks, so any violation
other than the known accounting gap is a failure. That gap is ``metrics-exact``: vLLM never
counts a frontend-initiated abort in its finished-request stats (``OutputProcessor
.abort_requests`` only updates ``lora_states``, vLLM 0.33 ``v1/engine/output_processor.py``
:632-651), so every mirror with such an abort expects exactly that gap, on
exactly the aborted requests. ``no-leak`` not being violated is the model's form of vLLM's
``assert not engine.output_processor.has_unfinished_requests()`` (the checker looks at
``request_states``, ``parent_requests``, ``external_req_ids``, the scheduler, the runner and
the block pool at the end of the run).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from _mirror import (
    FIXTURES,
    GAP,
    Mirror,
    abort_ids,
    events,
    external,
    only_gap_on,
    outputs,
    run_mirror,
    statuses,
    stream_ends,
)
from racesim.engine_model import RunResult
from racesim.scenarios import load_scenario

# --------------------------------------------------------------------------- the checks

def check_abort(r: RunResult, profile: str) -> None:
    """tests/v1/engine/test_async_llm.py::test_abort: 100 requests (n=3 for range(1, 100, 15)),
    range(1, 100, 10) cancelled; the others produce exactly max_tokens * n; the OutputProcessor
    is empty once all are gathered; the first cancelled ID then runs again to max_tokens.

    Cancellation is the API server's: generate() is cancelled and aborts its internal ID
    (``disconnect_after_tokens``, staggered at 6, 12, ... 60 tokens in place of vLLM's 0.1 s
    sleeps, multiples of 3 so n=3 deltas land exactly). vLLM cancels some tasks before their
    first add; the model's client cannot be cancelled before it sends. Not expressed: the
    cancelled task raising CancelledError (the model records the client's own "abort"),
    output_kind FINAL_ONLY, the vision prompt."""
    cancelled = list(range(1, 100, 10))
    parallel = set(range(1, 100, 15))
    for i, out in enumerate(r.requests[:100]):
        n = 3 if i in parallel else 1
        expected = (6 * (cancelled.index(i) + 1), "abort") if i in cancelled else (100 * n,
                                                                                     "length")
        assert (out.id, out.tokens, out.finish_reason) == (f"request-{i}", *expected)
    reuse_at = next(e.time for e in reversed(events(r, "client.send")))
    live: Counter[str] = Counter()
    for e in r.trace:
        if e.time < reuse_at and e.kind in ("fe.add", "fe.pop"):
            live[e.request or ""] += 1 if e.kind == "fe.add" else -1
    assert +live == Counter(), f"unfinished in the OutputProcessor before the reuse: {+live}"
    status_of = statuses(r)
    for i in cancelled:  # each child of an n=3 request was aborted in the engine too
        assert status_of[f"request-{i}"][:3 if i in parallel else 1] == \
            ["FINISHED_ABORTED"] * (3 if i in parallel else 1)
    again = r.requests[100]
    assert (again.id, again.tokens, again.finish_reason) == ("request-1", 100, "length")
    assert status_of["request-1"][-1] == "FINISHED_LENGTH_CAPPED"
    only_gap_on(r, {f"request-{i}" for i in cancelled})


def check_multi_abort(r: RunResult, profile: str) -> None:
    """tests/v1/engine/test_async_llm.py::test_multi_abort: aborting requests 5, 10, 15, 20, 25
    (n=3 for 5, 15, 30, 35) by external ID gives them partial results (> 0 tokens), ended
    normally with finish_reason "abort"; the others finish with exactly 100 * n; nothing is
    left. The model's clients abort one ID each at the same instant: vLLM's single
    ``abort([ids], internal=False)`` call is not expressible, so the ABORTs go out one per
    request. Checked besides: the engine is told every internal ID (all 3 children).
    Not asserted by vLLM's test, which only checks ``request_states``: in 0.33 an abort by
    external ID pops the children but never their ParentRequest (output_processor.py:627-659),
    so each aborted n = 3 request leaves its parent in ``parent_requests`` (no-leak), and
    nothing else leaks."""
    aborted = {5, 10, 15, 20, 25}
    parallel = {5, 15, 30, 35}
    for i, out in enumerate(r.requests):
        n = 3 if i in parallel else 1
        if i in aborted:
            assert out.finish_reason == "abort" and 0 < out.tokens < 1000 * n, out
            stream_ends(outputs(r, i), "abort")
        else:
            assert (out.tokens, out.finish_reason) == (100 * n, "length"), out
    ext = external(r)
    sent = abort_ids(r)
    assert sorted(sent) == sorted(i for i, e in ext.items()
                                  if int(e.split("-")[1]) in aborted)
    if profile != "0.8":
        assert not set(sent) & {f"request-{i}" for i in aborted}, "aborts must be internal"
    leaks = [v for v in r.violations if v.invariant == "no-leak"]
    assert all("OutputProcessor.parent_requests" in v.detail for v in leaks), leaks
    assert sorted((v.request or "").split("-")[1] for v in leaks) == \
        sorted(str(i) for i in aborted & parallel)
    # without those leaks, only the accounting gap remains
    rest = replace(r, violations=tuple(v for v in r.violations if v not in leaks))
    only_gap_on(rest, {f"request-{i}" for i in aborted})


def check_finished_flag(r: RunResult, profile: str) -> None:
    """tests/v1/engine/test_async_llm.py::test_finished_flag[n=1, n=3]: streaming with DELTA,
    only the last output has finished=True. vLLM runs each n on a fresh engine as
    "request-33"; the scenario runs them side by side (request-33, request-34). The model
    samples no EOS unless told, so both run to max_tokens (100 * n tokens in all)."""
    for i, n in enumerate((1, 3)):
        outs = outputs(r, i)
        assert len(outs) > 1, "a stream, not a single output"
        stream_ends(outs, "length")
        assert sum(k for k, _ in outs) == r.requests[i].tokens == 100 * n
    assert r.violated == ()


def check_abort_final_output(r: RunResult, profile: str) -> None:
    """tests/v1/engine/test_async_llm.py::test_abort_final_output[DELTA]: after
    ``abort(id, internal=False)`` the stream ends with one finished output whose
    finish_reason is "abort" (made by the frontend, #22283: output_processor.py:637-651),
    carrying no new token; the outputs before it carried tokens; nothing is left. Not
    expressed: stop_reason None and num_cached_tokens (the model has neither), FINAL_ONLY.
    0.33 only: before #22283 vLLM's frontend made no final abort output (the model's 0.8
    profile makes one anyway)."""
    outs = outputs(r, 0)
    stream_ends(outs, "abort")
    assert outs[-1] == (0, "abort")
    streamed = sum(k for k, _ in outs[:-1])
    assert streamed > 0 and r.requests[0].tokens == streamed
    assert statuses(r)["test-abort-final-output"] == ["FINISHED_ABORTED"]
    only_gap_on(r, {"test-abort-final-output"})


def check_abort_during_final_step(r: RunResult, profile: str) -> None:
    """tests/v1/engine/test_abort_final_step.py::test_abort_during_final_step[async_scheduling
    =True] (#29987): a max_tokens=1 request aborted while its only forward pass runs gets
    outputs ending in finish_reason "abort", and the engine finishes it FINISHED_ABORTED (the
    status a KV connector's request_finished would see), not LENGTH_CAPPED, because
    EngineCore.step drains aborts_queue before update_from_output (0.33 v1/engine/core.py:690,
    792, 824-831). The model has no connector on a single engine: the check reads the status
    the scheduler finishes the request with, and that its blocks are freed at that moment.
    0.33 only: 0.8 applies ABORTs only between steps (there the request ends LENGTH_CAPPED)."""
    stream_ends(outputs(r, 0), "abort")
    assert statuses(r) == {"test-abort-final-step": ["FINISHED_ABORTED"]}
    finish = events(r, "sched.finish")[0]
    assert [e.time for e in events(r, "kv.free")] == [finish.time]
    assert all(not e.detail.applied for e in events(r, "sched.update"))  # no token kept
    only_gap_on(r, {"test-abort-final-step"})


STOP_AT = (3, 5, 8, 13)


def check_stop_string(r: RunResult, profile: str) -> None:
    """tests/v1/engine/test_output_processor.py::test_stop_string[include_stop_str_in_output=
    False]: each request stops on its stop string with finish_reason "stop" and its text cut
    before it (here: exactly the tokens up to the stop); its **internal** ID is in
    ``reqs_to_abort`` (output_processor.py:871-882) while outputs are collected by external
    ID; no output reaches a request after that; nothing is left. Checked besides: the ABORT
    the output handler sends names the engine's ID and ends it FINISHED_ABORTED; stop-string
    finishes are counted in stats, so no invariant at all is violated. Not expressed: text,
    logprobs, include_stop_str_in_output=True."""
    ext = external(r)
    issued = {e.request: e.detail.ids for e in events(r, "fe.abort_issue")
              if e.detail.cause == "stop-string"}
    assert abort_ids(r) == [i for ids in issued.values() for i in ids]
    for i, stop_at in enumerate(STOP_AT):
        rid = f"request-{i}"
        assert (r.requests[i].id, r.requests[i].tokens, r.requests[i].finish_reason) == \
            (rid, stop_at, "stop")
        stream_ends(outputs(r, i), "stop")
        (internal,) = [k for k, v in ext.items() if v == rid]
        assert issued[internal] == [internal]
        assert (internal == rid) == (profile == "0.8"), internal  # 0.33: rid + "-" + 8 hex
    assert statuses(r) == {f"request-{i}": ["FINISHED_ABORTED"] for i in range(4)}
    assert not [e for e in events(r, "client.output") if e.detail.after_done]
    assert r.violated == ()


def check_abort_requests(r: RunResult, profile: str) -> None:
    """tests/v1/engine/test_output_processor.py::test_abort_requests[generate x internal,
    external]: aborting by the internal or by the external ID raises nothing (vLLM's test has
    no assertion beyond that). Mirrored: external-0/1 are aborted by external ID as soon as
    they are added, external-2/3 by internal ID through generate()'s cancellation path (after
    their first token: the model has no internal-ID abort before any output). Each abort
    finds its request (no no-op), the ABORT names the engine's ID, every request ends
    "abort" in the client and FINISHED_ABORTED in the engine, and nothing is left.
    Not expressed: the pooling runner."""
    assert [(o.tokens, o.finish_reason) for o in r.requests] == \
        [(0, "abort"), (0, "abort"), (1, "abort"), (1, "abort")]
    assert not events(r, "fe.abort_noop")
    assert sorted(abort_ids(r)) == sorted(external(r))
    assert statuses(r) == {f"external-{i}": ["FINISHED_ABORTED"] for i in range(4)}
    only_gap_on(r, {f"external-{i}" for i in range(4)})


ABORT_ORDER = (0, 8, 3, 1, 6, 4, 2, 5, 7, 9)


def check_async_scheduler_abort(r: RunResult, profile: str) -> None:
    """tests/v1/core/test_async_scheduler.py::test_abort: 10 requests (max_tokens=20), two
    batches in flight, one aborted before each update_from_output in abort_order; request i
    ends FINISHED_ABORTED with ``abort_order.index(i)`` output tokens. vLLM calls
    finish_requests directly; here each client aborts while step k runs, and the engine
    applies it from aborts_queue just before update_from_output(k) (core.py:792). Checked
    besides: the client received exactly those tokens. 0.33 only: AsyncScheduler and
    aborts_queue postdate 0.8."""
    ext = external(r)
    assert [ext[e.request] for e in events(r, "sched.finish")] == [str(i) for i in ABORT_ORDER]
    assert statuses(r) == {str(i): ["FINISHED_ABORTED"] for i in range(10)}
    applied = Counter(ext[rid] for e in events(r, "sched.update")
                      for rid, *_ in e.detail.applied)
    for i in range(10):
        k = ABORT_ORDER.index(i)
        assert applied[str(i)] == k, (i, applied[str(i)])
        assert (r.requests[i].tokens, r.requests[i].finish_reason) == (k, "abort")
    only_gap_on(r, {str(i) for i in range(10)})


def check_abort_during_kv_transfer(r: RunResult, profile: str) -> None:
    """tests/v1/kv_connector/unit/test_remote_decode_lifecycle.py::test_abort_during_kv_transfer
    (#25067): a do_remote_decode request finishes LENGTH_CAPPED and stays in
    ``Scheduler.requests`` with its blocks (delay-free); an ABORT for it is ignored
    (scheduler.py:2994-2996) and the blocks are freed only by ``finished_sending``. Here the
    ABORT comes from the client through P's frontend, which still tracked X when it aborted;
    because the client aborted, the proxy never starts the decode, so ``finished_sending``
    comes from the hold's end (the connector's timeout/lease expiry, set to 1 s) instead of
    the mocked notification. Not expressed: ``len(scheduler.requests) == 1`` as a count (the
    check reads that the hold is released only at its end)."""
    (fin,) = events(r, "sched.finish", "prefill")
    (hold,) = events(r, "pd.hold", "prefill")
    # on vLLM's own Scheduler the held request keeps the busy loop stepping, so the eager
    # copy of the ABORT (aborts_queue) is applied too and misses as well (core.py:584-592)
    miss = events(r, "sched.abort_miss", "prefill")[0]
    (release,) = events(r, "pd.release", "prefill")
    (free,) = events(r, "kv.free", "prefill")
    assert fin.detail.status == "FINISHED_LENGTH_CAPPED" and hold.time == fin.time
    assert hold.time < miss.time < release.time == free.time == hold.detail.expiry
    assert release.detail.cause == "timeout"
    assert free.detail.blocks == hold.detail.blocks and len(hold.detail.blocks) == 3
    assert not events(r, "pd.decode") and not events(r, "sched.finish", "decode")
    assert (r.requests[0].tokens, r.requests[0].finish_reason) == (0, "abort")
    # the hold outlives its decode request (none was ever sent): stranded-hold, accounting
    assert r.violated == ("stranded-hold", *GAP), r.violations
    (stranded,) = [v for v in r.violations if v.invariant == "stranded-hold"]
    assert "until its release (timeout)" in stranded.detail and stranded.time < release.time
    assert events(r, "client.done")[0].seq == stranded.event


def check_pause_abort(r: RunResult, profile: str) -> None:
    """tests/v1/engine/test_async_llm.py::test_pause_abort: a long request in flight when
    pause_generation(mode="abort") runs ends with finish_reason "abort" (the engine's own
    ABORT output, core.py:2202-2206, so it is counted in stats: no gap), having streamed some
    tokens; a request sent after resume_generation runs to completion. Not expressed: the
    vLLM test's second request (its start relative to the pause is not visible in the
    excerpt read; in 0.33 an add during an "abort" pause gets a retryable ERROR,
    core.py:1796-1813), is_paused()."""
    outs = outputs(r, 0)
    stream_ends(outs, "abort")
    assert 0 < r.requests[0].tokens < 1000
    assert statuses(r)["test-abort-pause"] == ["FINISHED_ABORTED"]
    assert (r.requests[1].finish_reason, r.requests[1].tokens) == ("length", 10)
    assert r.violated == ()


def check_pause_then_abort_queued_request(r: RunResult, profile: str) -> None:
    """tests/v1/engine/test_async_llm.py::test_pause_then_abort_queued_request: added while
    paused with mode="keep" (PAUSED_ALL: queued, never scheduled), then aborted: the final
    output is finished with finish_reason "abort" and no token; it never runs, also not
    after resume."""
    outs = outputs(r, 0)
    assert outs == [(0, "abort")]
    assert r.requests[0].tokens == 0
    assert not [e for e in r.trace if e.kind == "sched.step" and e.detail.batch]
    only_gap_on(r, {"abort-queued-request"})


MIRRORS: tuple[Mirror, ...] = (
    Mirror("test_async_llm.py::test_abort", "test_abort.toml", None, {}, ("0.8", "0.33"),
           check_abort),
    Mirror("test_async_llm.py::test_multi_abort", "test_multi_abort.toml", None, {},
           ("0.33",), check_multi_abort),
    Mirror("test_async_llm.py::test_finished_flag", "test_finished_flag.toml", None, {},
           ("0.8", "0.33"), check_finished_flag),
    Mirror("test_async_llm.py::test_abort_final_output", "test_abort_final_output.toml", None,
           {}, ("0.33",), check_abort_final_output),
    Mirror("test_abort_final_step.py::test_abort_during_final_step",
           "test_abort_during_final_step.toml", None, {}, ("0.33",),
           check_abort_during_final_step),
    Mirror("test_output_processor.py::test_stop_string", "test_stop_string.toml", None, {},
           ("0.8", "0.33"), check_stop_string),
    Mirror("test_output_processor.py::test_abort_requests", "test_abort_requests.toml", None,
           {}, ("0.8", "0.33"), check_abort_requests),
    Mirror("test_async_scheduler.py::test_abort", "test_async_scheduler_abort.toml", None, {},
           ("0.33",), check_async_scheduler_abort),
    Mirror("test_remote_decode_lifecycle.py::test_abort_during_kv_transfer",
           "test_abort_during_kv_transfer.toml", None, {}, ("0.8", "0.33"),
           check_abort_during_kv_transfer),
    Mirror("test_async_llm.py::test_pause_abort", "test_pause_abort.toml", None, {},
           ("0.33",), check_pause_abort),
    Mirror("test_async_llm.py::test_pause_then_abort_queued_request",
           "test_pause_then_abort_queued_request.toml", None, {}, ("0.33",),
           check_pause_then_abort_queued_request),
)


def _cases() -> list[Any]:
    cases = []
    for m in MIRRORS:
        for p in m.profiles:
            marks = [pytest.mark.xfail(strict=True, reason=m.xfail[p])] if p in m.xfail else []
            cases.append(pytest.param(m, p, id=f"{m.name}@{p}", marks=marks))
    return cases


@pytest.mark.parametrize(("mirror", "profile"), _cases())
def test_vllm_mirror(mirror: Mirror, profile: str) -> None:
    r = run_mirror(mirror, profile)
    assert r.vllm == profile
    assert r.schedule == () and r.fixed_delays == (), "a mirror must run with no delay"
    mirror.check(r, profile)


def test_every_fixture_is_mirrored_and_names_its_vllm_test() -> None:
    files = sorted(p.name for p in FIXTURES.glob("*.toml"))
    assert files == sorted(m.toml_file for m in MIRRORS)
    for m in MIRRORS:
        summary = load_scenario(str(FIXTURES / m.toml_file)).summary
        test_file, test_name = m.name.split("::")
        assert f"{test_file}::{test_name}" in summary and "following vllm/" in summary
        assert all(f"profile{'s' if len(m.profiles) > 1 else ''} " in summary
                   and p in summary for p in m.profiles), summary


def _vllm_cases() -> list[Any]:
    """The 0.33 mirrors, on the vllm backend (P/D runs vLLM's own NixlConnector there)."""
    return [pytest.param(m, id=f"{m.name}@0.33:vllm") for m in MIRRORS if "0.33" in m.profiles]


@pytest.mark.vllm
@pytest.mark.parametrize("mirror", _vllm_cases())
def test_vllm_mirror_on_vllm_backend(mirror: Mirror) -> None:
    """The same records, run on vLLM 0.33's own Scheduler and KV cache manager."""
    r = run_mirror(mirror, "0.33", engine="vllm")
    assert (r.vllm, r.engine) == ("0.33", "vllm")
    assert r.schedule == () and r.fixed_delays == ()
    mirror.check(r, "0.33")
