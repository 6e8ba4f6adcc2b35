"""Which frontend ``--engine vllm`` runs: the model's AsyncLLM over vLLM's OutputProcessor
(``model``), or vLLM's own AsyncLLM (``asyncllm``, :mod:`racesim.engine_vllm.frontend.system`).

Chosen by the environment variable ``RACESIM_VLLM_FRONTEND`` (read at each run, and inherited
by exploration's worker processes), documented in docs/backends.md.
"""

from __future__ import annotations

import os

__all__ = ["ENV", "CHOICES", "REAL_FRONTEND", "real_frontend", "real_unsupported"]

ENV = "RACESIM_VLLM_FRONTEND"
CHOICES = ("model", "asyncllm")
#: profile -> what vLLM's own frontend runs on it (measured: its AsyncLLM builds on the
#: client_addresses path and runs abort-reuse); the profiles not listed have none
REAL_FRONTEND = {"0.33": "buggy, internal-id", "0.20": "buggy, internal-id",
                 "0.14": "internal-id (no randomization switch)",
                 "0.11": "buggy = internal-id (no internal IDs)",
                 "0.10": "buggy = internal-id (no internal IDs)"}
#: the lifecycles vLLM's own frontend runs: the release with or without ID randomization
LIFECYCLES = ("buggy", "internal-id")


def real_frontend() -> bool:
    """Whether ``--engine vllm`` runs vLLM's own AsyncLLM (``RACESIM_VLLM_FRONTEND=asyncllm``)."""
    from racesim.sim.errors import InputError

    value = os.environ.get(ENV, "model") or "model"
    if value not in CHOICES:
        raise InputError(f"{ENV}={value!r}: expected one of {', '.join(CHOICES)}")
    return value == "asyncllm"


def real_unsupported(workload: object, policy: str, release: str | None = None) -> str | None:
    """Why this run cannot use vLLM's own frontend (one line), or None."""
    if release is not None:
        from racesim.engine_vllm._api import release_key

        if release_key(release) < (0, 10):
            return (f"vLLM's own frontend ({ENV}=asyncllm) is not built for vLLM {release} "
                    f"(measured on 0.10.1.1 to 0.33.0); unset {ENV}")
    if policy == "buggy" and release is not None:
        if (0, 14) <= release_key(release) < (0, 20):
            # 0.14.0 v1/engine/input_processor.py:444 randomizes unconditionally
            return (f"policy 'buggy' on vLLM's own frontend is the release with "
                    f"VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1, which vLLM {release} does not "
                    f"have (it always randomizes); run internal-id")
    if policy not in LIFECYCLES:
        return (f"policy {policy!r} is not vLLM's code: on vLLM's own frontend "
                f"({ENV}=asyncllm) the lifecycle is the release's, buggy or internal-id; "
                f"express the change as a patch (--vllm-patch FILE.diff)")
    from racesim.engine_vllm.frontend.system import unsupported

    why = unsupported(workload)  # type: ignore[arg-type]
    if why is not None:
        return f"vLLM's own frontend ({ENV}=asyncllm) does not run {why} yet"
    return None
