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

- **The Responses API** (background mode: ``background=True``, ``store=True`` with
  ``VLLM_ENABLE_RESPONSES_API_STORE=1``, openai/responses/serving.py:265-277) reads only the
  body's ``request_id`` (default ``resp_{random_uuid()}``, openai/responses/protocol.py:357-359;
  no header, serving.py:386) and generates under ``{request_id}_0`` (serving.py:663-679). It
  keys ``response_store`` and ``background_tasks`` by that ID (serving.py:544-593, response.id
  is the request_id, protocol.py:989). A finished task overwrites the stored response unless
  it is cancelled (serving.py:944-949) and its done-callback pops ``background_tasks[id]``
  whoever's task it holds (:591-593); a failed one marks the stored response failed
  (:1111-1120). ``cancel`` marks the stored response cancelled if it is queued or in progress
  and cancels the task registered under the ID (:1177-1204).

This layer runs on the model's frontend (either backend). vLLM's own frontend runs vLLM's own
serving classes for the token-ID endpoints and routers instead (engine_vllm/frontend/serving.py),
which name requests by the same rules.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, Protocol

import simpy

from racesim.engine_model.config import RequestSpec
from racesim.engine_model.events.api import ApiCancel, ApiRequest, ApiRouterAbort, ApiStore
from racesim.engine_model.events.frontend import FeAbortIssue, FeAbortNoop
from racesim.engine_model.frontend.async_llm import AsyncLLM
from racesim.engine_model.messages import EngineCoreRequest
from racesim.sim.world import World

__all__ = ["ApiServer", "ENDPOINT_PREFIXES", "abort_many", "notify_kv_transfer_request_rejected"]

Proc = Generator[simpy.Event, Any, Any]

#: How each endpoint turns the base ID into AsyncLLM's request ID (``{}``: the base).
ENDPOINT_PREFIXES: dict[str, str] = {
    "chat": "chatcmpl-{}",
    "completions": "cmpl-{}-0",  # one prompt: item 0
    "generate-tokens": "generate-tokens-{}",
    "responses": "{}_0",  # the first turn of _generate_with_builtin_tools
}


class _Cancellable(Protocol):
    """A background task's handle: the client whose request it runs."""

    uid: int

    def cancel_task(self) -> None: ...


class _Stored:
    """One ``response_store`` entry: whose response it is, and its status."""

    __slots__ = ("owner", "status")

    def __init__(self, owner: int, status: str) -> None:
        self.owner = owner
        self.status = status


def abort_many(llm: AsyncLLM, request_ids: Sequence[str], internal: bool) -> Proc:
    """``AsyncLLM.abort`` with a list of IDs (v1/engine/async_llm.py:948-958): one
    OutputProcessor abort for all of them, one ABORT send. An internal ID naming an n > 1
    parent pops its ``parent_requests`` entry even when no child is left
    (output_processor.py:653-659)."""
    op = llm.output_processor
    ids = op.flatten_req_to_abort(list(request_ids), internal)
    if internal:
        op.drop_parents(list(request_ids))
    if not ids:
        llm.world.emit(llm.name, None, 0, FeAbortNoop())
        return
    engines = None if llm.dp is None else [op.engine_of(r) for r in ids]
    llm.world.emit(llm.name, None, 0, FeAbortIssue(ids, "abort", engines))
    yield from llm.policy.abort(llm, ids)


def notify_kv_transfer_request_rejected(llm: AsyncLLM, request_id: str) -> Proc:
    """``AsyncLLM.notify_kv_transfer_request_rejected`` (v1/engine/async_llm.py:961-987): a
    pre-aborted ADD under the raw ``request_id``, never through ``assign_request_id`` (no
    random suffix), never registered in the OutputProcessor (no fe.add: the checker meets it
    at the engine), which the engine adds and aborts at once (``abort_immediately``,
    core.py:558-562)."""
    req = EngineCoreRequest(request_id, request_id, 1, 1, llm.index, None, None,
                            llm.next_inc(), "", "abort-immediately")
    engine = llm.engine if llm.dp is None else llm.dp.choose(request_id, req.inc)
    ev = llm.world.sleep("frontend.add_request:before_send", 0.0, llm.name)
    if ev is not None:
        yield ev
    llm.send_add(req, engine)


