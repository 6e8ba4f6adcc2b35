#!/usr/bin/env python3
"""Re-measure, on the installed release, what vLLM's own OpenAI serving layer does in racesim's
World (no tokenizer: ``skip_tokenizer_init``), on vLLM's own frontend:

1. the completions endpoint (``OpenAIServingCompletion``, a token-ID prompt): the ID it hands
   ``AsyncLLM.generate`` for ``X-Request-Id: X``, a body ``request_id`` Y and neither, and the
   ID the engine then sees, as shipped;
2. two API servers given the same ``X-Request-Id`` with request-ID randomization disabled
   (completions-shared-request-id under ``buggy``, #27711): what the engine does;
3. chat and the Responses API: it builds the release's ``OpenAIServingChat`` and
   ``OpenAIServingResponses`` as ``vllm serve`` builds them (its default flags), sends each one
   request (one user message; the Responses request in background mode with the store on, as
   racesim's ``endpoint = "responses"`` is) and prints what vLLM answered: the exception or error
   response, and the innermost frame of vLLM's code it came from.

    .venv/bin/python scripts/probe-serving.py                 # the installed release (0.33)
    .venv-0.20.0/bin/python scripts/probe-serving.py 0.20

On 0.20 the model's API layer (0.33 only) is let through for the probe's scenarios.
"""

from __future__ import annotations

import inspect
import os
import sys
import traceback
from typing import Any

os.environ.setdefault("VLLM_ENABLE_RESPONSES_API_STORE", "1")


def _where(exc: BaseException) -> str:
    """The innermost frame of vLLM's code, and of its entrypoints when that is another."""
    frames = [f"vllm/{f.filename.rsplit('/site-packages/vllm/', 1)[1]}:{f.lineno}"
              for f in traceback.extract_tb(exc.__traceback__)
              if "/site-packages/vllm/" in f.filename]
    entry = [f for f in frames if f.startswith("vllm/entrypoints/")]
    if not frames:
        return "?"
    if entry and entry[-1] != frames[-1]:
        return f"{frames[-1]} (from {entry[-1]})"
    return frames[-1]


def _build(fe: Any, cls: Any, *pos: Any) -> Any:
    from racesim.engine_vllm.frontend import endpoints

    llm = fe.llm
    c = endpoints._common()
    model = str(llm.model_config.model)
    models = c.Models(engine_client=llm,
                      base_model_paths=[c.BaseModelPath(name=model, model_path=model)])
    args, kw = endpoints._renderers(llm, models, cls)
    params = inspect.signature(cls.__init__).parameters
    if "online_renderer" in params and params["online_renderer"].kind.name != "KEYWORD_ONLY":
        args, kw = (kw.pop("online_renderer"),), kw
    return cls(llm, models, *pos, *args, request_logger=None, chat_template=None,
               chat_template_content_format="auto", **kw)


async def _probe(fe: Any) -> list[str]:
    from racesim.engine_vllm.frontend.endpoints import http_request

    out = []
    chat = __import__("vllm.entrypoints.openai.chat_completion.serving", fromlist=["x"])
    chat_proto = __import__("vllm.entrypoints.openai.chat_completion.protocol", fromlist=["x"])
    resp = __import__("vllm.entrypoints.openai.responses.serving", fromlist=["x"])
    resp_proto = __import__("vllm.entrypoints.openai.responses.protocol", fromlist=["x"])
    cases = [
        ("chat", lambda: _build(fe, chat.OpenAIServingChat, "assistant"),
         lambda: chat_proto.ChatCompletionRequest.model_validate(
             {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
         "create_chat_completion"),
        ("responses", lambda: _build(fe, resp.OpenAIServingResponses),
         lambda: resp_proto.ResponsesRequest.model_validate(
             {"input": "hi", "max_output_tokens": 4, "background": True, "store": True}),
         "create_responses"),
    ]
    for name, build, body, method in cases:
        try:
            serving = build()
        except Exception as exc:
            out.append(f"{name}: building it raised {type(exc).__name__}: {exc} "
                       f"at {_where(exc)}")
            continue
        try:
            result = await getattr(serving, method)(body(), http_request(
                f"/v1/{name}", {"X-Request-Id": "X"}, None, fe.llm))
        except Exception as exc:
            out.append(f"{name}: {method} raised {type(exc).__name__}: {exc} at {_where(exc)}")
            continue
        err = getattr(result, "error", None)
        out.append(f"{name}: {method} answered "
                   + (f"an error: {err.message}" if err is not None else type(result).__name__))
    return out


def _ids(profile: str) -> list[str]:
    """Parts 1 and 2: what vLLM's serving layer names, and what two servers sharing a header
    do to the engine."""
    from racesim.engine_model.events import ApiRequest, FeAdd
    from racesim.runner import run_scenario
    from racesim.scenarios import load_scenario
    from racesim.scenarios.loader import scenario_from_dict

    base = {"at": 0.0, "prompt_tokens": 4, "max_tokens": 4, "endpoint": "completions"}
    scen = scenario_from_dict({"name": "probe-ids", "engine": {"vllm": profile}, "request": [
        {**base, "id": "X", "id_via": "header"}, {**base, "id": "Y", "id_via": "body"},
        {**base, "id": "Z", "id_via": "none"}]})
    r = run_scenario(scen, "internal-id", engine="vllm")
    served = [(e.request, e.detail.served) for e in r.trace if isinstance(e.detail, ApiRequest)]
    adds = [e.request for e in r.trace if isinstance(e.detail, FeAdd)]
    lines = [f"completions ({via}): AsyncLLM.generate gets {s!r}, the engine sees {a!r}"
             for (_c, s), a, via in zip(served, adds, ("X-Request-Id: X", "body request_id Y",
                                                       "neither"), strict=True)]
    shared = load_scenario("completions-shared-request-id").with_vllm(profile)
    b = run_scenario(shared, "buggy", engine="vllm")
    named = sorted({e.detail.served for e in b.trace if isinstance(e.detail, ApiRequest)})
    lines.append(f"two API servers, X-Request-Id: bench-0, randomization off: both name "
                 f"{named}; violated {list(b.violated)}"
                 + (f": {b.violations[0].detail}" if b.violations else ""))
    return lines


def main() -> int:
    from racesim.engine_vllm.frontend import serving
    from racesim.runner import run_scenario
    from racesim.scenarios.loader import scenario_from_dict

    profile = sys.argv[1] if len(sys.argv) > 1 else "0.33"
    if profile != "0.33":  # the model's API layer is 0.33's: let the probe's requests pass
        from racesim.engine_model import versions

        p = versions.get_profile(profile)
        object.__setattr__(p, "features", p.features | {"api-layer"})
    os.environ["RACESIM_VLLM_FRONTEND"] = "asyncllm"
    lines = _ids(profile)

    async def run(self: Any) -> None:
        lines.extend(await _probe(self.fe))
        self._terminate("length")

    serving.ServingClient._run = run  # type: ignore[method-assign]
    scen = scenario_from_dict({"name": "probe", "engine": {"vllm": profile}, "request": [
        {"id": "X", "at": 0.0, "prompt_tokens": 4, "max_tokens": 4,
         "endpoint": "completions"}]})
    run_scenario(scen, "internal-id", engine="vllm")
    from importlib import metadata

    print(f"vLLM {metadata.version('vllm')}, skip_tokenizer_init=True:")
    for line in lines:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
