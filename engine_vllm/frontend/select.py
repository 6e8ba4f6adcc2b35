"""Which frontend ``--engine vllm`` runs: vLLM's own AsyncLLM (``asyncllm``,
:mod:`racesim.engine_vllm.frontend.system`) wherever it can, else the model's AsyncLLM over
vLLM's OutputProcessor (``model``), with the one reason why.

The user's request is read once, where the backend is resolved (``racesim.runner.backend``),
from the environment variable ``RACESIM_VLLM_FRONTEND``: unset (the default: vLLM's own where it
runs), ``model`` (the model's always: conform of the engine alone) or ``asyncllm`` (vLLM's own,
or exit 2 naming why not). Each run then picks with :func:`choose` (docs/backends.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["ENV", "CHOICES", "REAL_FRONTEND", "LIFECYCLES", "MODEL_POINTS", "requested",
           "real_unsupported", "choose"]

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
#: the prefix of the model frontend's await points (engine_model/points.py); vLLM's own
#: frontend names its points by its code (``send:``, ``yield:``, ``exec:``) and never passes these
MODEL_POINTS = "frontend."
#: the options vLLM's own frontend is (internal-id's suffix is vLLM's 8 hex characters)
_DEFAULT_OPTIONS: dict[str, dict[str, str]] = {"buggy": {}, "internal-id": {"suffix_hex": "8"}}


def requested() -> str | None:
    """The frontend the user asked for: None (the default), "model" or "asyncllm"."""
    from racesim.engine_vllm.support import env_choice

    return env_choice(ENV, CHOICES, "vLLM's own frontend where it runs")


def real_unsupported(workload: object, policy: str, release: str | None = None) -> str | None:
    """Why vLLM's own frontend cannot run this scenario and policy (one phrase), or None."""
    if release is not None:
        from racesim.engine_vllm._api import release_key

        if release_key(release) < (0, 10):
            return f"vLLM {release} (it is built for 0.10.1.1 to 0.33.0)"
        if policy == "buggy" and (0, 14) <= release_key(release) < (0, 20):
            # 0.14.0 v1/engine/input_processor.py:444 randomizes unconditionally
            return (f"policy 'buggy' on vLLM {release}: it is the release with "
                    f"VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1, which {release} does not have "
                    f"(it always randomizes); internal-id runs")
    if policy == "shipped":
        return ("policy 'shipped' (the model's name for the release's abort with --ids; on "
                "vLLM's own frontend the release's lifecycle is buggy or internal-id)")
    if policy not in LIFECYCLES:
        return (f"policy {policy!r}, which is not vLLM's code (vLLM's own frontend is the "
                f"release's lifecycle, buggy or internal-id; a change to vLLM is a patch: "
                f"--vllm-patch FILE.diff)")
    from racesim.engine_vllm.frontend.system import unsupported

    return unsupported(workload)  # type: ignore[arg-type]


def choose(wanted: str | None, workload: object, policy: str, release: str | None, *,
           options: Mapping[str, str] | None = None, own_ids: bool = True,
           points: Iterable[str] = ()) -> tuple[str, str | None]:
    """The frontend one run uses: ``("asyncllm", None)``, or ``("model", why)`` with the one
    reason (``why`` None when the user asked for the model's). ``own_ids``: the run uses the
    policy's default ID scheme (``--ids`` did not change it); ``points``: the await points its
    fixed delays, witness and replayed schedule name. Asked for ``asyncllm`` where it cannot
    run: one InputError line."""
    from racesim.sim.errors import InputError

    if wanted == "model":
        return "model", None
    why = real_unsupported(workload, policy, release)
    if why is None and dict(options or {}) not in ({}, _DEFAULT_OPTIONS.get(policy)):
        shown = ", ".join(f"{k}={v}" for k, v in sorted((options or {}).items()))
        why = f"policy options ({shown}) (it is the release as shipped)"
    if why is None and not own_ids:
        why = "another --ids scheme (it assigns IDs as the release does)"
    if why is None:
        named = sorted({p for p in points if p.startswith(MODEL_POINTS)})
        if named:
            why = (f"delays or a schedule at the model frontend's await point {named[0]} "
                   f"(it has its own: racesim list points --engine vllm)")
    if why is None:
        return "asyncllm", None
    if wanted == "asyncllm":
        raise InputError(f"{ENV}=asyncllm: vLLM's own frontend does not run {why}")
    return "model", why
