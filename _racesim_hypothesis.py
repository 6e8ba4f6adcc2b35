"""Hypothesis entry point: let hypothesis control racesim's seed source, importing nothing.

``pyproject.toml`` names :func:`_register` under ``[project.entry-points.hypothesis]``, so
hypothesis imports this module and calls it when it is itself imported, in every project that
has racesim installed. That is why it is a top-level module and not ``racesim._hypothesis``:
loading it must not load even the ``racesim`` package. Importing racesim (and simpy) there would
cost every such project time, so registration is lazy and happens once both are loaded, in
whichever order they come:

- racesim's kernel first: this finds ``racesim.sim.rng`` in ``sys.modules`` and registers;
- hypothesis first: ``racesim.sim.rng`` registers itself when it loads, as it finds hypothesis
  in ``sys.modules`` (a strategy or a World is the first use that loads it).

From then on hypothesis seeds :data:`racesim.sim.rng.SEED_SOURCE` to the same state before
each example and restores it afterwards (as it does for ``random``), so a property that draws
run seeds from it is reproducible. Nothing else belongs here: settings profiles would leak into
other projects' test suites (racesim's own live in ``tests/_profiles.py``).
"""

from __future__ import annotations

import sys

__all__ = ["_register"]


def _register() -> None:
    rng = sys.modules.get("racesim.sim.rng")
    if rng is not None:
        rng.register_with_hypothesis()  # idempotent: a second call is a no-op
