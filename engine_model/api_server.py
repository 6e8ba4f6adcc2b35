"""The HTTP API layer of one API server, in front of its AsyncLLM: how an endpoint names a
request, and the routers' abort endpoints. Everything here follows vLLM 0.33.0
(``vllm/entrypoints/``); line numbers are that release's.

- **The external ID.** ``OpenAIServing._base_request_id`` (serve/engine/serving.py:133-142)
  takes the ``X-Request-Id`` header when there is one, else the body's ``request_id`` (whose
  default is a ``random_uuid()``, openai/chat_completion/protocol.py:411,
  openai/completion/protocol.py:147). ``--enable-request-id-headers`` only echoes the header
  back (serve/middleware/register.py:38): the header is honoured either way.
- **Endpoint prefixes.** Chat completions give AsyncLLM ``chatcmpl-{base}``
  (openai/chat_completion/serving.py:320-322); completions ``cmpl-{base}`` and, per prompt
  ``i``, ``cmpl-{base}-{i}`` (openai/completion/serving.py:147, 183); the scale-out router's
  token-in/token-out endpoint ``generate-tokens-{base}`` (scale_out/token_in_token_out/
  serving.py:202-204). A client that later names its own ``base`` names nothing AsyncLLM knows.
- **Routers' aborts.** The RL dev router's ``POST /abort_requests`` aborts its body's
  ``request_ids`` as external IDs, and with none aborts every ``request_states`` and
  ``parent_requests`` key by internal ID (rl/online/api_router.py:97-132). The scale-out
  router's (token_in_token_out/api_router.py:79-104, also served unauthenticated at
  ``/abort_requests``) aborts its ``request_ids`` as external IDs in a background task. Either
  way an external ID ends every internal ID registered under it
  (v1/engine/output_processor.py:627), whichever client sent it.

The layer is the same on both backends: vLLM's API layer is asyncio and HTTP code, modelled.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from racesim.engine_model.config import RequestSpec
from racesim.engine_model.events.api import ApiRequest, ApiRouterAbort
from racesim.engine_model.frontend.async_llm import AsyncLLM
from racesim.sim.world import World

__all__ = ["ApiServer", "ENDPOINT_PREFIXES"]

Proc = Generator[simpy.Event, Any, Any]

#: How each endpoint turns the base ID into AsyncLLM's request ID (``{}``: the base).
ENDPOINT_PREFIXES: dict[str, str] = {
    "chat": "chatcmpl-{}",
    "completions": "cmpl-{}-0",  # one prompt: item 0
    "generate-tokens": "generate-tokens-{}",
}


class ApiServer:
    """One API server's HTTP layer: names requests and serves the routers' abort endpoints."""

    def __init__(self, world: World, engine_client: AsyncLLM) -> None:
        self.world = world
        self.engine_client = engine_client
        self.name = engine_client.name

    def request_id(self, spec: RequestSpec, uid: int) -> str:
        """The ID the endpoint ``spec.endpoint`` hands AsyncLLM.generate() for ``spec``."""
        assert spec.endpoint is not None
        if spec.id_via == "none":
            # random_uuid() (uuid4().hex), drawn from a seeded stream: runs stay deterministic
            base = f"{self.world.rng.stream('api-uuid').getrandbits(128):032x}"
        else:
            base = spec.id  # header or body: honoured as given, the header first
        served = ENDPOINT_PREFIXES[spec.endpoint].format(base)
        self.world.emit(self.name, spec.id, 0, ApiRequest(uid, spec.endpoint, spec.id_via,
                                                          served))
        return served

    def router_abort(self, request_ids: list[str], uid: int, router: str = "rl") -> Proc:
        """``POST /abort_requests`` with ``request_ids``: ``AsyncLLM.abort(ids)``, external."""
        self.world.emit(self.name, request_ids[0] if len(request_ids) == 1 else None, 0,
                        ApiRouterAbort(router, list(request_ids), False, uid))
        for rid in request_ids:
            yield from self.engine_client.abort(rid)

    def router_abort_all(self) -> Proc:
        """The RL router's ``POST /abort_requests`` with no IDs: every ``request_states`` and
        ``parent_requests`` key, aborted by internal ID in one call (api_router.py:120-132)."""
        op = self.engine_client.output_processor
        ids = [rid for rid, _inc in op.live_ids()] + op.parent_ids()
        self.world.emit(self.name, None, 0, ApiRouterAbort("rl", ids, True, 0))
        if ids:
            yield from self.engine_client.abort_many(ids, internal=True)
