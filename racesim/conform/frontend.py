"""``racesim conform --frontend``: the model's frontend against vLLM's own, on vLLM's engine.

Both sides run ``--engine vllm`` (vLLM's Scheduler and engine classes); they differ only in the
API server: the model's AsyncLLM over vLLM's OutputProcessor (``RACESIM_VLLM_FRONTEND=model``),
or vLLM's own AsyncLLM, AsyncMPClient and request-ID assignment on the World's asyncio loop
(``asyncllm``). A side is named ``vllm@<frontend>``; vLLM's own frontend is the reference.

The two frontends have different await points (the model's ``frontend.*`` against vLLM's
``send:``/``yield:``/``exec:`` points, read from its code), so a schedule is drawn only over the
points both sides pass (client sends, the IPC pipes, the engine's steps: arrival times, the
choices a real deployment has). A frontend-only point keeps its default on both sides.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from racesim.conform.known import KnownMismatch
from racesim.sim import InputError

__all__ = ["SIDES", "KNOWN_FRONTEND", "split_side", "with_frontend", "frontend_skip",
           "shared_occurrences", "explain_frontend", "default_policies"]

#: (the side that draws, the reference): the model's frontend, then vLLM's own.
SIDES = ("vllm@model", "vllm@asyncllm")

#: The listed differences between the two frontends (same shape as ``known.KNOWN``;
#: docs/conform.md shows this table).
KNOWN_FRONTEND: tuple[KnownMismatch, ...] = (
    KnownMismatch(
        "*", "*", ("invariant:one-terminal-output",),
        "After EngineCore died, an abort of an ID whose `generate()` already ended on the "
        "EngineDeadError pops the state vLLM kept and puts a final \"abort\" output into its "
        "queue (`v1/engine/output_processor.py:633-652`). vLLM's `generate()` stopped reading "
        "that queue when it raised (`v1/engine/async_llm.py:815-818`), so no client sees it; "
        "the model's client keeps listening after its terminal output (`engine_model/client.py`, "
        "the detector of a second one) and reads it over vLLM's OutputProcessor. The pure model "
        "drops each state on engine death and agrees with vLLM's frontend (the first row of "
        "the engine table).",
        after_engine_death=True),
)


def split_side(side: str) -> tuple[str, str | None]:
    """``"vllm@asyncllm"`` -> ``("vllm", "asyncllm")``; a plain engine has no frontend."""
    engine, _, frontend = side.partition("@")
    return engine, (frontend or None)


def with_frontend(engine: str, frontend: str | None) -> Any:
    """The backend of a side: ``engine`` as resolved (the frontend asked for in the
    environment), or the vllm backend with ``frontend`` ("model" or "asyncllm")."""
    from racesim.runner.backend import as_backend

    backend = as_backend(engine)
    return backend if frontend is None else dataclasses.replace(backend, frontend=frontend)


def frontend_skip(workload: Any, policy: str, release: str | None) -> str | None:
    """Why vLLM's own frontend does not run this cell (it is then left out, with the reason),
    or None. A policy that is not vLLM's code is bad input: one InputError line."""
    from racesim.engine_vllm.frontend.select import LIFECYCLES, real_unsupported

    why = real_unsupported(workload, policy, release)
    if policy not in LIFECYCLES and why is not None:
        raise InputError(why)
    return why


def shared_occurrences(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    """The points both baselines passed, with the fewer occurrences of the two."""
    return {p: min(n, b[p]) for p, n in a.items() if p in b}


def explain_frontend(scenario: str, policy: str, differences: Any, *,
                     engine_died: bool = False, release: str = "") -> str | None:
    """A listed frontend difference's cause (the table ``KNOWN_FRONTEND``), or None."""
    from racesim.conform.known import explain

    return explain(scenario, policy, differences, KNOWN_FRONTEND, engine_died=engine_died,
                   release=release)


def default_policies(release: str | None) -> list[tuple[str, dict[str, str]]]:
    """Both lifecycles vLLM's frontend has: the release as shipped and with ID randomization
    off; 0.14 has no switch (it always randomizes)."""
    from racesim.engine_vllm._api import release_key

    if release is not None and (0, 14) <= release_key(release) < (0, 20):
        return [("internal-id", {})]
    return [("buggy", {}), ("internal-id", {})]
