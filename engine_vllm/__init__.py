"""The vLLM backend: vLLM's own engine-side classes running inside racesim's World.

Importing this package imports neither vLLM nor torch; the first run does (once per process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from racesim.engine_vllm.support import SUPPORTED_POLICIES, model_only_reason, unsupported_reason

if TYPE_CHECKING:
    from racesim.engine_model.system import RunResult

__all__ = ["run_workload", "unsupported_reason", "model_only_reason", "SUPPORTED_POLICIES"]


def run_workload(*args: Any, frontend: str = "model", **kwargs: Any) -> RunResult:
    """``racesim.engine_model.run_workload`` on vLLM's own classes (same arguments), with
    vLLM's own AsyncLLM as the frontend when ``frontend`` is "asyncllm" (the choice is the
    runner's: ``racesim.engine_vllm.frontend.select.choose``) and the model's model runner
    when ``runner`` is "model" (``RACESIM_VLLM_RUNNER``, ``engine_vllm/runner/kind.py``)."""
    if frontend == "asyncllm":
        from racesim.engine_vllm.frontend.system import run_workload as real

        return real(*args, **kwargs)
    from racesim.engine_vllm.system import run_workload as run

    return run(*args, **kwargs)
