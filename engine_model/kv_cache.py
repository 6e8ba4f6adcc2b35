"""KVCacheManager: a fixed block pool, a deterministic free queue, ``req_to_blocks`` keyed by ID.

Because the table is keyed by the request-ID string (a defaultdict, as in vLLM), a second
incarnation under a live ID extends the first one's block list, and freeing "the request" frees
whatever list the ID holds now (vLLM #15326).

With prefix caching (vLLM 0.33 ``kv_cache_manager.py``, ``block_pool.py``,
``single_type_kv_cache_manager.py``) full blocks get a hash when they are allocated, a waiting
request's first schedule looks its prompt up and shares the blocks it hits (a reference count per
block), and a freed hashed block stays findable in the free queue until it is reused. Without
prefix caching, on a profile that appends freed blocks, the pool is the plain free list the seed
modelled: that path is kept as it was, so its traces and its cost do not change.
"""

from __future__ import annotations

from collections import defaultdict, deque

from racesim.engine_model.events.engine import KvAlloc, KvFree, KvHitAssert
from racesim.engine_model.fatal import EngineFatal
from racesim.engine_model.request import BlockHash, Request
from racesim.sim.world import World

__all__ = ["KVCacheManager", "release_share"]

_NO_BLOCKS: list[int] = []


def release_share(sharers: dict[int, list[int]], block: int, held: list[int],
                  inc: int) -> int | None:
    """Ground truth when incarnation ``inc`` lets go of shared ``block``, whose other holders
    are ``held`` (``sharers[block]``): the block's new owner when ``inc`` owned it (its first
    sharer takes over), else None. A block left with one holder is no longer shared."""
    heir = None
    if inc in held:
        held.remove(inc)
    else:
        heir = held.pop(0)
    if not held:
        del sharers[block]
    return heir


