"""Scenarios: TOML files describing a workload, fixed delays and a known witness schedule.

A scenario is found by bundled name (``scenarios/bundled/NAME.toml``) or by path, and is
validated on load; every mistake is a one-line :class:`racesim.sim.errors.InputError`.
"""

from __future__ import annotations

from racesim.scenarios.files import bundled_names, corpus_names, load_scenario
from racesim.scenarios.loader import (
    MAX_REQUEST_ID,
    CorpusInfo,
    Scenario,
    parse_scenario,
    scenario_from_dict,
    scenario_to_toml,
)

__all__ = [
    "CorpusInfo",
    "Scenario",
    "MAX_REQUEST_ID",
    "bundled_names",
    "corpus_names",
    "load_scenario",
    "parse_scenario",
    "scenario_from_dict",
    "scenario_to_toml",
]
