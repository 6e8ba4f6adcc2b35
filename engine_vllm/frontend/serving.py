"""vLLM's own OpenAI completions endpoint on an API server: ``OpenAIServingCompletion`` (0.33.0
and 0.20.0 entrypoints/openai/completion/serving.py) over the API server's real ``AsyncLLM``,
without a tokenizer (``skip_tokenizer_init``: the prompt is token IDs).

What is vLLM's code: the serving class and what it calls: ``_base_request_id`` (the
``X-Request-Id`` header, else the body's ``request_id``, whose default is ``random_uuid()``),
the ``cmpl-{base}`` / ``cmpl-{base}-{i}`` names, the renderer that turns token IDs into the
engine input, ``to_sampling_params``, ``merge_async_iterators`` and the streaming generator
whose SSE chunks the client reads, or the one ``CompletionResponse`` without streaming.

What racesim supplies: the HTTP request object the serving class reads (a Starlette ``Request``
over a scope holding the client's headers; it reads ``headers`` and sets
``state.request_metadata``), and the route handler around it: a client's task awaits
``create_completion`` and iterates the stream, and a disconnect cancels that task as
``with_cancellation`` (the handler) and Starlette's ``StreamingResponse`` (the stream) do
(0.33.0 entrypoints/serve/utils/api_utils.py:68-108). The sends to the socket are instant, so the
``CancelledError`` always lands in ``AsyncLLM.generate``'s await, which aborts by the internal
ID. The body's default ``request_id`` (``vllm.utils.random_uuid``, through ``uuid.uuid4``) is
drawn from the World's seeded stream while the body is parsed, and ``time`` in the serving
module (the response's ``created``) is the World's clock.

A router's ``/abort_requests`` (``abort_at``) is ``AsyncLLM.abort`` of the ID the endpoint gave
``generate`` (or the client's bare ID, ``abort_names = "bare"``), as the RL router calls it
(0.33.0 entrypoints/rl/online/api_router.py:117-119). The trace's ``api.request`` event is read
from what vLLM's serving class passed to ``AsyncLLM.generate``, not computed by racesim.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import types
import uuid as _uuid
from functools import cache
from typing import Any

from racesim.engine_model.events.api import ApiRequest, ApiRouterAbort
from racesim.engine_model.events.client import ClientAbort, ClientDisconnect, ClientOutput, \
    ClientSend
from racesim.engine_model.messages import FinishReason
from racesim.engine_vllm.frontend.asyncllm import CALLER
from racesim.engine_vllm.frontend.clients import RealClient

__all__ = ["ServingClient", "unsupported", "serving_of", "ENDPOINTS"]

#: the endpoints vLLM's own serving layer runs here
ENDPOINTS = ("completions",)

#: why the other endpoints do not run on vLLM's frontend (docs/backends.md)
_WHY = {
    "chat": "the OpenAI serving layer's chat endpoint (rendering messages needs a tokenizer: "
            "0.33.0 renderers/base.py:217-221)",
    "responses": "the OpenAI serving layer's Responses API (it asks for the tokenizer: 0.33.0 "
                 "entrypoints/openai/responses/serving.py:422)",
    "generate-tokens": "the OpenAI serving layer's scale-out generate-tokens endpoint (not "
                       "built yet)",
}


def unsupported(spec: Any) -> str | None:
    """Why request ``spec``'s endpoint cannot run on vLLM's own serving layer, or None."""
    if spec.endpoint not in ENDPOINTS:
        return f"request {spec.id!r}: {_WHY.get(spec.endpoint, spec.endpoint)}"
    where = f"request {spec.id!r}: the OpenAI serving layer with"
    if spec.kv_rejected:
        return f"{where} kv_rejected (a KV connector's decode side, not built)"
    if spec.stop_string_at is not None:
        return f"{where} a stop string (the endpoint's detokenizing path, not built)"
    if spec.input_chunks:
        return f"{where} a streaming-input session (not an endpoint of it)"
    return None


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
def _names() -> Any:
    """vLLM's serving classes, and the seams (once per process)."""
    from racesim.engine_vllm.frontend import build

    build.vllm_names()
    mod = importlib.import_module("vllm.entrypoints.openai.completion.serving")
    proto = importlib.import_module("vllm.entrypoints.openai.completion.protocol")
    models = importlib.import_module("vllm.entrypoints.openai.models.serving")
    paths = importlib.import_module("vllm.entrypoints.openai.models.protocol")
    utils = importlib.import_module("vllm.utils")
    if isinstance(getattr(mod, "time", None), types.ModuleType):
        mod.time = build._Clock(mod.time)
    from starlette.requests import Request

    return types.SimpleNamespace(Completion=mod.OpenAIServingCompletion,
                                 CompletionRequest=proto.CompletionRequest,
                                 Models=models.OpenAIServingModels,
                                 BaseModelPath=paths.BaseModelPath, utils=utils,
                                 Request=Request)


