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

from collections.abc import Mapping

from racesim.engine_model.config import Workload

__all__ = ["SUPPORTED_POLICIES", "unsupported_reason", "model_only_reason",
           "release_gap"]

#: policy -> the ``suffix_hex`` values the real ``assign_request_id`` can give.
SUPPORTED_POLICIES: dict[str, tuple[str, ...]] = {"shipped": (), "buggy": (),
                                                  "internal-id": ("8", "0")}


def unsupported_reason(workload: Workload, policy: str,
                       options: Mapping[str, str] | None = None,
                       release: str | None = None) -> str | None:
    """Why this run cannot use the vllm backend on vLLM ``release`` (one line), or None."""
    from racesim.engine_vllm._api import release_key

    if policy == "internal-id" and release is not None and release_key(release) < (0, 14) \
            and (options or {}).get("suffix_hex", "8") != "0":
        # vLLM before 0.14 keeps the caller's ID end to end (v1/engine/processor.py)
        return (f"policy 'internal-id' cannot run on the vllm backend with vLLM {release} "
                f"(it assigns no internal IDs before 0.14); use buggy or suffix_hex=0")
    if (gap := release_gap(workload, release)) is not None:
        return gap
    if policy not in SUPPORTED_POLICIES:
        return (f"policy {policy!r} cannot run on the vllm backend (it changes vLLM's own "
                f"code); the vllm backend runs: shipped, buggy (--ids given or release), "
                f"internal-id (suffix_hex 8 or 0)")
    allowed = SUPPORTED_POLICIES[policy]
    suffix = (options or {}).get("suffix_hex", "8")
    if allowed and suffix not in allowed:
        return (f"policy {policy!r} with suffix_hex={suffix} cannot run on the vllm backend "
                f"(vLLM's assign_request_id adds 8 hex characters, or none: suffix_hex 8 or 0)")
    return model_only_reason(workload)


def release_gap(workload: Workload, release: str | None) -> str | None:
    """Why vLLM ``release``'s own classes cannot run this scenario (one line), or None."""
    from racesim.engine_vllm._api import release_key

    if release is not None and release_key(release) < (0, 10) \
            and workload.engine.async_scheduling:
        return (f"engine.async_scheduling cannot run on the vllm backend with vLLM {release}: "
                f"it has no AsyncScheduler (v1/core/sched/async_scheduler.py came in 0.10)")
    return None


def model_only_reason(workload: Workload) -> str | None:
    """Why this scenario's deployment is model-only on the vllm backend (one line), or None.

    P/D runs vLLM's own NixlConnector scheduler side with a simulated transport
    (:mod:`racesim.engine_vllm.connectors.nixl`), written against 0.33's ``v1/nixl/`` package (pull
    scheduler and pull worker); older releases have another NIXL module and API
    (``v1/nixl_connector.py`` before 0.20), so P/D on them is model-only. Data parallelism runs
    (one vLLM Scheduler per DP rank; the DP client and coordinator are asyncio and socket
    code, modelled on both backends), and so do streaming-input sessions."""
    from racesim.engine_model.versions import DEFAULT_VLLM

    release = workload.engine.vllm or DEFAULT_VLLM
    if workload.topology == "pd" and release != "0.33":
        return (f"P/D on the vllm backend runs vLLM 0.33's NIXL connector only, not "
                f"{release}'s: model-only there")
    if workload.topology == "pd" and workload.pd.connector != "nixl-pull":
        # push mode and Mooncake are checked on vLLM's own code by their vllm-marked tests
        # (test_push_vllm.py, test_mooncake_vllm.py), not wired into the backend's engines
        return (f"pd.connector = {workload.pd.connector!r} is model-only on the vllm backend, "
                f"which wires in NIXL's pull mode")
    aborted = {r.id for r in workload.requests if r.abort_at is not None}
    if workload.topology == "pd" and any(
            sum(r.id == rid for r in workload.requests) > 1 for rid in aborted):
        # conform found 2 of 100 buggy schedules of pd-proxy-abort where the model and vLLM's
        # own NixlConnector disagree, not yet explained: until they are, a proxy abort in P/D
        # is not claimed on vLLM's code
        return ("a client abort in P/D of an ID another request also uses (pd-proxy-abort) is "
                "model-only on the vllm backend: conform has unexplained differences there "
                "(docs/backends.md)")
    if workload.topology == "pd" and workload.pd.bidirectional_kv_xfer:
        return ("pd.bidirectional_kv_xfer is model-only on the vllm backend (its NixlConnector "
                "is built without kv_connector_extra_config.bidirectional_kv_xfer)")
    return None
