"""Scheduler and KV cache manager: everything keyed by the request-ID string, as vLLM 0.33's
``Scheduler.requests`` (v1/core/sched/scheduler.py:223) and ``req_to_blocks``
(v1/core/single_type_kv_cache_manager.py:126).

These drive the components by hand, the way EngineCore would, so each test reads as the
sequence of calls a duplicate ID goes through.
"""

from __future__ import annotations

import pytest

from racesim.engine_model import EngineConfig
from racesim.engine_model.events import KvFree
from racesim.engine_model.fatal import EngineFatal
from racesim.engine_model.kv_cache import KVCacheManager
from racesim.engine_model.messages import EngineCoreRequest, Token
from racesim.engine_model.request import Request, RequestStatus
from racesim.engine_model.scheduler import Scheduler
from racesim.sim import World


def _request(rid: str, inc: int, prompt_tokens: int = 32) -> Request:
    return Request(EngineCoreRequest(rid, rid, prompt_tokens, 40, 0, None, None, inc))


def _engine(num_blocks: int = 8) -> tuple[World, KVCacheManager, Scheduler]:
    world = World(0)
    kv = KVCacheManager(world, "engine.kv", num_blocks, 16)
    return world, kv, Scheduler(world, "engine.scheduler", EngineConfig(vllm="0.8"), kv)


def _log(world: World) -> list[tuple[str, str | None, int]]:
    return [(e.kind, e.request, e.inc) for e in world.trace]


def test_duplicate_add_overwrites_the_dict_while_the_old_object_keeps_running() -> None:
    world, _kv, sched = _engine()
    old = _request("X", inc=1)
    sched.add_request(old)
    sched.schedule()
    assert old.status == RequestStatus.RUNNING

    new = _request("X", inc=2)
    sched.add_request(new)                       # vLLM before #28973: no duplicate check

    assert sched.requests["X"] is new
    assert [r for r in sched.running if r is old] == [old]
    assert list(sched.waiting) == [new]
    adds = [(e.inc, e.detail.prev) for e in world.trace if e.kind == "sched.add"]
    assert adds == [(1, 0), (2, 1)]


def test_the_late_abort_ends_the_new_request_and_frees_the_old_ones_blocks() -> None:
    world, kv, sched = _engine()
    old = _request("X", inc=1)
    sched.add_request(old)
    step = sched.schedule()                      # old: RUNNING with blocks [0, 1]
    sched.update_from_output(step, {"X": Token(1, 0, False)})
    sched.add_request(_request("X", inc=2))      # the re-ADD that overtook the ABORT

    ended = sched.finish_requests(["X"], RequestStatus.FINISHED_ABORTED, "abort")

    assert [r.inc for r in ended] == [2]
    assert old.status == RequestStatus.RUNNING and old in sched.running
    assert "X" not in sched.requests and not sched.waiting
    assert kv.num_free_blocks == kv.num_blocks   # the old request runs on freed blocks
    assert sched.finished_req_ids == {"X": None}
    assert _log(world)[-3:] == [("sched.add", "X", 2), ("sched.finish", "X", 2),
                                ("kv.free", "X", 2)]
    free = [e.detail for e in world.trace if isinstance(e.detail, KvFree)]
    assert [(f.blocks, f.owners) for f in free] == [([0, 1], [1, 1])]

    # The old request is still in `running`; scheduling it looks its ID up: KeyError.
    with pytest.raises(EngineFatal, match=r"KeyError: 'X' in Scheduler\.requests"):
        sched.schedule()


def test_req_to_blocks_is_shared_by_a_duplicate_id() -> None:
    world, kv, _sched = _engine()
    old, new = _request("X", inc=1), _request("X", inc=2, prompt_tokens=48)
    assert kv.allocate_slots(old, 32)
    assert kv.req_to_blocks["X"] == [0, 1]

    assert kv.allocate_slots(new, 48)            # extends the old request's list

    assert kv.req_to_blocks["X"] == [0, 1, 2]
    assert [kv.owner_of(b) for b in (0, 1, 2)] == [1, 1, 2]
    allocs = [(e.inc, e.detail.blocks, e.detail.table)
              for e in world.trace if e.kind == "kv.alloc"]
    assert allocs == [(1, [0, 1], [0, 1]), (2, [2], [0, 1, 2])]


def test_a_same_size_duplicate_allocates_nothing_and_rides_on_the_old_blocks() -> None:
    world, kv, _sched = _engine()
    old, new = _request("X", inc=1), _request("X", inc=2)
    kv.allocate_slots(old, 32)
    free_before = kv.num_free_blocks
    assert kv.allocate_slots(new, 32)
    assert kv.num_free_blocks == free_before
    assert [e.inc for e in world.trace if e.kind == "kv.alloc"] == [1]


def test_free_of_the_new_request_returns_the_old_requests_blocks() -> None:
    world, kv, _sched = _engine()
    old, new = _request("X", inc=1), _request("X", inc=2, prompt_tokens=48)
    kv.allocate_slots(old, 32)
    kv.allocate_slots(new, 48)

    freed = kv.free(new)

    assert freed == [0, 1, 2]
    assert "X" not in kv.req_to_blocks and "X" not in kv.num_cached_block
    assert kv.num_free_blocks == kv.num_blocks
    assert [kv.owner_of(b) for b in range(kv.num_blocks)] == [0] * kv.num_blocks
    (event,) = [e for e in world.trace if e.kind == "kv.free"]
    assert (event.inc, event.detail.owners) == (2, [1, 1, 2])
    assert kv.free(old) == [], "the old request's own free finds nothing left"


def test_free_queue_is_deterministic_tail_first() -> None:
    _world, kv, _sched = _engine(num_blocks=4)
    a, b = _request("A", 1), _request("B", 2)
    kv.allocate_slots(a, 32)                     # [0, 1]
    kv.allocate_slots(b, 16)                     # [2]
    kv.free(a)                                   # back as ... 3, 1, 0
    c = _request("C", 3, prompt_tokens=48)
    kv.allocate_slots(c, 48)
    assert kv.req_to_blocks["C"] == [3, 1, 0]


def test_scheduler_respects_max_num_seqs_and_the_block_pool() -> None:
    world = World(0)
    kv = KVCacheManager(world, "engine.kv", 3, 16)
    sched = Scheduler(world, "engine.scheduler", EngineConfig(vllm="0.8", max_num_seqs=2), kv)
    for i, rid in enumerate("ABC", start=1):
        sched.add_request(_request(rid, i, prompt_tokens=16))
    out = sched.schedule()
    assert [r.inc for r in out.scheduled_objects] == [1, 2]      # max_num_seqs = 2
    assert [r.request_id for r in sched.waiting] == ["C"]

    world2 = World(0)
    kv2 = KVCacheManager(world2, "engine.kv", 3, 16)
    sched2 = Scheduler(world2, "engine.scheduler", EngineConfig(vllm="0.8"), kv2)
    sched2.add_request(_request("A", 1, prompt_tokens=32))
    sched2.add_request(_request("B", 2, prompt_tokens=32))
    out2 = sched2.schedule()
    assert [r.inc for r in out2.scheduled_objects] == [1]        # B needs 2 blocks, 1 is free
    assert [r.request_id for r in sched2.waiting] == ["B"]