def _renderer_kwargs(llm: Any, models: Any, cls: Any) -> dict[str, Any]:
    """The renderer the release's serving class takes: 0.33's ``OnlineRenderer``
    (``online_renderer=``), 0.20's ``OpenAIServingRender`` (``openai_serving_render=``), built
    as ``init_app_state`` builds them with vllm serve's defaults (0.33.0 entrypoints/launchers/
    api_server/app_state.py:88-104; 0.20.0 entrypoints/openai/api_server.py:369-383)."""
    params = inspect.signature(cls.__init__).parameters
    common = dict(model_config=llm.model_config, renderer=llm.renderer, request_logger=None,
                  chat_template=None, chat_template_content_format="auto")
    if "online_renderer" in params:
        from vllm.renderers.online_renderer import OnlineRenderer

        return {"online_renderer": OnlineRenderer(**common)}
    from vllm.entrypoints.serve.render.serving import OpenAIServingRender

    return {"openai_serving_render": OpenAIServingRender(model_registry=models.registry,
                                                         **common)}


def serving_of(fe: Any) -> Any:
    """API server ``fe``'s ``OpenAIServingCompletion`` (built on first use)."""
    serving = getattr(fe, "serving", None)
    if serving is not None:
        return serving
    n = _names()
    llm = fe.llm
    name = str(llm.model_config.model)
    models = n.Models(engine_client=llm,
                      base_model_paths=[n.BaseModelPath(name=name, model_path=name)])
    fe.serving = n.Completion(llm, models, request_logger=None,
                              **_renderer_kwargs(llm, models, n.Completion))
    _watch_generate(fe)
    return fe.serving


def _watch_generate(fe: Any) -> None:
    """Record the ID vLLM's serving class hands ``AsyncLLM.generate`` (the ``api.request``
    event, and what a router's abort names), then call vLLM's own ``generate``."""
    llm = fe.llm
    real = llm.generate

    def generate(prompt: Any, params: Any, request_id: str, *a: Any, **kw: Any) -> Any:
        client = CALLER.get()
        if isinstance(client, ServingClient):
            client.served = request_id
            spec = client.spec
            fe.world.emit(fe.name, spec.id, 0, ApiRequest(client.uid, str(spec.endpoint),
                                                          spec.id_via, request_id))
        return real(prompt, params, request_id, *a, **kw)

    llm.generate = generate


