"""Trace event kinds of the HTTP API layer in front of AsyncLLM (``api.*``)."""

from __future__ import annotations

from racesim.sim.trace import EventRecord, TraceEvent

__all__ = ["ApiRequest", "ApiRouterAbort"]


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
