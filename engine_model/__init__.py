"""The vLLM V1 request-lifecycle model: frontend, sockets, engine core, P/D, policies, checker."""

# First: racesim.sim._native decides compiled or source before any model module loads.
from racesim import sim  # noqa: F401  # isort: skip
from racesim.engine_model.checker import INVARIANTS, SAFETY_INVARIANTS, Checker, Violation
from racesim.engine_model.config import (
    EngineConfig,
    FrontendConfig,
    IpcConfig,
    PDConfig,
    RequestSpec,
    Workload,
)
from racesim.engine_model.points import POINTS
from racesim.engine_model.policies import POLICIES, LifecyclePolicy, load_policy, policy_spec
from racesim.engine_model.system import RequestOutcome, RunResult, System, run_workload

__all__ = [
    "Checker",
    "EngineConfig",
    "FrontendConfig",
    "INVARIANTS",
    "IpcConfig",
    "LifecyclePolicy",
    "PDConfig",
    "POINTS",
    "POLICIES",
    "RequestOutcome",
    "RequestSpec",
    "RunResult",
    "SAFETY_INVARIANTS",
    "System",
    "Violation",
    "Workload",
    "load_policy",
    "policy_spec",
    "run_workload",
]
