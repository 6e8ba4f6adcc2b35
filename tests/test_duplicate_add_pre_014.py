"""A duplicate ADD on vLLM 0.9.2, 0.10.1.1 and 0.11.0 (issue 28, model truths; vLLM wins):
``Scheduler.add_request`` overwrites ``requests[id]`` (0.11.0 scheduler.py:1097-1099), both
Request objects share ``req_to_blocks[id]`` and ``num_cached_block[id]``, and
``cache_blocks`` sets that count to the calling request's full blocks whatever it was
(single_type_kv_cache_manager.py:154 in 0.11.0, :150 in 0.10.1.1, :156 in 0.9.2). When the
second request's count lowers it, the first re-hashes a block it hashed already and the engine
dies inside schedule() on ``assert blk.block_hash is None`` (block_pool.py:223 in 0.11.0,
:129 in 0.10.1.1, :145 in 0.9.2), as the vllm backend shows on multi-frontend. The model used
to run on with a shared table and die later on a KeyError.

On 0.9.2 the KV cache manager keeps block hashes by request ID (kv_cache_manager.py:112,
158-163, 373): the duplicate looks its prompt up in the first request's hashes, finds its
cached blocks, and the engine dies first on ``assert len(new_computed_blocks) == 0``
(single_type_kv_cache_manager.py:105), as the vllm backend shows.

On 0.10.1.1 and 0.11.0 the step that first schedules the re-added request dies before that, in
the model runner: the old request's row stays in the persistent batch (its ID is scheduled),
the new one gets a second row under the same ID, and ``_prepare_inputs`` raises ValueError
(0.11.0 gpu_model_runner.py:952), as vLLM 0.11.0's own runner does on the vllm backend
(``racesim conform --vllm 0.11`` on multi-frontend; engine_model/runner.py). The shared block
table's assert is what a schedule that avoids that row reaches."""

from __future__ import annotations

import pytest

from racesim.runner import run_scenario
from racesim.scenarios import load_scenario


@pytest.mark.parametrize(("profile", "assert_"), [
    ("0.9", "len(new_computed_blocks) == 0"),
    ("0.10", "ValueError: operands could not be broadcast together"),
    ("0.11", "ValueError: operands could not be broadcast together")])
def test_a_duplicate_add_dies_where_the_release_asserts(profile: str, assert_: str) -> None:
    scen = load_scenario("multi-frontend").with_vllm(profile)
    res = run_scenario(scen, "buggy", witness=True)
    died = [v for v in res.violations if v.invariant == "engine-alive"]
    assert died and assert_ in died[0].detail, res.violated
    assert "unique-live-id" in res.violated
    added = [e.time for e in res.trace if e.kind == "sched.add" and e.detail.prev]
    if profile != "0.9":  # the first step after the re-add (0.9 dies in schedule() at once)
        assert died[0].time - added[0] < 0.02, (died[0].time, added)


@pytest.mark.parametrize("profile", ["0.10", "0.11"])
def test_the_shared_block_table_still_dies_on_block_pools_assert(
        profile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the runner's second row (a schedule where the old request's row is gone), the
    two requests share one block table until block_pool's assert."""
    from dataclasses import replace

    from racesim.engine_model import versions

    p = versions.PROFILES[profile]
    monkeypatch.setitem(versions.PROFILES, profile,
                        replace(p, features=p.features - {"runner-duplicate-row"}))
    res = run_scenario(load_scenario("multi-frontend").with_vllm(profile), "buggy")
    died = [v for v in res.violations if v.invariant == "engine-alive"]
    assert died and "assert blk.block_hash is None" in died[0].detail, res.violated
    assert "kv-ownership" in res.violated


@pytest.mark.parametrize("profile", ["0.10", "0.11"])
def test_a_held_prefill_waits_for_a_step_and_a_retried_id_overwrites_it(profile: str) -> None:
    """Before 0.33, ``has_requests`` does not count the requests P holds for the decode side
    (0.11.0 scheduler.py:1167-1171): an idle P takes no step, so D's transfer-done notice waits
    and the retried X's ADD overwrites the held X (as vLLM's own NIXL code on the vllm backend
    shows: ``racesim conform pd-reuse --vllm 0.10``). The notice then ends the new X's hold
    after its step's outputs (scheduler.py:990 in 0.11.0), not before them: no assert."""
    res = run_scenario(load_scenario("pd-reuse").with_vllm(profile), "buggy")
    assert {"unique-live-id", "kv-ownership"} <= set(res.violated), res.violated
    assert "engine-alive" not in res.violated
    ends = [(e.kind, e.inc) for e in res.trace if e.kind in ("sched.finish", "pd.release")
            and e.component.startswith("prefill")]
    release = next(e for e in ends if e[0] == "pd.release")
    assert ends.index(release) > ends.index(("sched.finish", release[1])), ends


def test_on_033_an_idle_prefill_still_steps_for_its_notice() -> None:
    res = run_scenario(load_scenario("pd-reuse"), "buggy")
    releases = [e.time for e in res.trace if e.kind == "pd.release"]
    adds = [e.time for e in res.trace if e.kind == "sched.add" and e.component.startswith("prefill")]
    assert releases and releases[0] < adds[1]  # released before the retried X arrives


def test_on_011_the_runner_feeds_a_reused_ids_prefill_the_old_requests_last_token() -> None:
    """#29355 on 0.11: a step with nothing to compute keeps the runner's last sampled tokens,
    which the next step feeds by ID into the re-added X's prefill (0.11.0
    gpu_model_runner.py:2241-2246, 2163-2170, 849-860), as vLLM 0.11.0's own runner does."""
    res = run_scenario(load_scenario("async-sched-reuse").with_vllm("0.11"), "buggy")
    assert "no-crosstalk" in res.violated, res.violated
    assert "no-crosstalk" not in run_scenario(
        load_scenario("async-sched-reuse").with_vllm("0.10"), "buggy").violated
