"""Provenance: what decided a verdict, vLLM's own code or a simulated part, and which code ran.

One table per backend (:data:`COMPONENTS`) says, for each component of the simulated deployment,
what runs it: ``"vllm"`` (vLLM's own classes, of the release that runs) or the name of the
simulated part that stands in for it. It is the one place to update when a room replaces a
simulated part with vLLM's code (the frontend's AsyncLLM, the model runner, a connector): set
that component to ``"vllm"`` and say what runs in :data:`VLLM_CODE`.

A violation's provenance (:func:`provenance`) follows from what its invariant reads
(:data:`READS`): an exception raised inside vLLM (``engine_vllm/oracle.py`` names its file:line)
was decided by vLLM's code; otherwise every component the invariant reads decides it, and the
violation is ``vllm`` (state read from vLLM's objects) only when all of them are vLLM's code.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from racesim.engine_model import RunResult

__all__ = ["COMPONENTS", "VLLM_CODE", "READS", "components", "provenance", "vllm_fingerprint",
           "TRACE_HASH_MEANING", "run_components", "violation_provenance", "components_doc"]

#: What each component is on each backend: "vllm" or the simulated part that runs instead.
COMPONENTS: dict[str, dict[str, str]] = {
    "model": {
        "client": "simulated client",
        "api-layer": "model API server and routers",
        "frontend": "model frontend (AsyncLLM)",
        "output-processor": "model OutputProcessor",
        "request-ids": "model ID assignment",
        "sockets": "simulated sockets (ZMQ)",
        "dp-client": "model DP client and coordinator",
        "engine-loop": "model EngineCore busy loop",
        "engine-step": "model EngineCore step",
        "scheduler": "model Scheduler",
        "kv-cache": "model KV cache manager",
        "runner": "fake executor (no model runner)",
        "connector": "model connector",
    },
    "vllm": {
        "client": "simulated client",
        "api-layer": "model API server and routers",
        "frontend": "model frontend (AsyncLLM)",
        "output-processor": "vllm",
        "request-ids": "vllm",
        "sockets": "simulated sockets (ZMQ)",
        "dp-client": "model DP client and coordinator",
        "engine-loop": "racesim's run_busy_loop (its waits, the spin, one ABORT at a time, the "
                       "pause model) around vLLM's own _process_input_queue and "
                       "_handle_client_request",
        "engine-step": "vllm",
        "scheduler": "vllm",
        "kv-cache": "vllm",
        "runner": "vllm",
        "connector": "model connector",
    },
}

#: What of vLLM runs for a component marked "vllm" (racesim.engine_vllm).
VLLM_CODE: dict[str, str] = {
    "frontend": "AsyncLLM with its AsyncMPClient (v1/engine/async_llm.py, core_client.py), "
                "the default on 0.10.1.1-0.33.0 where it runs",
    "api-layer": "on vLLM's own frontend, its serving classes for token-ID endpoints: "
                 "OpenAIServingCompletion (completions: the ID from X-Request-Id or the body, "
                 "cmpl-{base}-{i}; 0.20 and 0.33) and ServingTokens (scale-out generate-tokens, "
                 "0.33), and the RL and scale-out routers' /abort_requests handlers; chat and "
                 "the Responses API need a tokenizer and run the model's frontend; the route "
                 "handler around the serving call is simulated",
    "output-processor": "OutputProcessor, ParentRequest (v1/engine/output_processor.py)",
    "request-ids": "InputProcessor.assign_request_id (from 0.14; as given before)",
    "engine-step": "EngineCore.step / step_with_batch_queue (the release's own choice), "
                   "_process_aborts_queue and post_step (v1/engine/core.py) on an EngineCore "
                   "holding only what they read; the executor's GPU timing simulated "
                   "(engine_vllm/engine/stepper.py)",
    "scheduler": "Scheduler / AsyncScheduler (v1/core/sched/)",
    "kv-cache": "KVCacheManager, BlockPool (v1/core/)",
    "runner": "the release's own CPUModelRunner built without weights (0.10.1.1-0.33; 0.9.2 "
              "runs the fake executor: engine_vllm/runner/kind.py), fed the real "
              "SchedulerOutput; token values, and under speculative decoding how many drafts "
              "are accepted, from the fake network; 0.33's GPU default, Model Runner V2 "
              "(config/vllm.py:731-760), needs Triton and is not run",
    "connector": "NixlConnector's scheduler side and worker bookkeeping (pull mode 0.10-0.33, "
                 "push mode 0.33), MooncakeConnector's scheduler side and worker sender and "
                 "receiver code (0.33), simulated transport",
}

#: The components whose state each invariant reads to decide a violation.
READS: dict[str, tuple[str, ...]] = {
    "engine-alive": ("engine-loop", "engine-step", "scheduler", "kv-cache"),
    "unique-live-id": ("scheduler",),
    "frontend-covers-engine": ("output-processor", "scheduler"),
    "kv-ownership": ("kv-cache",),
    "no-leak": ("output-processor", "scheduler", "kv-cache"),
    "one-terminal-output": ("client", "frontend", "sockets", "output-processor"),
    "no-crosstalk": ("client", "frontend", "sockets", "output-processor", "runner"),
    "abort-precision": ("frontend", "output-processor", "scheduler"),
    "abort-isolation": ("api-layer", "frontend", "output-processor"),
    "orphan-run": ("api-layer", "frontend", "scheduler"),
    "no-hang": ("client", "frontend", "sockets", "output-processor"),
    "metrics-exact": ("frontend", "output-processor"),
    "kv-destination": ("connector", "kv-cache"),
    "stranded-hold": ("connector",),
    "runner-books": ("runner", "scheduler"),
    "input-integrity": ("runner",),
}

#: Why the vllm backend's runner was racesim's model of it (engine_vllm/runner/kind.py's ENV).
MODEL_RUNNER_REASON = "RACESIM_VLLM_RUNNER=model"

#: Said wherever a trace hash is shown.
TRACE_HASH_MEANING = ("the SHA-256 of the run's simulated events: the same schedule replays to "
                      "the same hash; it is not a fingerprint of vLLM's code (see "
                      "vllm_fingerprint)")


def components(engine: str, topology: str = "", frontend: str = "model",
               runner: str = "") -> dict[str, str]:
    """Each component and what ran it on ``engine``: "vllm" or the simulated part's name. On
    the vllm backend P/D runs vLLM's NixlConnector scheduler side, and when ``frontend`` is
    "vllm" (the run's ``RunResult.frontend``) the frontend is vLLM's own AsyncLLM (the sockets
    between it and the engine stay simulated) and the API layer vLLM's own serving class (a
    request with an endpoint it does not run makes the run take the model's frontend). When
    ``runner`` is "model" (``RunResult.runner``) the runner is racesim's model of it, as asked."""
    table = dict(COMPONENTS.get(engine, COMPONENTS["model"]))
    if engine == "vllm" and topology == "pd":
        table["connector"] = "vllm"
    if engine == "vllm" and frontend == "vllm":
        table["frontend"] = "vllm"
        table["api-layer"] = "vllm"
    if engine == "vllm" and runner == "model":
        table["runner"] = f"racesim's model of the runner (fake executor): {MODEL_RUNNER_REASON}"
    return table


def _is_vllm(impl: str) -> bool:
    return impl == "vllm"


def provenance(violation: Mapping[str, Any], engine: str, release: str = "",
               topology: str = "", frontend: str = "model", runner: str = "") -> dict[str, Any]:
    """What decided ``violation`` (a violation dict): ``by`` is "vllm-exception",
    "vllm-state", "simulated" (every part it reads is simulated) or "mixed"; ``vllm`` and
    ``simulated`` list the parts of each kind; ``text`` says it in one line."""
    table = components(engine, topology, frontend, runner)
    on = f"vLLM {release}" if release else "vLLM"
    where = violation.get("vllm_where")
    if where:
        return {"by": "vllm-exception", "vllm": ["engine-loop"], "simulated": [],
                "text": f"{on}'s own code raised it at {where}"}
    reads = READS.get(str(violation.get("invariant")), ())
    ours = [c for c in reads if _is_vllm(table.get(c, ""))]
    sim = [c for c in reads if not _is_vllm(table.get(c, ""))]
    if engine != "vllm":
        return {"by": "simulated", "vllm": [], "simulated": list(reads),
                "text": "racesim's model (" + ", ".join(table[c] for c in reads) + ")"}
    if not sim:
        return {"by": "vllm-state", "vllm": ours, "simulated": [],
                "text": f"state read from {on}'s objects: "
                        + "; ".join(VLLM_CODE.get(c, c) for c in ours)}
    parts = [table[c] for c in sim]
    return {"by": "mixed" if ours else "simulated", "vllm": ours, "simulated": sim,
            "text": ("simulated parts: " + ", ".join(parts)
                     + (f"; with {on}'s " + ", ".join(VLLM_CODE.get(c, c) for c in ours)
                        if ours else ""))}


def _release(result: RunResult) -> str:
    """The vLLM release the run followed: the installed one on the vllm backend."""
    from importlib import metadata

    from racesim.engine_model.versions import RELEASE_OF

    if result.engine == "vllm":
        try:
            return metadata.version("vllm")
        except metadata.PackageNotFoundError:
            pass
    return RELEASE_OF.get(result.vllm, "")


def _topology_kind(result: RunResult) -> str:
    """"pd" when the run had a prefill and a decode engine, else ""."""
    topo = result.topology
    return "pd" if topo is not None and any(e.role for e in topo.engines) else ""


def violation_provenance(result: RunResult, violation: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`provenance` of one of ``result``'s violations (a dict)."""
    return provenance(violation, result.engine, _release(result), _topology_kind(result),
                      result.frontend, result.runner)


def run_components(result: RunResult) -> dict[str, Any]:
    """Which components of ``result``'s run were vLLM's code and which were simulated, the
    fingerprint of the vLLM code that ran (None on the model), and what the trace hash means."""
    return components_doc(result.engine, _topology_kind(result), result.frontend,
                          result.frontend_note, result.runner)


def components_doc(engine: str, topology: str = "", frontend: str = "model",
                   frontend_note: str = "", runner: str = "") -> dict[str, Any]:
    """:func:`run_components` for a backend and topology (an exploration's, a matrix's).
    ``frontend_note``: why the model's frontend ran on the vllm backend, where vLLM's own is
    the default (``model_frontend_because``; None when vLLM's ran or the user asked for the
    model's). ``runner`` "model": the model's runner ran as asked (``model_runner_because``
    names the switch; absent otherwise)."""
    table = components(engine, topology, frontend, runner)
    return {"vllm_code": sorted(c for c, i in table.items() if i == "vllm"),
            "simulated": {c: i for c, i in table.items() if i != "vllm"},
            **({"model_frontend_because": frontend_note or None} if engine == "vllm" else {}),
            **({"model_runner_because": MODEL_RUNNER_REASON}
               if engine == "vllm" and runner == "model" else {}),
            "vllm_fingerprint": vllm_fingerprint() if engine == "vllm" else None,
            "trace_hash_meaning": TRACE_HASH_MEANING}


@cache
def vllm_fingerprint() -> str | None:
    """SHA-256 over the source of every vLLM module this process imported (path relative to
    the vllm package, then its bytes, in path order), or None when vLLM was not imported.
    Stock 0.33.0 and a patched tree differ here even where their traces do not. Computed once
    per process, after the first vllm-backend run imported what it needs."""
    mod = sys.modules.get("vllm")
    if mod is None or not getattr(mod, "__file__", None):
        return None
    root = os.path.dirname(os.path.abspath(str(mod.__file__))) + os.sep
    files = sorted({os.path.abspath(f) for m in list(sys.modules.values())
                    if isinstance(f := getattr(m, "__file__", None), str)
                    and os.path.abspath(f).startswith(root) and f.endswith(".py")})
    digest = hashlib.sha256()
    for path in files:
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        digest.update(path[len(root):].encode() + b"\0" + data + b"\0")
    return digest.hexdigest()
