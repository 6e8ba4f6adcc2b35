"""A duplicate ADD on vLLM 0.9.2, 0.10.1.1 and 0.11.0 (issue 28, model truths; vLLM wins):
``Scheduler.add_request`` overwrites ``requests[id]`` (0.11.0 scheduler.py:1097-1099), both
Request objects share ``req_to_blocks[id]`` and ``num_cached_block[id]``, and
``cache_blocks`` sets that count to the calling request's full blocks whatever it was
(single_type_kv_cache_manager.py:154 in 0.11.0, :150 in 0.10.1.1, :156 in 0.9.2). When the
second request's count lowers it, the first re-hashes a block it hashed already and the engine
dies inside schedule() on ``assert blk.block_hash is None`` (block_pool.py:223 in 0.11.0,
:129 in 0.10.1.1, :145 in 0.9.2), as the vllm backend shows on multi-frontend. The model used
to run on with a shared table and die later on a KeyError."""

from __future__ import annotations

import pytest

from racesim.runner import run_scenario
from racesim.scenarios import load_scenario


@pytest.mark.parametrize("profile", ["0.9", "0.10", "0.11"])
def test_a_duplicate_add_dies_on_the_block_hash_assert(profile: str) -> None:
    scen = load_scenario("multi-frontend").with_vllm(profile)
    res = run_scenario(scen, "buggy", witness=True)
    died = [v for v in res.violations if v.invariant == "engine-alive"]
    assert died and "assert blk.block_hash is None" in died[0].detail, res.violated
    assert "unique-live-id" in res.violated