class KVCacheManager:
    """A fixed block pool with ``req_to_blocks`` keyed by request ID, as vLLM's."""

    __slots__ = ("world", "component", "block_size", "num_blocks", "free_queue", "req_to_blocks",
                 "num_cached_block", "_owner", "caching", "_counted", "_lifo", "_ref", "_hash",
                 "cached", "_sharers", "hash_by_id", "_hash_src")

    def __init__(self, world: World, component: str, num_blocks: int, block_size: int,
                 caching: bool = False, free_order: str = "append") -> None:
        self.world = world
        self.component = component
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free_queue: deque[int] = deque(range(num_blocks))
        self.req_to_blocks: defaultdict[str, list[int]] = defaultdict(list)
        self.num_cached_block: dict[str, int] = {}
        # Ground truth for the checker and reports: the incarnation each block was allocated for
        # (the first one, when it is shared; the others are in _sharers).
        self._owner: list[int] = [0] * num_blocks
        self.caching = caching
        self._lifo = free_order == "lifo-uncached"
        # Reference counts are kept whenever blocks can be shared or freed out of order; the
        # plain free list (no caching, freed blocks appended) needs none.
        self._counted = caching or self._lifo
        self._ref: list[int] = [0] * num_blocks
        self._hash: list[BlockHash | None] = [None] * num_blocks
        #: cached_block_hash_to_block (block_pool.py:58-130): hash -> blocks holding it
        self.cached: dict[BlockHash, list[int]] = {}
        self._sharers: dict[int, list[int]] = {}
        #: 0.9.2: block hashes kept by request ID (kv_cache_manager.py:112, 158-163, 373):
        #: the request whose tokens an ID's hashes come from, until the ID is freed
        self.hash_by_id = False
        self._hash_src: dict[str, Request] = {}

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

    # -- prefix caching ---------------------------------------------------------------------

    def get_computed_blocks(self, request: Request) -> list[int]:
        """The longest run of cached full blocks from the start of the request's tokens, never
        covering its last token (kv_cache_manager.py:266-328: the last token is recomputed for
        its logits; single_type_kv_cache_manager.py:743-838: the first miss ends the run)."""
        if not self.caching:
            return _NO_BLOCKS
        bs = self.block_size
        cached = self.cached
        hit: list[int] = []
        src = request
        if self.hash_by_id:  # 0.9.2: the hashes an ID was first given (a duplicate's too)
            src = self._hash_src.setdefault(request.request_id, request)
        for j in range((request.num_tokens - 1) // bs):
            if (j + 1) * bs > src.num_tokens:  # past the full blocks hashed under the ID
                break
            blocks = cached.get(src.block_hash(j, bs))
            if blocks is None:
                break
            hit.append(blocks[0])
        return hit

    def _cache_blocks(self, request: Request, blocks: list[int], num_tokens: int) -> None:
        """Hash the full blocks up to ``num_tokens`` not hashed yet
        (single_type_kv_cache_manager.py:477-543, block_pool.py:230-356)."""
        rid = request.request_id
        bs = self.block_size
        start = self.num_cached_block.get(rid, 0)
        end = min(num_tokens, request.num_tokens) // bs
        if end <= start:
            # vLLM sets the count to this request's full blocks whatever it was
            # (single_type_kv_cache_manager.py:154 in 0.11.0, :150 in 0.10.1.1, :156 in
            # 0.9.2): for one request it never goes down, but under a shared block table (a
            # duplicate ADD) it does, and the other request then re-hashes its blocks
            self.num_cached_block[rid] = end
            return
        hashes = self._hash
        cached = self.cached
        for j in range(start, min(end, len(blocks))):
            b = blocks[j]
            if hashes[b] is not None:
                # block_pool.py cache_full_blocks asserts every newly full block is unhashed
                # (0.11.0 :223, 0.10.1.1 and 0.9.2 alike): only a block table two requests
                # share under one ID (a duplicate ADD that overwrote Scheduler.requests on
                # 0.9-0.14) holds one the other request has hashed already
                raise EngineFatal("AssertionError: assert blk.block_hash is None "
                                  f"(block_pool.py cache_full_blocks: {rid!r}'s block table "
                                  f"holds a block another request under that ID hashed)")
            h = request.block_hash(j, bs)
            hashes[b] = h
            cached.setdefault(h, []).append(b)
        self.num_cached_block[rid] = end

    def _evict(self, block: int, h: BlockHash) -> None:
        """A cached block leaves the cache when it is reused (block_pool.py:769-790)."""
        self._hash[block] = None
        held = self.cached[h]
        held.remove(block)
        if not held:
            del self.cached[h]

    # -- allocate / free --------------------------------------------------------------------

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed: list[int] = _NO_BLOCKS, delay_cache: bool = False) -> bool:
        """Make room for ``num_new_tokens`` more tokens after the request's computed ones and
        the prefix-hit blocks ``computed``; False when the pool is too small
        (kv_cache_manager.py:380-627). ``delay_cache``: blocks a remote read will fill are
        hashed later (kv_cache_manager.py:610-612)."""
        rid = request.request_id
        if self._counted:
            # 0.33 reads the table with .get (single_type_kv_cache_manager.py:228): a failed
            # allocation leaves no empty entry behind
            return self._allocate_counted(request, rid, self.req_to_blocks.get(rid, _NO_BLOCKS),
                                          num_new_tokens, computed, delay_cache)
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

    def _allocate_counted(self, request: Request, rid: str, blocks: list[int],
                          num_new_tokens: int, computed: list[int], delay_cache: bool) -> bool:
        ref = self._ref
        if computed and rid in self.num_cached_block:
            # single_type_kv_cache_manager.py:230-232: an ID with a block table is taken for a
            # running request, which can have no new prefix hits.
            self.world.emit(self.component, rid, request.inc, KvHitAssert(list(computed)))
            raise EngineFatal(f"AssertionError: prefix hit for {rid!r}, which already has "
                              f"blocks (single_type_kv_cache_manager: len(new_computed_blocks)"
                              f" == 0)")
        bs = self.block_size
        total = request.num_computed_tokens + len(computed) * bs + num_new_tokens
        need = -(-total // bs) - len(blocks) - len(computed)
        if need <= 0 and not computed:
            # the common decode step: room already there; hash a block that just filled up
            if self.caching and not delay_cache and \
                    min(total, request.num_tokens) // bs != self.num_cached_block.get(rid, 0):
                self._cache_blocks(request, blocks, total)
            return True
        # A hit block in the free queue is taken out of it (get_num_blocks_to_allocate counts
        # it, single_type_kv_cache_manager.py:256-262).
        evictable = 0
        for b in computed:
            if ref[b] == 0:
                evictable += 1
        if max(need, 0) + evictable > len(self.free_queue):
            return False
        if blocks is _NO_BLOCKS:
            blocks = self.req_to_blocks[rid]
        inc = request.inc
        owner = self._owner
        fq = self.free_queue
        if computed:
            # block_pool.py:792-810 (touch): a hit block is referenced once more.
            sharers = self._sharers
            for b in computed:
                if ref[b] == 0:
                    fq.remove(b)
                    owner[b] = inc
                else:
                    sharers.setdefault(b, []).append(inc)
                ref[b] += 1
            blocks.extend(computed)
            self.num_cached_block[rid] = len(blocks)
        new: list[int] = []
        if need > 0:
            hashes = self._hash
            new = [fq.popleft() for _ in range(need)]
            for b in new:
                h = hashes[b]
                if h is not None:
                    self._evict(b, h)
                ref[b] = 1
                owner[b] = inc
            blocks.extend(new)
        if new or computed:
            self.world.emit(self.component, rid, inc,
                            KvAlloc(new, list(blocks), list(computed) if computed else None))
        if self.caching:
            if not delay_cache:
                self._cache_blocks(request, blocks, total)
        else:
            self.num_cached_block[rid] = len(blocks)
        return True

    def free(self, request: Request) -> list[int]:
        """Return the ID's blocks to the pool, tail first (vLLM evicts them in that order)."""
        rid = request.request_id
        blocks = self.req_to_blocks.pop(rid, [])
        self.num_cached_block.pop(rid, None)
        self._hash_src.pop(rid, None)
        if blocks:
            if self._counted:
                self._free_counted(request, rid, blocks)
                return blocks
            owner = self._owner
            owners = [owner[b] for b in blocks]
            for b in blocks:
                owner[b] = 0
            self.free_queue.extend(reversed(blocks))
            self.world.emit(self.component, rid, request.inc, KvFree(blocks, owners))
        return blocks

    def _free_counted(self, request: Request, rid: str, blocks: list[int]) -> None:
        """block_pool.py:816-849: a block whose count reaches 0 is free; without a hash (or
        without caching) it goes to the front of the queue, else to the tail (LRU)."""
        owner = self._owner
        ref = self._ref
        hashes = self._hash
        sharers = self._sharers
        owners = [owner[b] for b in blocks]
        inc = request.inc
        first: list[int] = []
        last: list[int] = []
        kept: list[int] = []
        lifo = self._lifo
        for b in reversed(blocks):
            held = sharers.get(b)
            if held is not None:
                heir = release_share(sharers, b, held, inc)
                if heir is not None:
                    owner[b] = heir
            if ref[b] != 1:
                # still shared: kept; already free (a second free of one table, possible only
                # where a re-added ID shares it): the count goes negative, nothing is queued
                ref[b] -= 1
                if ref[b] > 0:
                    kept.append(b)
                continue
            ref[b] = 0
            owner[b] = 0
            if lifo and hashes[b] is None:
                first.append(b)
            else:
                last.append(b)
        fq = self.free_queue
        if first:
            fq.extendleft(reversed(first))
        fq.extend(last)
        self.world.emit(self.component, rid, inc,
                        KvFree(blocks, owners, kept[::-1] if kept else None))

    def get_block_ids(self, request_id: str) -> list[int]:
        # vLLM reads req_to_blocks[request_id] on a defaultdict: a miss creates an empty entry.
        return list(self.req_to_blocks[request_id])
