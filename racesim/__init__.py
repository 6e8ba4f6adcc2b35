"""racesim: the application layer (CLI, exploration, matrix, bench, pytest plugin)."""

from racesim.runner import run_scenario

__all__ = ["run_scenario"]
