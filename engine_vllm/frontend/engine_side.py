"""The engine's end of the real frontend's input pipe: vLLM's decoded inputs onto the shell.

``EngineCoreProc.process_input_sockets`` (core.py) decodes each message and queues
``(request_type, request)``; the shell (engine_model/engine_shell.py) has the input thread and
busy loop, and takes its inputs as racesim's messages. This maps one onto the other, keeping
vLLM's request ID, client index, max_tokens, prompt length and ``resumable`` as decoded, and the
ground truth that rode beside the frames. A ``get_supported_tasks`` utility call is answered as
``EngineCore.get_supported_tasks`` answers on a generate model (``("generate",)``), with vLLM's
``UtilityOutput``; ``pause_generation`` / ``resume_scheduler`` go to the busy loop as the model's
frontend sends them, and are answered when vLLM answers them (finishes.reply_when_paused).
"""

from __future__ import annotations

from collections import deque
from functools import partial
from typing import Any

from racesim.engine_model.messages import AbortMessage, EngineCoreRequest, UtilityMessage
from racesim.engine_vllm.frontend import EngineCoreOutputs

__all__ = ["to_shell", "utility_outputs"]


def to_shell(engine: Any, request_type: Any, request: Any, truth: Any) -> Any:
    """The shell's message for one decoded input (None: answered or ignored here)."""
    name = request_type.name
    if name == "ADD":
        params = request.sampling_params
        return EngineCoreRequest(
            request.request_id, getattr(request, "external_req_id", None) or request.request_id,
            len(request.prompt_token_ids or ()), int(params.max_tokens),
            int(request.client_index), truth.eos_at, None, truth.inc, truth.prompt,
            truth.fault, bool(getattr(request, "resumable", False)))
    if name == "ABORT":
        return AbortMessage(tuple(str(r) for r in request), int(truth or 0))
    if name == "UTILITY":
        client, call_id, method, args = request
        if method == "get_supported_tasks":
            _reply(engine, int(client), call_id, ("generate",))
            return None
        if method in ("pause_generation", "pause_scheduler", "resume_scheduler"):
            # AsyncLLM.pause_generation / resume_generation: 0.33 calls pause_generation
            # (core_client.py:1353-1359), 0.20 pause_scheduler (core_client.py:1067-1070), each
            # with (mode, clear_cache); the busy loop applies it, and the reply follows
            # (finishes.reply_when_paused)
            replies = engine.__dict__.setdefault("utility_replies", deque())
            replies.append(partial(_reply, engine, int(client), call_id, None))
            if method == "resume_scheduler":
                return UtilityMessage(method)
            return UtilityMessage(method, str(args[0]), bool(args[1]) if len(args) > 1 else True)
        if method == "reset_prefix_cache":
            # AsyncLLM.reset_prefix_cache(reset_running_requests, reset_connector): answered
            # with the reset's result once the busy loop applied it (finishes.utility)
            replies = engine.__dict__.setdefault("utility_replies", deque())
            replies.append(partial(_reply, engine, int(client), call_id))
            return UtilityMessage(method, "", bool(args[0]) if args else False)
    return None


def utility_outputs(v: Any, call_id: int, result: Any) -> Any:
    """vLLM's ``EngineCoreOutputs`` carrying one utility call's result."""
    from vllm.v1.engine import UtilityOutput, UtilityResult

    return v.EngineCoreOutputs(utility_output=UtilityOutput(call_id, result=UtilityResult(result)))


def _reply(engine: Any, client: int, call_id: int, result: Any) -> None:
    channel = engine.output_channels.get(client)
    if channel is None:
        return
    channel.send(EngineCoreOutputs(engine.index, (), utility_outputs(engine.v, call_id, result)),
                 [])
