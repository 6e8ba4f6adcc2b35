"""NIXL push mode's pairing of a prefill request with a decode registration (vLLM 0.33.0).

In push mode (``NixlPushConnector``) the decode side (D) does not read: when D allocates a
request's blocks it registers them with the prefill engine (P) under D's own request ID
(nixl/push_scheduler.py:177-189; the PUSH_REG notification, push_worker.py:384-414). P files
each finished request's blocks under P's own request ID (push_scheduler.py:278-279,
push_worker.py:284). P's writer thread pairs the two, whichever arrives second
(push_worker.py:274-284, 317-333), by the lookups of push_worker.py:418-448: the exact ID
first, then any entry whose ID equals it once the ``-<8 hex>`` randomization suffix is
stripped from both (nixl/utils.py:60-67), the first such entry in insertion order. Then P
WRITEs its blocks into D's and the WRITE's notification names D's request
(push_worker.py:681, 740), which completes D's load; P's blocks go when the WRITE is done
(push_worker.py:820-837) or when its lease runs out, which also evicts the unmatched entry
(:290-296, :839-843).

With randomization on, P's and D's internal IDs carry different suffixes, so the exact
lookup never hits and the base-ID fallback is the normal path: two requests in flight under one
external ID share a base ID and can be paired crosswise.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from racesim.engine_model.messages import KVPushRegistration

__all__ = ["PushMatch", "PushMatcher", "base_request_id"]

# nixl/utils.py:60-62: the suffix input_processor.assign_request_id appends.
_RANDOM_SUFFIX = re.compile(r"-[0-9a-f]{8}$", re.IGNORECASE)


def base_request_id(request_id: str) -> str:
    """``get_base_request_id``: the ID without a trailing ``-<8 hex>`` suffix."""
    return _RANDOM_SUFFIX.sub("", request_id)


@dataclass(frozen=True, slots=True)
class PushMatch:
    """One pairing: P's finished request (its ID, blocks, incarnation) and D's registration;
    ``how`` is "exact" or "base"."""

    request_id: str
    blocks: tuple[int, ...]
    inc: int
    registration: KVPushRegistration
    how: str


class PushMatcher:
    """P's writer-thread tables: finished blocks not yet paired (``_push_finished_blocks``)
    and registrations not yet paired (``_pending_d_registrations``), push_worker.py:113-116.
    ``start_write`` is called with each pairing as it is made."""

    __slots__ = ("finished", "pending", "_start_write")

    def __init__(self, start_write: Callable[[PushMatch], None]) -> None:
        self.finished: dict[str, tuple[tuple[int, ...], int]] = {}
        self.pending: dict[str, KVPushRegistration] = {}
        self._start_write = start_write

    def add_finished(self, request_id: str, blocks: tuple[int, ...], inc: int) -> None:
        """P's request finished and is held: pair it with a registration, or file it."""
        reg, how = self._pop_registration(request_id)
        if reg is None:
            self.finished[request_id] = (blocks, inc)
        else:
            self._start_write(PushMatch(request_id, blocks, inc, reg, how))

    def add_registration(self, reg: KVPushRegistration) -> None:
        """A PUSH_REG arrived: pair it with finished blocks, or file it (a later
        registration under the same D ID replaces the earlier, as the dict store does)."""
        found = self._pop_finished(reg.request_id)
        if found is None:
            self.pending[reg.request_id] = reg
        else:
            rid, blocks, inc, how = found
            self._start_write(PushMatch(rid, blocks, inc, reg, how))

    def evict(self, request_id: str) -> None:
        """P's request is done (written, or its lease ran out): drop what is left under its
        ID (push_worker.py:290-296)."""
        self.finished.pop(request_id, None)
        self.pending.pop(request_id, None)

    def _pop_registration(self, request_id: str) -> tuple[KVPushRegistration | None, str]:
        reg = self.pending.pop(request_id, None)
        if reg is not None:
            return reg, "exact"
        base = base_request_id(request_id)
        for rid in list(self.pending):
            if base_request_id(rid) == base:
                return self.pending.pop(rid), "base"
        return None, ""

    def _pop_finished(self, request_id: str) -> tuple[str, tuple[int, ...], int, str] | None:
        got = self.finished.pop(request_id, None)
        if got is not None:
            return request_id, got[0], got[1], "exact"
        base = base_request_id(request_id)
        for rid in list(self.finished):
            if base_request_id(rid) == base:
                blocks, inc = self.finished.pop(rid)
                return rid, blocks, inc, "base"
        return None
