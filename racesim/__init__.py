"""racesim: the application layer (CLI, exploration, matrix, bench, pytest plugin).

Imports nothing until a name is used, so that the console script can catch Ctrl-C while the
model is being imported (``racesim._entry``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["run_scenario"]


def __getattr__(name: str) -> Any:
    if name == "run_scenario":
        from racesim.runner import run_scenario

        return run_scenario
    raise AttributeError(f"module 'racesim' has no attribute {name!r}")
