"""The types of a vLLM version profile (racesim.engine_model.versions holds the profiles)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Behaviour", "VllmProfile"]


@dataclass(frozen=True, slots=True)
class Behaviour:
    """One line of ``racesim list versions``: what the profile does, and where vLLM does it."""

    text: str
    source: str


@dataclass(frozen=True, slots=True)
class VllmProfile:
    """The engine-side semantics of one vLLM release."""

    name: str
    release: str
    #: an ADD for an ID already in ``Scheduler.requests``: "overwrite" the entry, or "assert"
    #: ("duplicate request id", the engine dies).
    duplicate_add: str
    #: an add for an ID already in ``OutputProcessor.request_states``: "reject" ("already
    #: running"), or "finish-old" (the old stream ends with STREAM_FINISHED, the new request is
    #: not registered, and its ADD is still sent).
    frontend_duplicate: str
    #: an abort by an external ID the frontend does not know: "as-internal" (treated as an
    #: internal ID) or "noop".
    abort_unknown_external: str
    #: the default of ``[engine] async_scheduling`` when a scenario does not set it.
    async_scheduling: bool
    #: the default of ``[engine] eager_aborts``: ABORTs also go to ``aborts_queue``.
    eager_aborts: bool
    #: the busy loop discards ``aborts_queue`` when it goes idle (the input-queue copies remain).
    idle_clears_aborts: bool
    #: how the prefill side holds a finished request's blocks for the decode side: "timeout"
    #: (a fixed TTL) or "lease" (a TTL renewed by the decode side's heartbeats).
    pd_hold: str
    #: the default TTL (timeout) or lease duration in seconds, when a scenario does not set it;
    #: a lease is renewed by heartbeats every lease // 6 s, each extending it to 2/3 lease.
    hold_timeout: float
    #: an aborted request still waiting for remote KV: "free-now", or "free-after-recv" (its
    #: blocks are freed when the read that writes them completes).
    remote_kv_abort: str
    #: the default of ``[engine] prefix_caching`` (``enable_prefix_caching``).
    prefix_caching: bool
    #: where freed blocks go: "append" (all to the tail of the free queue) or "lifo-uncached"
    #: (blocks without a hash to the front, reused first; hashed ones to the tail, LRU).
    free_order: str
    #: engine-side features this release has and the model follows for it: "dp"
    #: (DPLBAsyncMPClient), "pause" (pause_generation), "preprocess-error" (an ERROR output
    #: from the input thread), "kv-load-failure" (kv_load_failure_policy), "pd-abort-notify"
    #: (a decode request that ends before its KV read started still notifies the prefill side,
    #: #19223: nixl_connector.py:306-315 in 0.9.2, nixl/pull_scheduler.py:219-230 in 0.33),
    #: "kv-idle-blocks" (an engine whose only requests are held for, or wait on, a transfer
    #: does not step: its notice or timeout waits for the next request; up to 0.20).
    features: frozenset[str]
    #: a caller cancelled before ``add_request`` returned its collector: "abort" (generate()
    #: aborted the request ID unconditionally) or "nothing" (``q`` is None: no abort).
    cancel_before_collector: str
    #: n > 1 in AsyncLLM.add_request: "per-child" (each child is registered, then its ADD
    #: sent, before the next child is registered) or "register-first" (every child is
    #: registered, then the ADDs are sent one by one; a cancel during them aborts the parent).
    fan_out: str
    #: the finish statuses for which the prefill side's connector holds a request's blocks
    #: for the decode side (any other finish frees them at once).
    pd_held_finishes: frozenset[str]
    #: what an abort by external ID leaves of an n > 1 parent in
    #: ``OutputProcessor.parent_requests``: "drop" (the entry goes with its last child) or
    #: "keep" (the entry stays; nothing in the request's lifecycle removes it).
    external_abort_parent: str
    widths: Mapping[str, str]
    behaviours: tuple[Behaviour, ...]
    #: why this profile's P/D verdicts are unverified ("": they follow that release's code).
    pd_unverified: str = ""
    #: an abort made in the frontend gives its client a final "abort" output (vLLM #22283,
    #: from 0.10); before, ``OutputProcessor.abort_requests`` only pops the state.
    abort_final_output: bool = True

    def width(self, point: str) -> str:
        width = self.widths.get(point)
        if width is None:
            # vLLM's own frontend names its points by kind (engine_vllm/frontend/points.py):
            # an eager send vLLM never suspends at is latent, a sleep(0) yields
            return ("latent" if point.startswith("send:") else
                    "yield" if point.startswith("yield:") else "live")
        return width
