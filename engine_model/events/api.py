"""Trace event kinds of the HTTP API layer in front of AsyncLLM (``api.*``)."""

from __future__ import annotations

from racesim.sim.trace import EventRecord, TraceEvent

__all__ = ["ApiCancel", "ApiRequest", "ApiRouterAbort", "ApiStore"]


class ApiRequest(EventRecord):
    """api.request: an endpoint named a client's request: ``served`` is the ID it gives
    AsyncLLM (the external ID), built from the client's ``X-Request-Id`` header or body
    ``request_id`` (``via``) and the endpoint's prefix."""

    KIND = "api.request"
    KEY = True
    __slots__ = ("uid", "endpoint", "via", "served")

    def __init__(self, uid: int, endpoint: str, via: str, served: str) -> None:
        self.uid = uid
        self.endpoint = endpoint
        self.via = via
        self.served = served

    def describe(self, ev: TraceEvent) -> str:
        return f"{self.endpoint} endpoint names {ev.request!r} ({self.via}) as {self.served!r}"


class ApiRouterAbort(EventRecord):
    """api.router_abort: a router's ``/abort_requests`` calls ``AsyncLLM.abort`` with
    ``ids`` (``router``: "rl" or "scale-out"; ``all``: the RL router's abort-all, by internal
    ID; ``uid``: the client that asked, 0 for an operator)."""

    KIND = "api.router_abort"
    KEY = True
    __slots__ = ("router", "ids", "all", "uid")

    def __init__(self, router: str, ids: list[str], all: bool, uid: int) -> None:
        self.router = router
        self.ids = ids
        self.all = all
        self.uid = uid

    def describe(self, ev: TraceEvent) -> str:
        what = "abort-all" if self.all else "abort"
        return f"{self.router} router {what}: AsyncLLM.abort({self.ids!r})"


class ApiCancel(EventRecord):
    """api.cancel: ``POST /v1/responses/{id}/cancel`` by client ``uid``: ``outcome`` is
    "not-found", "refused" (the stored response is no longer queued) or "cancelled" (the stored
    response of client ``owner`` is marked cancelled, and the background task of client
    ``task``, 0 when none is registered under the ID, is cancelled)."""

    KIND = "api.cancel"
    KEY = True
    __slots__ = ("uid", "outcome", "owner", "task")

    def __init__(self, uid: int, outcome: str, owner: int, task: int) -> None:
        self.uid = uid
        self.outcome = outcome
        self.owner = owner
        self.task = task

    def describe(self, ev: TraceEvent) -> str:
        if self.outcome != "cancelled":
            return f"cancel of response {ev.request!r}: {self.outcome}"
        task = f"cancels the task of uid {self.task}" if self.task else "no task to cancel"
        return (f"cancel of response {ev.request!r}: marks uid {self.owner}'s response "
                f"cancelled, {task}")


class ApiStore(EventRecord):
    """api.store: the Responses API's ``response_store`` entry for an ID now holds client
    ``owner``'s response with ``status``."""

    KIND = "api.store"
    __slots__ = ("owner", "status")

    def __init__(self, owner: int, status: str) -> None:
        self.owner = owner
        self.status = status

    def describe(self, ev: TraceEvent) -> str:
        return f"response_store[{ev.request!r}] = uid {self.owner}'s response ({self.status})"
