"""The vllm backend's busy loop is the installed release's own ``EngineCoreProc`` code:
``_process_input_queue`` decides when the loop blocks on its input queue and
``_handle_client_request`` applies each input (racesim.engine_vllm.engine.inputs).

CI runs this file on vLLM 0.33.0 and in its 0.20.0 venv (.ci/run); locally it runs on whichever
supported release is installed, 0.10.1.1 included, whose rule differs.
"""

from __future__ import annotations

from typing import Any

import pytest

from racesim.conform import lifecycle
from racesim.runner import engines, run_scenario
from racesim.scenarios import parse_scenario

#: X's 64-token prompt in three 16-token chunks fills a batch queue of depth 3; X is aborted
#: with the third chunk still queued, and nothing else arrives until Y at 1.0 s
_QUEUED_AT_ABORT = """
name = "batch-queued-at-abort"
summary = "X aborted with a chunk still in the batch queue; Y arrives much later"
topology = "single"
frontends = 1
horizon = 5.0

[engine]
vllm = "0.33"
num_blocks = 64
block_size = 16
max_num_seqs = 16
step_time = 0.01
pipeline_parallel_size = 3
max_num_batched_tokens = 16
async_scheduling = false

[ipc]
latency = 0.0005

[[request]]
id = "X"
at = 0.0
prompt_tokens = 64
max_tokens = 200
abort_at = 0.005

[[request]]
id = "Y"
at = 1.0
prompt_tokens = 32
max_tokens = 5
"""


def _run() -> Any:
    profile = engines.installed_profile()
    assert profile is not None
    scen = parse_scenario(_QUEUED_AT_ABORT, "test").with_vllm(profile)
    policy, options = lifecycle(profile)  # the IDs the release assigns
    return run_scenario(scen, policy, options=options, engine="vllm")


def _done(res: Any, rid: str) -> bool:
    """Whether the client of ``rid`` got its terminal output."""
    return any(e.kind == "client.done" and str(e.request) == rid for e in res.trace)


def _third_chunk_applied_at(res: Any) -> float:
    """When update_from_output took X's third chunk (step 3)."""
    times = [float(e.time) for e in res.trace
             if e.kind == "sched.update" and e.detail.step == 3]
    assert len(times) == 1, times
    return times[0]


@pytest.mark.vllm
def test_a_batch_queued_when_no_request_is_held_waits_for_input_only_on_0_10() -> None:
    """0.10.1.1's loop blocks on its input queue whenever the Scheduler holds no request, with a
    batch still queued (core.py:722-739); 0.11.0 added ``not self.batch_queue`` (core.py:
    730-748), and 0.20+ ``has_work()``: the queued chunk is applied when the GPU is done."""
    from racesim.engine_vllm._vllm import vllm

    key = vllm().api.key
    expected = 1.0005 if key < (0, 11) else 0.0305
    assert _third_chunk_applied_at(_run()) == pytest.approx(expected)


@pytest.mark.vllm
def test_a_change_to_the_releases_own_has_work_changes_the_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A patch to ``EngineCoreProc`` that forgets the batch queue (0.10's rule again) is what
    racesim runs: the queued chunk now waits for Y's ADD."""
    from vllm.v1.engine.core import EngineCoreProc

    if not hasattr(EngineCoreProc, "has_work"):
        # 0.10-0.14 spell the condition inline in _process_input_queue
        pytest.skip("the installed release has no EngineCoreProc.has_work (before 0.20)")
    assert _third_chunk_applied_at(_run()) == pytest.approx(0.0305)
    monkeypatch.setattr(EngineCoreProc, "has_work",
                        lambda self: self.engines_running or self.scheduler.has_requests())
    assert _third_chunk_applied_at(_run()) == pytest.approx(1.0005)


@pytest.mark.vllm
def test_each_input_is_applied_by_the_releases_own_handle_client_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ADD and ABORT the engine applies went through ``_handle_client_request``, in
    order; a patch there that drops Y's ADD leaves Y out of the Scheduler and Y's client
    waiting."""
    from vllm.v1.engine.core import EngineCoreProc

    real = EngineCoreProc._handle_client_request
    seen: list[tuple[str, str]] = []

    def spy(self: Any, request_type: Any, request: Any) -> None:
        if request_type.name == "ADD":  # (Request, wave); before 0.10 the bare Request
            seen.append(("add", (request[0] if isinstance(request, tuple) else request)
                         .request_id))
        elif request_type.name == "ABORT":
            seen.append(("abort", ",".join(request)))
        real(self, request_type, request)

    monkeypatch.setattr(EngineCoreProc, "_handle_client_request", spy)
    res = _run()
    assert [(kind, rid.split("-")[0]) for kind, rid in seen] == [  # internal IDs: X-<suffix>
        ("add", "X"), ("abort", "X"), ("add", "Y")], seen
    # Y is served (the step's spin goes on while a batch is queued: 0.33's early return). What
    # else breaks is the release's: 0.10.1.1's runner keeps X and Y, whose finished IDs only
    # reach it in a schedule with no tokens, which 0.10 never executes (core.py:319-324); 0.9.2
    # gives an aborted request's client no final output (#22283 came in 0.10)
    assert _done(res, "Y") and "engine-alive" not in res.violated, res.violated

    def drop_y(self: Any, request_type: Any, request: Any) -> None:
        req = request[0] if isinstance(request, tuple) else request
        if request_type.name == "ADD" and req.request_id.startswith("Y"):
            return
        real(self, request_type, request)

    monkeypatch.setattr(EngineCoreProc, "_handle_client_request", drop_y)
    res = _run()
    assert not [e for e in res.trace if e.kind == "sched.add" and str(e.request).startswith("Y")]
    assert not _done(res, "Y") and "no-hang" in res.violated


@pytest.mark.parametrize(("release", "eager", "refused"), [
    ("0.11.0", True, "has no aborts_queue"), ("0.10.1.1", False, None), ("0.14.0", None, None),
    ("0.33.0", False, "has an aborts_queue"), ("0.20.0", True, None)])
def test_an_eager_aborts_override_runs_only_where_the_release_agrees(
        release: str, eager: bool | None, refused: str | None) -> None:
    """The release's own step reads ``aborts_queue`` (0.14+) or has none: an
    ``EngineConfig.eager_aborts`` override against it is one line, not a silent model."""
    import dataclasses

    from racesim.engine_vllm.support import release_gap
    from racesim.scenarios import load_scenario

    workload = load_scenario("abort-reuse").workload
    workload = dataclasses.replace(
        workload, engine=dataclasses.replace(workload.engine, eager_aborts=eager))
    gap = release_gap(workload, release)
    if refused is None:
        assert gap is None
    else:
        assert gap is not None and refused in gap and release in gap
