"""Shared fixture: run a workload through the real ``run_workload`` and keep its System.

Most tests only need the :class:`RunResult`; the fidelity tests also look at the state the
modelled system ends in (``request_states``, ``Scheduler.requests``, the block pool), which
``run_workload`` does not return. ``simulate`` swaps in a System subclass that remembers itself
and can schedule extra processes before the run starts (``setup``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest
from _cwd_guard import (  # noqa: F401  (autouse, and hooks: nothing is written into the cwd)
    no_files_left_in_cwd,
    pytest_sessionfinish,
    pytest_sessionstart,
)
from hypothesis.configuration import set_hypothesis_home_dir

import racesim.engine_model.system as system_module
from racesim.engine_model import RunResult, System, Workload, load_policy, run_workload
from racesim.sim import DelayPlan

# hypothesis keeps its caches and the dev profile's example database in ./.hypothesis unless
# told otherwise; the suite writes nothing into the folder pytest runs in (tests/_cwd_guard.py),
# so they go to the user's cache folder, where the dev profile's examples still persist.
set_hypothesis_home_dir(os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
    "racesim-tests", "hypothesis"))

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


# -- the vllm backend ----------------------------------------------------------------------------

def under_ci() -> bool:
    """CI sets CI (any value but empty or "0"): there a test that needs vLLM must not skip."""
    return os.environ.get("CI", "") not in ("", "0")


def vllm_missing() -> str | None:
    """Why the vllm backend cannot run here, or None (read from metadata: no import)."""
    from racesim.runner.engines import INSTALL_COMMAND, SUPPORTED_VLLM, installed_vllm

    version = installed_vllm()
    if version is None:
        return f"vLLM is not installed ({INSTALL_COMMAND} installs vLLM 0.33 for CPU)"
    if not any(version.startswith(f"{p}.") for p in SUPPORTED_VLLM):
        return (f"vLLM {version} is installed; the vllm backend supports "
                f"{', '.join(SUPPORTED_VLLM.values())}")
    return None


#: the test modules whose ``vllm`` tests run on any supported release (CI runs them in its
#: older release's venv too, .ci/run); the others follow 0.33
ANY_RELEASE = ("test_vllm_releases.py", "test_diff_frontend.py", "test_conform_frontend.py",
               "test_spec_decode_vllm.py", "test_vllm_busy_loop.py",
               "test_pause_clear_cache.py")


@pytest.fixture
def vllm_systems(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every VllmSystem the runs in this test build, in order, so a test can read vLLM's own
    objects (schedulers, connectors) after the run."""
    import racesim.engine_vllm.frontend.system as fsys
    import racesim.engine_vllm.system as vsys

    seen: list[Any] = []

    class Capturing(vsys.VllmSystem):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            seen.append(self)

    class CapturingReal(fsys.RealFrontendSystem):  # type: ignore[misc,valid-type]
        """vLLM's own frontend (the default where it runs) builds this subclass instead."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            seen.append(self)

    monkeypatch.setattr(vsys, "VllmSystem", Capturing)
    monkeypatch.setattr(fsys, "RealFrontendSystem", CapturingReal)
    return seen


@pytest.fixture(scope="session")
def vllm_backend() -> Any:
    """vLLM's classes, imported once per test session (10-25 s). Every ``@pytest.mark.vllm``
    test uses it: locally without vLLM those tests skip and say why; under CI they fail."""
    why = vllm_missing()
    if why is not None:
        if under_ci():
            pytest.fail(f"CI must run the vllm backend tests: {why}", pytrace=False)
        pytest.skip(why)
    from racesim.engine_vllm._vllm import vllm

    return vllm()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    from racesim.runner.engines import installed_vllm

    version = installed_vllm() or ""
    for item in items:
        if item.get_closest_marker("vllm") is not None and version \
                and not version.startswith("0.33.") and item.path.name not in ANY_RELEASE:
            # an older release's venv (CI's second one) runs only the release tests
            item.add_marker(pytest.mark.skip(reason=f"follows vLLM 0.33; vLLM {version} is "
                                                    f"installed ({', '.join(ANY_RELEASE)} run "
                                                    f"on it)"))
        names = getattr(item, "fixturenames", None)
        if item.get_closest_marker("vllm") is not None and names is not None \
                and "vllm_backend" not in names:
            names.insert(0, "vllm_backend")
