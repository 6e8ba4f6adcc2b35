"""What the fixture's ``run`` and ``check`` accept, read into what a run takes: a scenario
(a bundled name, a path or a Scenario), policy options, and delays in any of their forms."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from racesim.scenarios import Scenario

__all__ = ["DelaySpec", "load", "options", "plan"]

#: A delay given to :meth:`RaceSim.run`: a ``racesim.sim.Decision`` (say, from
#: ``racesim.scenarios.strategies.schedules``), ``(point, occurrence or None, seconds)``, or the
#: command line's ``"POINT=SECONDS"`` / ``"POINT#K=SECONDS"``.
DelaySpec = Any


def load(scenario: object) -> tuple[Scenario, str | None]:
    """The Scenario, and the name or path ``racesim run`` would find it by (None: no file)."""
    from racesim.scenarios import Scenario, load_scenario

    if isinstance(scenario, Scenario):
        source = scenario.source
        if source.startswith("<bundled ") and source.endswith(">"):
            return scenario, source[len("<bundled "):-1]
        return scenario, None if source.startswith("<") else source
    if isinstance(scenario, os.PathLike):
        path = os.fspath(scenario)
        if not isinstance(path, str):
            raise TypeError(f"scenario path must be text, got {path!r}")
        if "/" not in path and not path.endswith(".toml"):
            path = os.path.join(".", path)  # a path, never a bundled name
        return load_scenario(path), path
    if isinstance(scenario, str):
        return load_scenario(scenario), scenario
    raise TypeError(f"scenario must be a bundled name, a path or a racesim.scenarios.Scenario, "
                    f"got {scenario!r}")


def options(options: Mapping[str, str] | None) -> dict[str, str]:
    from racesim.sim import InputError

    out = dict(options or {})
    for k, v in out.items():
        if not (isinstance(k, str) and isinstance(v, str)):
            raise InputError(f"policy options map names to strings, got {k!r}: {v!r}")
    return out


def plan(delays: Iterable[DelaySpec] | Mapping[str, float]) -> list[tuple[str, int | None,
                                                                        float]]:
    from racesim.engine_model.points import POINTS
    from racesim.runner import parse_delay_option
    from racesim.sim import Decision, InputError, plan_entries
    from racesim.sim.points import delay_entry

    if isinstance(delays, Mapping):
        return plan_entries(delays, POINTS, "delays")
    if isinstance(delays, str):
        delays = [delays]
    out: list[tuple[str, int | None, float]] = []
    for d in delays:
        if isinstance(d, Decision):
            d = (d.point, d.occurrence, d.delay)
        if isinstance(d, str):
            out.append(parse_delay_option(d))
        elif isinstance(d, tuple) and len(d) == 3:
            out.append(delay_entry(*d, POINTS, f"delay {d!r}"))
        else:
            raise InputError(f"delay {d!r}: expected a racesim.sim.Decision, (point, occurrence, "
                             f"seconds) or 'POINT[#K]=SECONDS'")
    return out
