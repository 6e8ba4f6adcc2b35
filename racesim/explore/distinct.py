"""Counting the distinct schedules an exploration ran, in bounded memory.

Exploration reports how many distinct traces its runs made. Keeping every schedule (a tuple of
decisions, about 2.7 KB a run) grows without bound on a long ``--time-limit`` run. This keeps
an 8-byte digest per distinct schedule instead (BLAKE2b of its repr: no ``hash()``, the same in
every process), exact up to ``exact_limit`` distinct schedules (2**18 by default, about 20 MB);
past that it folds them into a HyperLogLog sketch of 2**14 one-byte registers (16 KB, about 1 %
standard error) and the count is marked as an estimate. Nothing else in an exploration reads
the count, so the runs, the first violation and the counterexample are unchanged.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable

__all__ = ["DistinctCounter"]

_P = 14  # 2**14 registers
_M = 1 << _P
_REST = 64 - _P
_ALPHA = 0.7213 / (1 + 1.079 / _M)


def _digest(item: Hashable) -> int:
    return int.from_bytes(hashlib.blake2b(repr(item).encode(), digest_size=8).digest(), "big")


class DistinctCounter:
    """How many distinct items were added: exact up to ``exact_limit``, then estimated."""

    __slots__ = ("_seen", "_registers", "_exact_limit")

    def __init__(self, exact_limit: int = 2**18) -> None:
        self._seen: set[int] | None = set()
        self._registers = bytearray(0)
        self._exact_limit = exact_limit

    @property
    def estimated(self) -> bool:
        """True once the count is the sketch's estimate rather than exact."""
        return self._seen is None

    def add(self, item: Hashable) -> None:
        x = _digest(item)
        seen = self._seen
        if seen is not None:
            seen.add(x)
            if len(seen) > self._exact_limit:
                self._registers = bytearray(_M)
                for d in seen:
                    self._fold(d)
                self._seen = None
            return
        self._fold(x)

    def _fold(self, x: int) -> None:
        index, rest = x >> _REST, x & ((1 << _REST) - 1)
        rank = _REST - rest.bit_length() + 1
        if rank > self._registers[index]:
            self._registers[index] = rank

    def __len__(self) -> int:
        if self._seen is not None:
            return len(self._seen)
        regs = self._registers
        estimate = _ALPHA * _M * _M / sum(2.0 ** -r for r in regs)
        zeros = regs.count(0)
        if estimate <= 2.5 * _M and zeros:  # small-range correction (linear counting)
            estimate = _M * math.log(_M / zeros)
        return round(estimate)
