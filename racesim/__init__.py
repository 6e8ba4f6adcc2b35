"""racesim: the application layer (CLI, exploration, matrix, bench, pytest plugin).

Imports nothing until a name is used, so that the console script can catch Ctrl-C while the
model is being imported (``racesim._entry``), and because every ``racesim.sim`` (or
``racesim.reports``, ...) import passes through here and most need none of the app layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from racesim.runner import run_scenario

__all__ = ["run_scenario"]


def __getattr__(name: str) -> Any:
    if name == "run_scenario":  # loaded on first use, with the model and simpy
        from racesim.runner import run_scenario

        return run_scenario
    raise AttributeError(f"module 'racesim' has no attribute {name!r}")
