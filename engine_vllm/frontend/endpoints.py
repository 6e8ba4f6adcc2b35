"""Building vLLM's own serving classes on an API server's real ``AsyncLLM``, and the HTTP
objects they read (:mod:`racesim.engine_vllm.frontend.serving` runs the clients).

Per endpoint, the release's class, built as ``vllm serve`` builds it with its default flags and
no tokenizer (``skip_tokenizer_init``):

- ``completions``: ``OpenAIServingCompletion`` (0.33.0 and 0.20.0
  entrypoints/openai/completion/serving.py) over an ``OpenAIServingModels`` and the release's
  renderer: 0.33's ``OnlineRenderer`` (entrypoints/launchers/api_server/app_state.py:88-104),
  0.20's ``OpenAIServingRender`` (0.20.0 entrypoints/openai/api_server.py:369-383);
- ``generate-tokens``: 0.33's ``ServingTokens`` (entrypoints/scale_out/token_in_token_out/
  serving.py), with its ``OnlineDerenderer``, as ``init_scale_out_state`` builds it
  (entrypoints/scale_out/factories.py:57-83; ``force_no_detokenize`` is ``--tokens-only``, off).

The routers' ``/abort_requests`` are vLLM's own handlers called with a request whose app state
holds the AsyncLLM: the RL router's (0.33.0 entrypoints/rl/online/api_router.py:97-132) and the
scale-out router's, which aborts in a background task (token_in_token_out/api_router.py:79-99).

Seams: ``time`` in the serving modules (a response's ``created``) is the World's clock; the body
default ``request_id`` (``vllm.utils.random_uuid``, through ``uuid.uuid4``) is drawn from the
World's seeded stream while the body is parsed, and only then.
"""

from __future__ import annotations

import importlib
import inspect
import json
import types
import uuid as _uuid
from functools import cache
from typing import Any

__all__ = ["ENDPOINTS", "serving_of", "parse_body", "http_request", "router", "router_abort"]

#: endpoint -> (serving module, class, protocol module, request class, method)
ENDPOINTS: dict[str, tuple[str, str, str, str, str]] = {
    "completions": ("vllm.entrypoints.openai.completion.serving", "OpenAIServingCompletion",
                    "vllm.entrypoints.openai.completion.protocol", "CompletionRequest",
                    "create_completion"),
    "generate-tokens": ("vllm.entrypoints.scale_out.token_in_token_out.serving",
                        "ServingTokens", "vllm.entrypoints.scale_out.token_in_token_out."
                        "protocol", "GenerateRequest", "serve_tokens"),
}

#: the router each endpoint's abort_at calls: (module, handler)
ROUTERS = {"completions": ("vllm.entrypoints.rl.online.api_router", "abort_requests"),
           "generate-tokens": ("vllm.entrypoints.scale_out.token_in_token_out.api_router",
                               "abort_requests")}


class _Seeded:
    """``uuid`` for ``vllm.utils``: ``uuid4`` drawn from the World's seeded stream."""

    def __init__(self, real: Any, world: Any) -> None:
        self._real = real
        self.world = world

    def uuid4(self) -> _uuid.UUID:
        return _uuid.UUID(int=self.world.rng.stream("vllm/uuid4").getrandbits(128))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@cache
def _common() -> Any:
    from racesim.engine_vllm.frontend import build

    build.vllm_names()
    from starlette.requests import Request

    models = importlib.import_module("vllm.entrypoints.openai.models.serving")
    paths = importlib.import_module("vllm.entrypoints.openai.models.protocol")
    return types.SimpleNamespace(Models=models.OpenAIServingModels,
                                 BaseModelPath=paths.BaseModelPath,
                                 utils=importlib.import_module("vllm.utils"), Request=Request,
                                 Clock=build._Clock)


@cache
def names(endpoint: str) -> Any:
    """vLLM's classes for ``endpoint``, with the serving module's clock seam (once)."""
    c = _common()
    mod_name, cls, proto_name, req, method = ENDPOINTS[endpoint]
    mod = importlib.import_module(mod_name)
    if isinstance(getattr(mod, "time", None), types.ModuleType):
        mod.time = c.Clock(mod.time)
    return types.SimpleNamespace(cls=getattr(mod, cls), method=method,
                                 request=getattr(importlib.import_module(proto_name), req))


def _renderers(llm: Any, models: Any, cls: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The renderer arguments the release's serving class takes."""
    params = inspect.signature(cls.__init__).parameters
    common = dict(model_config=llm.model_config, renderer=llm.renderer, request_logger=None,
                  chat_template=None, chat_template_content_format="auto")
    if "online_derenderer" in params:  # 0.33 ServingTokens: the renderer is positional
        from vllm.renderers.online_derenderer import OnlineDerenderer
        from vllm.renderers.online_renderer import OnlineRenderer

        return (OnlineRenderer(**common),), {"online_derenderer": OnlineDerenderer(**common)}
    if "online_renderer" in params:
        from vllm.renderers.online_renderer import OnlineRenderer

        return (), {"online_renderer": OnlineRenderer(**common)}
    from vllm.entrypoints.serve.render.serving import OpenAIServingRender

    return (), {"openai_serving_render": OpenAIServingRender(model_registry=models.registry,
                                                             **common)}


def serving_of(fe: Any, endpoint: str) -> Any:
    """API server ``fe``'s serving object for ``endpoint`` (built on first use)."""
    built = fe.__dict__.setdefault("serving", {})
    if endpoint in built:
        return built[endpoint]
    c = _common()
    n = names(endpoint)
    llm = fe.llm
    model = str(llm.model_config.model)
    models = c.Models(engine_client=llm,
                      base_model_paths=[c.BaseModelPath(name=model, model_path=model)])
    args, kw = _renderers(llm, models, n.cls)
    built[endpoint] = n.cls(llm, models, *args, request_logger=None, **kw)
    return built[endpoint]


def parse_body(endpoint: str, body: dict[str, Any], world: Any) -> Any:
    """The endpoint's request model parsed from ``body``, as FastAPI parses the JSON body."""
    utils = _common().utils
    real = utils.uuid
    utils.uuid = _Seeded(real, world)
    try:
        return names(endpoint).request.model_validate(body)
    finally:
        utils.uuid = real


def http_request(path: str, headers: dict[str, str], body: Any = None, llm: Any = None) -> Any:
    """A Starlette ``Request`` with ``headers``, a JSON ``body`` and ``app.state.engine_client``
    (what the handlers read: ``headers``, ``json()``, ``state``, ``app.state``)."""
    raw = b"" if body is None else json.dumps(body).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    app = types.SimpleNamespace(state=types.SimpleNamespace(engine_client=llm))
    scope = {"type": "http", "method": "POST", "path": path, "query_string": b"", "app": app,
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    return _common().Request(scope, receive)


def router(endpoint: str) -> Any:
    """The release's ``/abort_requests`` handler for ``endpoint``'s router. 0.20.0 has no RL
    router (its one ``/abort_requests`` is the disagg router's, defined only for
    ``--tokens-only``, serve/disagg/api_router.py:82-83): ImportError there."""
    mod, handler = ROUTERS[endpoint]
    return getattr(importlib.import_module(mod), handler)


async def router_abort(handler: Any, llm: Any, request_ids: list[str]) -> None:
    """``POST /abort_requests {"request_ids": [...]}`` through vLLM's own router ``handler``."""
    await handler(http_request("/abort_requests", {"content-type": "application/json"},
                               {"request_ids": request_ids}, llm))
