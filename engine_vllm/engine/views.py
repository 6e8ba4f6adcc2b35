"""What the checker reads of a vLLM engine: block owners, held IDs, fake vocabulary, tokenizer.

vLLM's ``KVCacheManager`` keeps ``req_to_blocks`` keyed by request ID (single_type_kv_cache_
manager.py), and its Request objects do not know the simulator's incarnations. ``KvShadow``
diffs the block tables after every call into the scheduler and records ``kv.alloc`` /
``kv.free`` (with the prefix-cache hits and the blocks that stay shared) and the true owner of
each block, found through the Request *object* that held it.
"""

from __future__ import annotations

from typing import Any

from racesim.engine_model.events.engine import KvAlloc, KvFree
from racesim.engine_model.kv_cache import release_share
from racesim.engine_model.messages import EngineCoreRequest, Token
from racesim.sim.world import World

__all__ = ["KvShadow", "SchedulerView", "Vocabulary", "EosIds", "PromptTokens", "StopTokenizer",
           "PROMPT_TOKEN"]

#: the token id of an unnamed prompt's tokens
PROMPT_TOKEN = 3


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
        #: token id -> its Token, for the ids decoded so far (every step decodes the same few)
        self._tokens: dict[int, Token] = {}

    def encode(self, token: Token) -> int:
        return self.code(token.inc, token.ctx, token.eos)

    def code(self, inc: int, ctx: int, eos: bool) -> int:
        """``encode(Token(inc, ctx, eos))`` without building the Token."""
        key = (inc, ctx)
        code = self._codes.get(key)
        if code is None:
            code = self._codes[key] = len(self._pairs)
            self._pairs.append(key)
        return self.BASE + 2 * code + (1 if eos else 0)

    def decode(self, token_id: int) -> Token:
        token = self._tokens.get(token_id)
        if token is None:
            inc, ctx = self._pairs[(token_id - self.BASE) // 2]
            token = Token(inc, ctx, token_id % 2 == 1)
            if token_id >= self.BASE:  # a code's pair never changes once given
                self._tokens[token_id] = token
        return token

    def inc_of(self, token_id: int) -> int:
        """``decode(token_id).inc``."""
        return self._pairs[(token_id - self.BASE) // 2][0]


class StopTokenizer:
    """A deterministic tokenizer that vLLM's ``SlowIncrementalDetokenizer`` accepts: every
    output token is the one character ``a`` (the prompt's are ``p``). A scenario's
    ``stop_string_at = N`` becomes the stop string ``a`` * N, which the N-th output token
    completes (detokenizer.py:99-160)."""

    is_fast = False

    def __len__(self) -> int:
        return 1 << 62  # every id is in range (detokenizer_utils.py: ``< len(tokenizer)``)

    def convert_ids_to_tokens(self, ids: list[int], skip_special_tokens: bool = False,
                              ) -> list[str]:
        return ["p" if i == PROMPT_TOKEN else "a" for i in ids]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return "".join(tokens)

    def get_added_vocab(self) -> dict[str, int]:
        return {}

    def get_lora_tokenizer(self, lora_request: object = None) -> StopTokenizer:
        """vLLM before 0.11 asks its tokenizer group for the request's LoRA tokenizer
        (0.10.1.1 output_processor.py:336-337): this one, for every request."""
        return self


class PromptTokens:
    """Prompt token ids by prompt name: requests naming one prompt get equal ids (so vLLM's
    block hashes, and its prefix hits, match the model's); an unnamed prompt is its
    incarnation's own, as in the model (``Request.prompt``). A prompt's number is spelled in
    base 1000 in its first tokens (all below the fake vocabulary's output ids); the rest are 3."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}

    def ids(self, msg: EngineCoreRequest) -> list[int]:
        key = msg.prompt or f"#inc{msg.inc}"
        code = self._codes.get(key)
        if code is None:
            code = self._codes[key] = len(self._codes)
        digits = [1 + code % 1000]
        while code >= 1000:
            code //= 1000
            digits.append(1 + code % 1000)
        n = msg.prompt_tokens
        return (digits + [3] * n)[:n]


class KvShadow:
    """Who owns each block of one engine's pool, kept by diffing vLLM's block tables.

    With prefix caching a block sits in several tables (vLLM's ``ref_cnt``): its first holder is
    its owner, the others share it, as the model's KVCacheManager records it. A table that
    appears with blocks already held, or cached and free, got them from a prefix hit: the hit is
    the first ``num_computed_tokens - num_scheduled_tokens`` tokens of a request just scheduled
    from waiting (scheduler.py: ``get_computed_blocks`` then ``allocate_slots``).

    Blocks are the table holder's, except where vLLM's ``allocate_slots`` extended an ID's table
    for another Request object than the one that holds it: with a duplicate ID before 0.20 the
    re-added request and the old one, both running, grow one table (``req_to_blocks`` keyed by
    ID, 0.11.0 single_type_kv_cache_manager.py:47, 109-131; allocate_new_blocks before
    cache_blocks, kv_cache_manager.py:288-302). The Request vLLM passes to its own
    ``allocate_slots`` says whose blocks those are, and a scheduler call that raises still has
    its blocks recorded (:meth:`sync` from the engine's ``call``)."""

    def __init__(self, world: World, component: str, manager: Any, inc_of: Any,
                 caching: bool, inc_of_object: Any = None) -> None:
        self.world = world
        self.component = component
        self.caching = caching
        self._tables = manager.coordinator.single_type_managers[0].req_to_blocks
        self._inc_of = inc_of  # request ID -> the incarnation of the object holding it now
        #: request ID -> (table length before, after, the allocating incarnation) for each
        #: allocate_slots call that grew the table for another object than its holder's
        self._foreign: dict[str, list[tuple[int, int, int]]] = {}
        #: request ID -> (its table's block ids as last seen, the incarnation holding it)
        self._seen: dict[str, tuple[list[int], int]] = {}
        self._owner: dict[int, int] = {}  # block -> its first holder's incarnation
        self._sharers: dict[int, list[int]] = {}  # block -> the other holders
        self._ref: dict[int, int] = {}  # block -> how many tables hold it
        if inc_of_object is not None:
            self._watch(manager, inc_of_object)

    def sync(self, freed_by: dict[str, int] | None = None,
             hits: dict[str, int] | None = None) -> None:
        """Record what the last scheduler call freed and allocated (frees first). ``hits``:
        how many leading blocks of a new table came from the prefix cache."""
        tables = self._tables
        seen = self._seen
        current: dict[str, list[int]] = {}
        for rid, blocks in tables.items():
            if blocks:
                current[rid] = [b.block_id for b in blocks]
        for rid in list(seen):
            ids, inc = seen[rid]
            now = current.get(rid)
            if now is not None and now[:len(ids)] == ids:
                continue
            del seen[rid]
            self._free(rid, (freed_by or {}).get(rid, inc), ids)
        foreign = self._foreign
        for rid, now in current.items():
            entry = seen.get(rid)
            known = len(entry[0]) if entry is not None else 0
            if known == len(now):
                continue
            inc = entry[1] if entry is not None else self._inc_of(rid)
            hit_n = (hits or {}).get(rid, 0) if entry is None else 0
            hit = now[:hit_n]
            start = known + len(hit)
            grants = foreign.get(rid)
            if not grants:
                self._alloc(rid, inc, now[start:], now, hit)
                continue
            for lo, hi, by in self._runs(start, len(now), grants, inc):
                self._alloc(rid, by, now[lo:hi], now[:hi], hit if lo == start else [], inc)
        foreign.clear()

    @staticmethod
    def _runs(start: int, end: int, grants: list[tuple[int, int, int]],
              holder: int) -> list[tuple[int, int, int]]:
        """Table positions ``start:end`` in runs of one allocating incarnation: a granted
        position is the incarnation whose ``allocate_slots`` appended it, the rest the
        holder's."""
        by = [holder] * (end - start)
        for lo, hi, inc in grants:
            for p in range(max(lo, start), min(hi, end)):
                by[p - start] = inc
        runs: list[tuple[int, int, int]] = []
        for p, inc in enumerate(by, start):
            if runs and runs[-1][2] == inc:
                runs[-1] = (runs[-1][0], p + 1, inc)
            else:
                runs.append((p, p + 1, inc))
        return runs

    def _watch(self, manager: Any, inc_of_object: Any) -> None:
        """Wrap the manager's ``allocate_slots`` (on this instance: the Scheduler calls it
        through ``self.kv_cache_manager``) to note which Request object grew a table."""
        real = manager.allocate_slots
        tables = self._tables
        seen = self._seen

        def allocate_slots(request: Any, *args: Any, **kwargs: Any) -> Any:
            rid = request.request_id
            inc = inc_of_object(request)
            entry = seen.get(rid)
            if inc == (entry[1] if entry is not None else self._inc_of(rid)):
                return real(request, *args, **kwargs)  # the holder's own: sync attributes it
            before = len(tables[rid]) if rid in tables else 0
            try:
                return real(request, *args, **kwargs)
            finally:
                after = len(tables[rid]) if rid in tables else 0
                if after > before:
                    self._foreign.setdefault(rid, []).append((before, after, inc))

        manager.allocate_slots = allocate_slots

    def _alloc(self, rid: str, inc: int, new: list[int], table: list[int],
               hit: list[int], holder: int | None = None) -> None:
        owner, ref, sharers = self._owner, self._ref, self._sharers
        for b in hit:
            if ref.get(b, 0):
                sharers.setdefault(b, []).append(inc)
            else:
                owner[b] = inc
            ref[b] = ref.get(b, 0) + 1
        for b in new:
            owner[b] = inc
            ref[b] = 1
        self._seen[rid] = (list(table), inc if holder is None else holder)
        self.world.emit(self.component, rid, inc, KvAlloc(new, list(table), hit or None))

    def _free(self, rid: str, inc: int, blocks: list[int]) -> None:
        owner, ref, sharers = self._owner, self._ref, self._sharers
        owners = [owner.get(b, 0) for b in blocks]
        kept: list[int] = []
        for b in blocks:
            held = sharers.get(b)
            if held is not None:
                heir = release_share(sharers, b, held, inc)
                if heir is not None:
                    owner[b] = heir
            left = ref.get(b, 0) - 1
            if left > 0:
                ref[b] = left
                kept.append(b)
            else:
                ref.pop(b, None)
                owner.pop(b, None)
        self.world.emit(self.component, rid, inc, KvFree(blocks, owners, kept or None))

    # -- the leak audit's view (KVCacheManager in the model) ------------------------------------

    def live_ids(self) -> list[tuple[str, list[int]]]:
        owner = self._owner
        return [(rid, [owner.get(b.block_id, 0) for b in blocks])
                for rid, blocks in self._tables.items()]

    def owned_blocks(self) -> list[tuple[int, int]]:
        return [(b, self._owner[b]) for b in sorted(self._owner)]


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
