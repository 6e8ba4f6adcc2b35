"""racesim's pytest plugin (see issue 6; filled in below as it grows)."""

from __future__ import annotations

import pytest

__all__ = ["pytest_addoption"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("racesim", "racesim race-condition simulation")
    group.addoption("--racesim-seed", type=int, default=None,
                    help="Seed for racesim runs made by the racesim fixture.")