class ApiServer:
    """One API server's HTTP layer: names requests and serves the routers' abort endpoints."""

    def __init__(self, world: World, engine_client: AsyncLLM) -> None:
        self.world = world
        self.engine_client = engine_client
        self.name = engine_client.name
        #: the Responses API's stores, keyed by the body's request_id
        self.response_store: dict[str, _Stored] = {}
        self.background_tasks: dict[str, _Cancellable] = {}

    def base_id(self, spec: RequestSpec) -> str:
        """The client's ID as the endpoint reads it: the header first, then the body's
        ``request_id``, else a ``random_uuid()`` (the Responses API reads only the body)."""
        responses = spec.endpoint == "responses"
        if spec.id_via == "body" or (spec.id_via == "header" and not responses):
            return spec.id
        # random_uuid(): the low 64 bits of a uuid4 as 16 hex characters (utils/__init__.py:
        # 11-12), drawn from a seeded stream: runs stay deterministic
        uuid = f"{self.world.rng.stream('api-uuid').getrandbits(64):016x}"
        return f"resp_{uuid}" if responses else uuid

    def request_id(self, spec: RequestSpec, uid: int, base: str | None = None) -> str:
        """The ID the endpoint ``spec.endpoint`` hands AsyncLLM.generate() for ``spec``."""
        assert spec.endpoint is not None
        if base is None:
            base = self.base_id(spec)
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
            yield from abort_many(self.engine_client, ids, internal=True)

    def reject_kv_request(self, spec: RequestSpec, uid: int) -> Proc:
        """The endpoint answered a decode-side request (``kv_transfer_params`` with
        ``do_remote_prefill``) with an error before it reached the engine: the serving layer
        calls ``notify_kv_transfer_request_rejected(request.request_id, ...)`` with the body's
        raw ``request_id``, neither prefixed nor randomized
        (entrypoints/generate/base/serving.py:268-300)."""
        raw = spec.id if spec.id_via != "none" else self.base_id(spec)
        self.world.emit(self.name, spec.id, 0, ApiRequest(uid, str(spec.endpoint),
                                                          "kv-rejected", raw))
        yield from notify_kv_transfer_request_rejected(self.engine_client, raw)

    # -- the Responses API's background mode ---------------------------------------------------

    def responses_create(self, response_id: str, task: _Cancellable) -> None:
        """``create_responses`` in background mode: the queued response is stored and the task
        registered, both under the body's ``request_id`` (serving.py:544-593)."""
        self._store(response_id, task.uid, "queued")
        self.background_tasks[response_id] = task

    def responses_done(self, response_id: str, uid: int, outcome: str) -> None:
        """Client ``uid``'s background task ended: "completed" overwrites the stored response
        unless it is cancelled (serving.py:944-949), "failed" marks it failed unless it is
        completed or cancelled (:1111-1120), "cancelled" leaves it; then the done-callback pops
        ``background_tasks[response_id]``, whoever's task that is (:591-593)."""
        stored = self.response_store.get(response_id)
        if outcome == "completed":
            if stored is None or stored.status != "cancelled":
                self._store(response_id, uid, "completed")
        elif outcome == "failed" and stored is not None \
                and stored.status not in ("completed", "cancelled"):
            self._store(response_id, stored.owner, "failed")
        self.background_tasks.pop(response_id, None)

    def responses_cancel(self, response_id: str, uid: int) -> None:
        """``cancel_responses`` (serving.py:1177-1204) asked by client ``uid``."""
        stored = self.response_store.get(response_id)
        if stored is None or stored.status not in ("queued", "in_progress"):
            outcome = "not-found" if stored is None else "refused"
            self.world.emit(self.name, response_id, 0, ApiCancel(uid, outcome, 0, 0))
            return
        stored.status = "cancelled"
        task = self.background_tasks.get(response_id)
        self.world.emit(self.name, response_id, 0,
                        ApiCancel(uid, "cancelled", stored.owner,
                                  task.uid if task is not None else 0))
        if task is not None:
            task.cancel_task()

    def _store(self, response_id: str, owner: int, status: str) -> None:
        self.response_store[response_id] = _Stored(owner, status)
        self.world.emit(self.name, response_id, 0, ApiStore(owner, status))
