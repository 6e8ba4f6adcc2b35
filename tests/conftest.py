"""Shared fixture: run a workload through the real ``run_workload`` and keep its System.

Most tests only need the :class:`RunResult`; the fidelity tests also look at the state the
modelled system ends in (``request_states``, ``Scheduler.requests``, the block pool), which
``run_workload`` does not return. ``simulate`` swaps in a System subclass that remembers itself
and can schedule extra processes before the run starts (``setup``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest

import racesim.engine_model.system as system_module
from racesim.engine_model import RunResult, System, Workload, load_policy, run_workload
from racesim.sim import DelayPlan

Setup = Callable[[System], None]
Simulate = Callable[..., tuple[RunResult, System]]


@pytest.fixture
def simulate(monkeypatch: pytest.MonkeyPatch) -> Simulate:
    """``simulate(workload, policy, delays=[(point, k|None, s)], seed=, options=, setup=)``."""
    built: list[System] = []
    hooks: list[Setup] = []

    class _Kept(System):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)
            for hook in hooks:
                hook(self)

    monkeypatch.setattr(system_module, "System", _Kept)

    def run(workload: Workload, policy: str = "buggy", *,
            delays: Iterable[tuple[str, int | None, float]] = (), seed: int = 0,
            options: Mapping[str, str] | None = None,
            setup: Setup | None = None) -> tuple[RunResult, System]:
        built.clear()
        hooks[:] = [setup] if setup is not None else []
        result = run_workload(workload, load_policy(policy, options), seed=seed,
                              plan=DelayPlan(overrides=list(delays)))
        (system,) = built
        return result, system

    return run
