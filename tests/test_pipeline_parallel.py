"""``[engine] pipeline_parallel_size``: the batch queue's depth, and the releases that refuse it
with async scheduling."""

from __future__ import annotations

from dataclasses import replace

import pytest

from racesim.engine_model.config import EngineConfig, batch_queue_depth
from racesim.engine_model.versions import profile_gap
from racesim.scenarios import load_scenario


@pytest.mark.parametrize(("pp", "async_", "depth"), [
    (None, False, 1), (None, True, 2), (1, True, 2), (3, False, 3), (3, True, 3), (2, True, 2)])
def test_the_depth_is_the_multiproc_executors_max_concurrent_batches(
        pp: int | None, async_: bool, depth: int) -> None:
    assert batch_queue_depth(EngineConfig(pipeline_parallel_size=pp,
                                          async_scheduling=async_)) == depth


@pytest.mark.parametrize(("profile", "refused"), [
    ("0.10", True), ("0.11", True), ("0.14", True), ("0.20", False), ("0.33", True)])
def test_async_scheduling_with_pipeline_parallelism_is_refused_where_vllm_refuses_it(
        profile: str, refused: bool) -> None:
    scen = load_scenario("async-sched-reuse").with_vllm(profile)
    w = scen.workload
    piped = replace(w, engine=replace(w.engine, pipeline_parallel_size=3))
    gap = profile_gap(piped)
    assert (gap is not None) == refused
    if refused:
        assert gap is not None and "pipeline_parallel_size" in gap and "refuses" in gap
    # synchronous scheduling with pipeline parallelism runs everywhere
    sync = replace(piped, engine=replace(piped.engine, async_scheduling=False))
    assert profile_gap(sync) is None
    assert profile_gap(w) is None


@pytest.mark.parametrize(("profile", "async_"), [("0.14", False), ("0.33", False),
                                                 ("0.20", True)])
def test_unset_async_scheduling_with_pipeline_parallelism_follows_the_release(
        profile: str, async_: bool) -> None:
    """Unset, 0.14 and 0.33 turn async scheduling off beside pipeline parallelism and run
    (0.14.0 config/vllm.py:587-595, 0.33.0 :1710-1716); 0.20 keeps its default, on."""
    from racesim.engine_model.versions import resolve_workload

    scen = load_scenario("abort-reuse").with_vllm(profile)
    w = scen.workload
    unset = replace(w, engine=replace(w.engine, pipeline_parallel_size=2, async_scheduling=None))
    assert profile_gap(unset) is None
    resolved, _profile = resolve_workload(unset)
    assert resolved.engine.async_scheduling is async_
