"""Hypothesis profiles for racesim's own suite: ``ci``, ``dev`` and ``nightly``.

``CI=true`` loads ``ci`` (derandomized: the same examples on every run, so a red CI run is
red again on a rerun; no example database; the failing example's blob printed). Otherwise
``dev`` loads (fewer, random examples and the example database, kept in
``~/.cache/racesim-tests/hypothesis`` by conftest.py, for a fast edit loop).
``HYPOTHESIS_PROFILE=nightly`` (or any registered name) overrides both, as does pytest's
``--hypothesis-profile``.

The profiles live here, not in racesim's ``hypothesis`` entry point, because that entry point
runs in every project that has racesim installed and must not change their settings. Every
racesim test module that uses hypothesis imports this module first, before it builds any
``@settings``, because a ``settings`` object copies the profile active when it is built.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hypothesis import HealthCheck, settings

__all__ = ["PROFILE", "profile_name"]

settings.register_profile(
    "ci", settings.get_profile("ci"), derandomize=True, database=None, deadline=None,
    print_blob=True, max_examples=100,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.register_profile(
    "dev", max_examples=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.register_profile(
    "nightly", max_examples=1500, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def profile_name(environ: Mapping[str, str] = os.environ, current: str = "default") -> str:
    """The profile to load: ``HYPOTHESIS_PROFILE``, else a profile chosen on the command line
    (``current`` other than hypothesis's automatic ones), else ``ci`` under CI, else ``dev``."""
    explicit = environ.get("HYPOTHESIS_PROFILE", "").strip()
    if explicit:
        return explicit
    if current not in ("default", "ci"):
        return current
    in_ci = environ.get("CI", "").strip().lower() in ("true", "1", "yes")
    return "ci" if in_ci else "dev"


PROFILE = profile_name(current=settings.get_current_profile_name())
settings.load_profile(PROFILE)
