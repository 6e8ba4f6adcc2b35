"""The racesim command lines a report prints: the one command that reproduces what it shows.

Reports and the CLI both print them, so they live here, below the app layer.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence

from racesim.engine_model.policies import POLICIES
from racesim.sim.points import Decision

__all__ = ["replay_command", "run_command"]


def replay_command(path: str, policy: str = "", engine: str = "model",
                   backend_args: Sequence[str] = ()) -> str:
    """The one command that replays a counterexample file (``--allow-import`` when its policy
    is the user's own ``module:Class``: replay imports code only when asked to);
    ``backend_args`` name a vLLM tree or patch (``Backend.cli_args``)."""
    allow = " --allow-import" if policy and policy not in POLICIES else ""
    on = " " + " ".join(shlex.quote(w) for w in backend_args) if backend_args \
        else " --engine vllm" if engine == "vllm" else ""
    return f"racesim replay {shlex.quote(path)}{allow}{on}"


def run_command(scenario: str, policy: str, options: Mapping[str, str], seed: int,
                schedule: Sequence[Decision], skip: Iterable[str] = (),
                vllm: str | None = None, engine: str = "model", ids: str | None = None,
                backend_args: Sequence[str] = (), frontend: str | None = None,
                runner: str | None = None) -> str:
    """The one ``racesim run`` command that reproduces a run (its schedule as exact delays).
    ``frontend``: the ``RACESIM_VLLM_FRONTEND`` the run was asked with (``Backend.frontend``),
    which decides whose frontend runs on the vllm backend, so the command sets it too; and so
    ``runner``, the ``RACESIM_VLLM_RUNNER`` it was asked with (``Backend.runner``)."""
    words = ["racesim", "run", scenario, "-p", policy]
    if vllm:
        words += ["--vllm", vllm]
    if backend_args:
        words += list(backend_args)
    elif engine != "model":
        words += ["--engine", engine]
    if ids in ("given", "release"):
        words += ["--ids", ids]
    for k, v in options.items():
        words += ["--policy-opt", f"{k}={v}"]
    words += ["--seed", str(seed)]
    for d in schedule:
        words += ["--delay", f"{d.point}#{d.occurrence}={d.delay!r}"]
    for s in skip:
        words += ["--skip", s]
    env = f"RACESIM_VLLM_FRONTEND={frontend} " if frontend and engine == "vllm" else ""
    env += f"RACESIM_VLLM_RUNNER={runner} " if runner and engine == "vllm" else ""
    return env + " ".join(shlex.quote(w) for w in words)
