"""The vllm backend's block owners (engine_vllm/engine/views.py ``KvShadow``) when two Request
objects share one ID's block table, as a duplicate ADD makes them on vLLM 0.9.2-0.11.0
(``req_to_blocks`` keyed by ID; issue 28: ``racesim conform --vllm 0.11`` showed kv-ownership
on the model only). Driven here through a stand-in for vLLM's KVCacheManager (its
``req_to_blocks`` and an ``allocate_slots`` that appends to it), so it runs without vLLM."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest

from racesim.engine_vllm.engine.views import KvShadow
from racesim.sim.world import World


class _Manager:
    """What KvShadow reads of vLLM's KVCacheManager: one group's ``req_to_blocks`` by ID, and
    ``allocate_slots(request, n)``, here appending ``n`` blocks (and raising after it when asked,
    as 0.10's ``cache_blocks`` asserts after ``allocate_new_blocks``)."""

    def __init__(self) -> None:
        self.tables: defaultdict[str, list[Any]] = defaultdict(list)
        self.coordinator = SimpleNamespace(
            single_type_managers=[SimpleNamespace(req_to_blocks=self.tables)])
        self._next = 1
        self.fail = False

    def allocate_slots(self, request: Any, n: int) -> list[Any]:
        new = [SimpleNamespace(block_id=self._next + k) for k in range(n)]
        self._next += n
        self.tables[request.request_id].extend(new)
        if self.fail:
            raise AssertionError("assert blk.block_hash is None")
        return new


def _shadow() -> tuple[World, _Manager, KvShadow, dict[int, int], dict[str, Any]]:
    world = World(0)
    manager = _Manager()
    incs: dict[int, int] = {}  # id(Request) -> incarnation
    held: dict[str, Any] = {}  # Scheduler.requests

    def inc_of(req: Any) -> int:
        return incs.get(id(req), 0)

    shadow = KvShadow(world, "engine.kv", manager, lambda rid: inc_of(held.get(rid)), False,
                      inc_of)
    return world, manager, shadow, incs, held


def _x_re_added() -> tuple[World, _Manager, KvShadow, Any, Any]:
    """X (incarnation 4) holds two blocks; a second X (6) is added under the same ID:
    add_request overwrites requests["X"], and the block table stays."""
    world, manager, shadow, incs, held = _shadow()
    first, second = SimpleNamespace(request_id="X"), SimpleNamespace(request_id="X")
    incs[id(first)], incs[id(second)] = 4, 6
    held["X"] = first
    manager.allocate_slots(first, 2)
    shadow.sync()
    held["X"] = second
    return world, manager, shadow, first, second


def _allocs(world: World) -> list[tuple[int, list[int], list[int]]]:
    return [(ev.inc, ev.detail.blocks, ev.detail.table) for ev in world.trace.events
            if ev.kind == "kv.alloc"]


def test_blocks_a_re_added_request_appends_to_the_shared_table_are_its_own() -> None:
    world, manager, shadow, first, second = _x_re_added()
    manager.allocate_slots(first, 1)  # the old request, still running, grows it
    manager.allocate_slots(second, 1)  # then the re-added one
    shadow.sync()
    assert _allocs(world) == [(4, [1, 2], [1, 2]), (4, [3], [1, 2, 3]), (6, [4], [1, 2, 3, 4])]


def test_a_scheduler_call_that_raises_still_records_its_blocks() -> None:
    world, manager, shadow, first, second = _x_re_added()
    manager.fail = True
    with pytest.raises(AssertionError):
        manager.allocate_slots(second, 1)
    shadow.sync()  # what the engine's call does before it dies
    assert _allocs(world)[-1] == (6, [3], [1, 2, 3])


def test_the_holders_own_allocations_are_unchanged() -> None:
    world, manager, shadow, incs, held = _shadow()
    req = SimpleNamespace(request_id="Y")
    incs[id(req)] = 2
    held["Y"] = req
    manager.allocate_slots(req, 1)
    manager.allocate_slots(req, 2)
    shadow.sync()
    assert _allocs(world) == [(2, [1, 2, 3], [1, 2, 3])]
