"""Seeded random streams derived by name with a stable hash (never Python's ``hash()``)."""

from __future__ import annotations

import hashlib
import random
import sys

__all__ = ["stable_seed", "RngStreams", "SEED_SOURCE", "register_with_hypothesis"]


def stable_seed(*parts: object) -> int:
    """A 64-bit seed from ``parts`` that is the same in every process and every PYTHONHASHSEED."""
    text = "\x1f".join(repr(p) if not isinstance(p, str) else p for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


class RngStreams:
    """One ``random.Random`` per name, all derived from one run seed.

    Streams are independent: drawing more numbers from one never shifts another, so adding a
    consumer (say, a new exploration strategy) does not change what the model draws.
    """

    __slots__ = ("_seed", "_streams")

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._streams: dict[str, random.Random] = {}

    @property
    def seed(self) -> int:
        return self._seed

    def stream(self, name: str) -> random.Random:
        rng = self._streams.get(name)
        if rng is None:
            rng = random.Random(stable_seed(self._seed, name))
            self._streams[name] = rng
        return rng


#: Where a fresh run seed comes from when the user gives none (exploration's base seed,
#: generated workloads). Registered with ``hypothesis.register_random`` (see
#: :func:`register_with_hypothesis`), so property tests that draw from it are reproducible. A
#: run itself never touches it: everything inside a World comes from the World's own streams.
SEED_SOURCE = random.Random(0)


def register_with_hypothesis() -> None:
    """Hand :data:`SEED_SOURCE` to hypothesis if hypothesis is loaded; never import it.

    Called when this module loads and by racesim's hypothesis entry point
    (``_racesim_hypothesis``), so the registration happens whichever of the two loads first,
    and the entry point itself imports nothing of racesim."""
    register = getattr(sys.modules.get("hypothesis"), "register_random", None)
    if register is not None:  # None too while hypothesis is still importing: its entry point
        register(SEED_SOURCE)  # then calls this again once it has finished


register_with_hypothesis()
