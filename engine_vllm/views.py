"""What the checker reads of a vLLM engine: block owners, held IDs, and the fake vocabulary.

vLLM's ``KVCacheManager`` keeps ``req_to_blocks`` keyed by request ID (single_type_kv_cache_
manager.py), and its Request objects do not know the simulator's incarnations. ``KvShadow``
diffs the block tables after every call into the scheduler and records ``kv.alloc`` /
``kv.free`` with the true owner of each block, found through the Request *object* that held it.
"""

from __future__ import annotations

from typing import Any

from racesim.engine_model.messages import Token
from racesim.sim.world import World

__all__ = ["KvShadow", "SchedulerView", "Vocabulary", "EosIds"]


class EosIds(list[int]):
    """``stop_token_ids`` of every request: the fake vocabulary's odd ids end a sequence
    (``check_stop`` tests ``token in stop_token_ids``, vllm/v1/core/sched/utils.py:109)."""

    def __contains__(self, token: object) -> bool:
        return isinstance(token, int) and token >= Vocabulary.BASE and token % 2 == 1


class Vocabulary:
    """Token ids that encode a sampled token's provenance (incarnation, fed-back input, end of
    sequence), so a token routed to the wrong request is seen as such at the client."""

    BASE = 1024

    def __init__(self) -> None:
        self._codes: dict[tuple[int, int], int] = {}
        self._pairs: list[tuple[int, int]] = []

    def encode(self, token: Token) -> int:
        key = (token.inc, token.ctx)
        code = self._codes.get(key)
        if code is None:
            code = self._codes[key] = len(self._pairs)
            self._pairs.append(key)
        return self.BASE + 2 * code + (1 if token.eos else 0)

    def decode(self, token_id: int) -> Token:
        inc, ctx = self._pairs[(token_id - self.BASE) // 2]
        return Token(inc, ctx, token_id % 2 == 1)


class KvShadow:
    """Who owns each block of one engine's pool, kept by diffing vLLM's block tables."""

    def __init__(self, world: World, component: str, manager: Any, inc_of: Any) -> None:
        self.world = world
        self.component = component
        self._tables = manager.coordinator.single_type_managers[0].req_to_blocks
        self._inc_of = inc_of  # request ID -> the incarnation of the object holding it now
        self._owner: dict[int, tuple[str, int]] = {}

    def sync(self, freed_by: dict[str, int] | None = None) -> None:
        """Record what the last scheduler call freed and allocated (frees first)."""
        now: dict[int, str] = {}
        for rid, blocks in self._tables.items():
            for b in blocks:
                now[b.block_id] = rid
        owner = self._owner
        frees: dict[str, list[int]] = {}
        for b, (rid, _inc) in owner.items():
            if now.get(b) != rid:
                frees.setdefault(rid, []).append(b)
        for rid, blocks in frees.items():
            incs = [owner.pop(b)[1] for b in blocks]
            inc = (freed_by or {}).get(rid, incs[0])
            self.world.record(self.component, "kv.free", rid, inc, blocks=blocks, owners=incs)
        allocs: dict[str, list[int]] = {}
        for b, rid in now.items():
            if b not in owner:
                allocs.setdefault(rid, []).append(b)
        for rid, blocks in allocs.items():
            inc = self._inc_of(rid)
            for b in blocks:
                owner[b] = (rid, inc)
            table = [b.block_id for b in self._tables[rid]]
            self.world.record(self.component, "kv.alloc", rid, inc, blocks=blocks, table=table)

    # -- the leak audit's view (KVCacheManager in the model) ------------------------------------

    def live_ids(self) -> list[tuple[str, list[int]]]:
        owner = self._owner
        return [(rid, [owner[b.block_id][1] if b.block_id in owner else 0 for b in blocks])
                for rid, blocks in self._tables.items()]

    def owned_blocks(self) -> list[tuple[int, int]]:
        return [(b, self._owner[b][1]) for b in sorted(self._owner)]


class SchedulerView:
    """The leak audit's view of vLLM's Scheduler: ``requests``, then waiting and running."""

    def __init__(self, scheduler: Any, inc_of_object: Any) -> None:
        self._s = scheduler
        self._inc = inc_of_object

    def live_ids(self) -> list[tuple[str, str, int]]:
        s, inc = self._s, self._inc
        held = [("requests", rid, inc(req)) for rid, req in s.requests.items()]
        held += [("queues", req.request_id, inc(req)) for req in [*s.waiting, *s.running]]
        return held
