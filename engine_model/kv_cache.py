"""KVCacheManager: a fixed block pool, a deterministic free queue, ``req_to_blocks`` keyed by ID.

Because the table is keyed by the request-ID string (a defaultdict, as in vLLM), a second
incarnation under a live ID extends the first one's block list, and freeing "the request" frees
whatever list the ID holds now (vLLM #15326).
"""

from __future__ import annotations

from collections import defaultdict, deque

from racesim.engine_model.events.engine import KvAlloc, KvFree
from racesim.engine_model.request import Request
from racesim.sim.world import World

__all__ = ["KVCacheManager"]


class KVCacheManager:
    """A fixed block pool with ``req_to_blocks`` keyed by request ID, as vLLM's."""

    __slots__ = ("world", "component", "block_size", "num_blocks", "free_queue", "req_to_blocks",
                 "num_cached_block", "_owner")

    def __init__(self, world: World, component: str, num_blocks: int, block_size: int) -> None:
        self.world = world
        self.component = component
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free_queue: deque[int] = deque(range(num_blocks))
        self.req_to_blocks: defaultdict[str, list[int]] = defaultdict(list)
        self.num_cached_block: dict[str, int] = {}
        # Ground truth for the checker and reports: the incarnation each block was allocated for.
        self._owner: list[int] = [0] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def owner_of(self, block: int) -> int:
        return self._owner[block]

    def live_ids(self) -> list[tuple[str, list[int]]]:
        """``(request ID, the owner of each of its blocks)`` for every ``req_to_blocks`` entry,
        empty ones included (a lookup on a miss creates one)."""
        owner = self._owner
        return [(rid, [owner[b] for b in blocks]) for rid, blocks in self.req_to_blocks.items()]

    def owned_blocks(self) -> list[tuple[int, int]]:
        """``(block, owner incarnation)`` for every block not free, in block order."""
        return [(b, o) for b, o in enumerate(self._owner) if o]

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Make room for ``num_new_tokens`` more tokens; False when the pool is too small."""
        rid = request.request_id
        blocks = self.req_to_blocks[rid]
        total = request.num_computed_tokens + num_new_tokens
        need = -(-total // self.block_size) - len(blocks)
        if need > len(self.free_queue):
            return False
        if need > 0:
            fq = self.free_queue
            new = [fq.popleft() for _ in range(need)]
            owner = self._owner
            for b in new:
                owner[b] = request.inc
            blocks.extend(new)
            self.num_cached_block[rid] = len(blocks)
            self.world.emit(self.component, rid, request.inc, KvAlloc(new, list(blocks)))
        return True

    def free(self, request: Request) -> list[int]:
        """Return the ID's blocks to the pool (tail first, as vLLM evicts them)."""
        rid = request.request_id
        blocks = self.req_to_blocks.pop(rid, [])
        self.num_cached_block.pop(rid, None)
        if blocks:
            owner = self._owner
            owners = [owner[b] for b in blocks]
            for b in blocks:
                owner[b] = 0
            self.free_queue.extend(reversed(blocks))
            self.world.emit(self.component, rid, request.inc, KvFree(blocks, owners))
        return blocks

    def get_block_ids(self, request_id: str) -> list[int]:
        # vLLM reads req_to_blocks[request_id] on a defaultdict: a miss creates an empty entry.
        return list(self.req_to_blocks[request_id])
