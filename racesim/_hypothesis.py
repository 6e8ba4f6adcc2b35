"""Hypothesis entry point: register racesim's seed source so hypothesis controls it.

``pyproject.toml`` names :func:`_register` under ``[project.entry-points.hypothesis]``, so
hypothesis calls it when it is imported, in every project that has racesim installed. From
then on hypothesis seeds :data:`racesim.sim.rng.SEED_SOURCE` to the same state before each example and
restores it afterwards (as it does for ``random``), so a property that draws run seeds from
it is reproducible. Nothing else belongs here: settings profiles would leak into other
projects' test suites (racesim's own live in ``tests/_profiles.py``).
"""

from __future__ import annotations

from racesim.sim.rng import SEED_SOURCE

__all__ = ["_register"]


def _register() -> None:
    import hypothesis

    hypothesis.register_random(SEED_SOURCE)  # idempotent: a second call is a no-op
