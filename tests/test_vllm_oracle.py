"""vLLM's exceptions are the oracle: an assert or exception raised by vLLM's own code in a
vllm-backend run is an engine death whose violation names vLLM's file:line and message
(engine_vllm/oracle.py), in the JSON document, the counterexample file and the HTML report,
and the trace hash stays the same in every process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _hash_seeds import hashes_per_seed

from racesim.documents import violation_dicts
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario

pytestmark = pytest.mark.vllm


def _assert_line(vllm_backend: object) -> int:
    """The line of 'duplicate request id' in the installed vLLM's Scheduler.add_request."""
    import vllm.v1.core.sched.scheduler as mod

    lines = Path(mod.__file__).read_text(encoding="utf-8").splitlines()
    return next(i for i, text in enumerate(lines, 1) if '"duplicate request id"' in text)


def test_a_vllm_assert_names_its_file_and_line(vllm_backend: object, tmp_path: Path) -> None:
    """duplicate-in-flight: the second ADD of X meets Scheduler.add_request's assert."""
    line = _assert_line(vllm_backend)
    result = run_scenario(load_scenario("duplicate-in-flight"), "buggy", engine="vllm")
    (v,) = [v for v in result.violations if v.invariant == "engine-alive"]
    assert v.where == f"v1/core/sched/scheduler.py:{line}"
    assert "AssertionError: duplicate request id" in v.detail
    assert f"at vllm/v1/core/sched/scheduler.py:{line}" in v.detail
    (d,) = [d for d in violation_dicts(result) if d["invariant"] == "engine-alive"]
    assert d["vllm_where"] == v.where
    fatal = [e for e in result.trace if e.kind == "engine.fatal"]
    assert fatal and fatal[0].detail.as_dict()["where"] == v.where
    from racesim.reports import write_run_report

    report = tmp_path / "r.html"
    write_run_report(report, load_scenario("duplicate-in-flight"), "buggy", {}, result, "cmd")
    assert f"vllm/v1/core/sched/scheduler.py:{line}" in report.read_text(encoding="utf-8")


def test_a_model_death_names_no_vllm_line() -> None:
    """The model's own fatal errors are not vLLM's code: no file:line, and the JSON keeps
    its old shape (no vllm_where key)."""
    result = run_scenario(load_scenario("duplicate-in-flight"), "buggy")
    (v,) = [v for v in result.violations if v.invariant == "engine-alive"]
    assert v.where is None and "vllm_where" not in v.as_dict()


def test_the_file_line_keeps_the_trace_hash_stable_across_processes(
        vllm_backend: object) -> None:
    first, second = hashes_per_seed(["duplicate-in-flight"], ["buggy"], ["0", "4242"])
    assert first and first == second


def test_explore_writes_the_file_line_into_the_counterexample(vllm_backend: object,
                                                              tmp_path: Path) -> None:
    from racesim.explore import explore

    res = explore(load_scenario("duplicate-in-flight"), "buggy", budget=2, engine="vllm",
                  out_dir=tmp_path, shrink_runs=5)
    assert res.counterexample_path is not None
    data = json.loads(Path(res.counterexample_path).read_text(encoding="utf-8"))
    wheres = [v.get("vllm_where") for v in data["violations"] if v["invariant"] ==
              "engine-alive"]
    assert wheres and wheres[0].startswith("v1/core/sched/scheduler.py:")


def test_a_racesim_bug_inside_vllms_step_is_a_crash_not_an_engine_death(
        vllm_backend: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's own step calls racesim's wrappers (engine_vllm/engine/stepper.py): an exception
    raised there is racesim's, so it must not become an engine death blamed on a vLLM line."""
    from racesim.engine_vllm.engine.core import VllmEngineCore

    def broken(self: object, so: object, step: int) -> None:
        raise KeyError("racesim-bookkeeping-bug")

    monkeypatch.setattr(VllmEngineCore, "_record_step", broken)
    with pytest.raises(KeyError, match="racesim-bookkeeping-bug"):
        run_scenario(load_scenario("abort-reuse"), "buggy", engine="vllm")


def test_a_vllm_path_reading_what_the_facade_lacks_is_racesims_gap_not_vllms_verdict(
        vllm_backend: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's own busy loop runs on a facade EngineCoreProc holding only what racesim feeds:
    vLLM code reaching an attribute it was not given (here: a patched _handle_client_request
    asking for the executor's supported tasks, as add_request does for a pooling request) is
    racesim's gap, raised as such, not an engine death at a vLLM line."""
    from vllm.v1.engine.core import EngineCoreProc

    from racesim.engine_vllm.oracle import StandInGap

    real = EngineCoreProc._handle_client_request

    def asks(self: Any, request_type: Any, request: Any) -> None:
        assert hasattr(self, "scheduler") and not hasattr(self, "no_such_attribute")
        self.model_executor.supported_tasks  # noqa: B018 - the read is the test
        real(self, request_type, request)

    monkeypatch.setattr(EngineCoreProc, "_handle_client_request", asks)
    with pytest.raises(StandInGap, match="supported_tasks"):
        run_scenario(load_scenario("abort-reuse"), "buggy", engine="vllm")