class ServingClient(RealClient):
    """A scripted request sent to vLLM's own completions endpoint."""

    #: streaming (``"stream": true``), as the model's client receives each delta
    stream = True

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        #: the ID vLLM's serving class gave AsyncLLM.generate
        self.served = ""
        #: the choices that have a finish reason
        self._finished: set[int] = set()

    def _raw_request(self) -> Any:
        headers = [] if self.spec.id_via != "header" else [(b"x-request-id",
                                                            self.spec.id.encode())]
        return _names().Request({"type": "http", "method": "POST", "path": "/v1/completions",
                                 "headers": headers, "query_string": b""})

    def _body(self, stream: bool) -> Any:
        from racesim.engine_vllm.engine.views import PROMPT_TOKEN

        spec = self.spec
        body: dict[str, Any] = {"prompt": [PROMPT_TOKEN] * spec.prompt_tokens,
                                "max_tokens": spec.max_tokens, "n": spec.n, "stream": stream,
                                "return_token_ids": True}
        if spec.id_via == "body":
            body["request_id"] = spec.id
        n = _names()
        # the body's default request_id is vllm.utils.random_uuid() (the Field's
        # default_factory): seeded while the request is parsed, and only then
        real = n.utils.uuid
        n.utils.uuid = _Seeded(real, self.world)
        try:
            return n.CompletionRequest(**body)
        finally:
            n.utils.uuid = real

    async def _run(self) -> None:
        world = self.world
        spec = self.spec
        loop = self.fe.loop
        if spec.at > loop.time():
            await asyncio.sleep(spec.at - loop.time())
        delay = world.pause("client.send", 0.0, self.name)
        if delay > 0:
            await asyncio.sleep(delay)
        world.emit(self.name, spec.id, 0, ClientSend(self.uid, spec.frontend, spec.n,
                                                     spec.prompt_tokens, spec.max_tokens,
                                                     spec.prompt))
        CALLER.set(self)
        try:
            result = await serving_of(self.fe).create_completion(
                self._body(stream=self.stream), self._raw_request())
            if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                # without streaming, the handler answers a cancel with an ErrorResponse
                # ("Client disconnected", completion/serving.py) that no client reads
                raise asyncio.CancelledError
            if hasattr(result, "__aiter__"):
                async for chunk in result:
                    self._chunk(chunk)
            else:
                self._response(result)
        except asyncio.CancelledError:
            self._terminate(FinishReason.ABORT)
        except Exception as exc:  # EngineDeadError: the server answers with an error
            self.error = f"{type(exc).__name__}: {exc}"
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            if tb is not None and "/engine_vllm/frontend/" in tb.tb_frame.f_code.co_filename:
                self.fe.system.crashes.append(self.error)  # racesim's bug, not vLLM's answer
            self._terminate(FinishReason.ERROR)
        if not self.done:
            self._terminate(FinishReason.STREAM_FINISHED)

    def _choices(self, choices: list[dict[str, Any]]) -> None:
        decode = self.vocab.decode
        tokens = []
        reasons = []
        for c in choices:
            for t in c.get("token_ids") or ():
                tok = decode(t)
                tokens.append([c["index"], tok.inc, tok.ctx])
            if c.get("finish_reason"):
                reasons.append(c["finish_reason"])
        reason = None
        if reasons and self._all_finished(choices):
            reason = FinishReason.ABORT if FinishReason.ABORT in reasons else reasons[-1]
        self.tokens += len(tokens)
        self.world.emit(self.name, self.spec.id, 0, ClientOutput(self.uid, tokens, reason,
                                                                 self.done))
        if reason is not None:
            self._terminate(str(reason))
            return
        limit = self.spec.disconnect_after_tokens
        if limit is not None and self.tokens >= limit and not self.done:
            self.world.emit(self.name, self.spec.id, 0, ClientDisconnect(self.uid))
            self._terminate(FinishReason.ABORT)
            self.task.cancel()

    def _all_finished(self, choices: list[dict[str, Any]]) -> bool:
        """A stream finishes once every one of the ``n`` choices has a finish reason."""
        for c in choices:
            if c.get("finish_reason"):
                self._finished.add(int(c["index"]))
        return len(self._finished) >= self.spec.n

    def _chunk(self, chunk: str) -> None:
        """One SSE chunk of vLLM's stream generator: ``data: {json}`` or ``data: [DONE]``."""
        data = chunk.removeprefix("data: ").strip()
        if data == "[DONE]" or self.done:
            return
        body = json.loads(data)
        if "error" in body:
            self.error = str(body["error"].get("message", ""))
            self._terminate(FinishReason.ERROR)
            return
        if body.get("choices"):
            self._choices(body["choices"])

    def _response(self, result: Any) -> None:
        """A ``CompletionResponse`` (all of it at once) or an ``ErrorResponse``."""
        body = json.loads(result.model_dump_json())
        if "error" in body or not body.get("choices"):
            self.error = str(body.get("error", {}).get("message", ""))
            self._terminate(FinishReason.ERROR)
            return
        self._choices(body["choices"])

    async def _router_abort(self) -> None:
        """The RL router's ``POST /abort_requests`` with the served ID (or the bare one):
        ``AsyncLLM.abort(request_ids)``, external IDs (0.33.0 rl/online/api_router.py:117-119).
        Nothing registered under the bare ID is aborted (output_processor.py's
        ``external_req_ids.pop``)."""
        spec = self.spec
        name = spec.id if spec.abort_names == "bare" else self.served
        self.world.emit(self.name, spec.id, 0, ClientAbort(self.uid))
        self.world.emit(self.fe.name, name, 0, ApiRouterAbort("rl", [name], False, self.uid))
        await self.fe.llm.abort(name)
