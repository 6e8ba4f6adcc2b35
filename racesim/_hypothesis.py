"""Hypothesis entry point: register racesim's seed source so hypothesis controls it."""

from __future__ import annotations

from sim.rng import SEED_SOURCE

__all__ = ["_register"]


def _register() -> None:
    import hypothesis

    hypothesis.register_random(SEED_SOURCE)
