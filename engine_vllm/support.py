"""What the vLLM backend can run, decided without importing vLLM.

The backend runs vLLM's own abort path (``AsyncLLM.abort``: ``OutputProcessor.abort_requests``
pops the state, then the ABORT is sent, vllm/v1/engine/async_llm.py), so only the lifecycle
policies that are that code can run on it: ``buggy`` (IDs as given, as with
``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1``), ``shipped`` (the same abort with IDs as the release
assigns them, ``--ids release``, or as given) and ``internal-id`` with vLLM's own suffix
(``InputProcessor.assign_request_id``, 8 hex characters, vllm/v1/engine/input_processor.py:354-371)
or none (``suffix_hex=0``). The fixes that change vLLM's code (``abort-scope``, ``engine-final``)
and user policies cannot be expressed on the real classes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from racesim.engine_model.config import Workload

__all__ = ["SUPPORTED_POLICIES", "unsupported_reason", "model_only_reason",
           "release_gap", "env_choice"]

#: policy -> the ``suffix_hex`` values the real ``assign_request_id`` can give.
SUPPORTED_POLICIES: dict[str, tuple[str, ...]] = {"shipped": (), "buggy": (),
                                                  "internal-id": ("8", "0")}


def unsupported_reason(workload: Workload, policy: str,
                       options: Mapping[str, str] | None = None,
                       release: str | None = None, frontend: str = "model") -> str | None:
    """Why this run cannot use the vllm backend on vLLM ``release`` (one line), or None.
    ``frontend`` is the one the run chose (``frontend.select.choose``): on vLLM's own
    (``asyncllm``) the scenario and policy were checked there."""
    from racesim.engine_vllm._api import release_key

    if frontend == "asyncllm":
        return release_gap(workload, release)
    if policy == "internal-id" and release is not None and release_key(release) < (0, 14) \
            and (options or {}).get("suffix_hex", "8") != "0":
        # vLLM before 0.14 keeps the caller's ID end to end (v1/engine/processor.py)
        return (f"policy 'internal-id' cannot run on the vllm backend with vLLM {release} "
                f"(it assigns no internal IDs before 0.14); use buggy or suffix_hex=0")
    if (gap := release_gap(workload, release)) is not None:
        return gap
    if policy not in SUPPORTED_POLICIES:
        return (f"policy {policy!r} cannot run on the vllm backend (it changes vLLM's own "
                f"code: give the change as a patch, --vllm-patch FILE.diff); the vllm backend "
                f"runs: shipped, buggy (--ids given or release), internal-id (suffix_hex 8 or 0)")
    allowed = SUPPORTED_POLICIES[policy]
    suffix = (options or {}).get("suffix_hex", "8")
    if allowed and suffix not in allowed:
        return (f"policy {policy!r} with suffix_hex={suffix} cannot run on the vllm backend "
                f"(vLLM's assign_request_id adds 8 hex characters, or none: suffix_hex 8 or 0)")
    return model_only_reason(workload)


def release_gap(workload: Workload, release: str | None) -> str | None:
    """Why vLLM ``release``'s own classes cannot run this scenario (one line), or None."""
    from racesim.engine_vllm._api import release_key

    if release is not None and release_key(release) < (0, 20) \
            and workload.engine.num_speculative_tokens:
        # racesim.engine_vllm.runner.spec runs the ngram_gpu drafter, vLLM's only one without
        # a draft model that async scheduling accepts (0.20 config/vllm.py:774-792)
        return (f"engine.num_speculative_tokens runs on the vllm backend with vLLM 0.20 and "
                f"0.33, not {release} (no ngram_gpu drafter: v1/spec_decode/ngram_proposer_gpu.py "
                f"came after it)")
    eager = workload.engine.eager_aborts
    if release is not None and eager is not None and eager != (release_key(release) >= (0, 14)):
        # the release's own step reads aborts_queue or does not (0.14.0 v1/engine/core.py:211,
        # 527-533; 0.11.0 has none): an override of that is not vLLM's code
        return (f"engine.eager_aborts = {eager} cannot run on the vllm backend with vLLM "
                f"{release}: its EngineCore {'has no' if eager else 'has an'} aborts_queue "
                f"(it came in 0.14)")
    if release is not None and release_key(release) < (0, 10) \
            and workload.engine.async_scheduling:
        return (f"engine.async_scheduling cannot run on the vllm backend with vLLM {release}: "
                f"it has no AsyncScheduler (v1/core/sched/async_scheduler.py came in 0.10)")
    return None


def model_only_reason(workload: Workload) -> str | None:
    """Why this scenario's deployment is model-only on the vllm backend (one line), or None.

    P/D runs vLLM's own NixlConnector scheduler side and its worker's request bookkeeping with
    a simulated transport: 0.33's ``v1/nixl/`` package (pull and push,
    :mod:`racesim.engine_vllm.connectors.nixl`, ``push``) and MooncakeConnector
    (``mooncake``), 0.20's ``nixl/`` package and 0.10-0.14's ``v1/nixl_connector.py`` (pull,
    ``nixl_legacy``); 0.9.2's is model-only. Data parallelism runs
    (one vLLM Scheduler per DP rank; the DP client and coordinator are asyncio and socket
    code, modelled on both backends), and so do streaming-input sessions."""
    from racesim.engine_model.versions import DEFAULT_VLLM

    release = workload.engine.vllm or DEFAULT_VLLM
    if workload.topology == "pd" and release not in ("0.33", "0.20", "0.14", "0.11", "0.10"):
        # 0.9.2's NixlConnector is another API again (no adapter, connectors/nixl_legacy.py)
        return (f"P/D on the vllm backend runs the NIXL connector of vLLM 0.10-0.33, not "
                f"{release}'s: model-only there")
    if workload.topology == "pd" and workload.pd.connector == "nixl-push" and release != "0.33":
        return (f"pd.connector = 'nixl-push' on the vllm backend runs vLLM 0.33's push "
                f"connector only, not {release}'s: model-only there")
    if workload.topology == "pd" and workload.pd.connector == "mooncake" and release != "0.33":
        # connectors/mooncake.py runs 0.33's mooncake/mooncake_connector.py
        return (f"pd.connector = 'mooncake' on the vllm backend runs vLLM 0.33's "
                f"MooncakeConnector only, not {release}'s: model-only there")
    if workload.topology == "pd" and workload.pd.connector not in ("nixl-pull", "nixl-push",
                                                                    "mooncake"):
        return (f"pd.connector = {workload.pd.connector!r} is model-only on the vllm backend, "
                f"which wires in NIXL's pull and push modes and MooncakeConnector")
    return None


def env_choice(env: str, choices: tuple[str, ...], unset: str) -> str | None:
    """The value of the switch ``env`` (None when unset); anything but ``choices`` is one
    line naming the variable, what it may be, and what ``unset`` means."""
    from racesim.sim.errors import InputError

    value = os.environ.get(env, "")
    if not value:
        return None
    if value not in choices:
        raise InputError(f"{env}={value!r}: expected {' or '.join(choices)} (unset: {unset})")
    return value
