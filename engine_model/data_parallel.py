"""Data parallelism: each API server's load balancer and the DP coordinator's stats.

``DPLoadBalancer`` is the routing state of vLLM 0.33's ``DPLBAsyncMPClient``
(v1/engine/core_client.py:1710-1900), one per API server: it picks an engine per request,
remembers the choice in ``reqs_in_flight`` keyed by the (internal) request ID, routes aborts by
that dict, and forgets an ID when an engine lists it in ``finished_requests``. A second ADD for
an ID still in ``reqs_in_flight`` goes to the same engine (streaming-input affinity, :1758).

``DPCoordinator`` is the stats half of vLLM's DPCoordinator (v1/engine/coordinator.py:264-290):
the engines' waiting/running counts and KV usage, published to every load balancer
``stats_update_interval_ms`` (100 ms) after they changed. Request waves (START_DP_WAVE,
coordinator.py:409-440; core.py:2372-2430) carry no request IDs and only decide whether idle
ranks run dummy batches, so they are not modelled. vLLM 0.33's client sends no FIRST_REQ: the
ADD send is the only await in ``add_request_async`` (core_client.py:1607-1617).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

import simpy

from racesim.engine_model.events.dp import DpRoute
from racesim.sim.world import World

__all__ = ["DPLoadBalancer", "DPCoordinator", "STATS_INTERVAL"]

#: vLLM's default ``stats_update_interval_ms`` (coordinator.py:264-266), in seconds.
STATS_INTERVAL = 0.1
_MAX_SCORE = float(2**63 - 1)  # sys.maxsize, the scan's starting minimum (core_client.py:1770)

Counts = list[tuple[int, int, float]]


class DPLoadBalancer:
    """DPLBAsyncMPClient's routing state for one API server (``client_index``)."""

    __slots__ = ("world", "component", "client_count", "reqs_in_flight", "engine_inflight",
                 "lb_engines", "eng_start_index", "streaming_reqs", "_truth")

    def __init__(self, world: World, component: str, num_engines: int, client_index: int,
                 client_count: int) -> None:
        self.world = world
        self.component = component
        self.client_count = client_count
        #: request ID -> engine index, to route aborts (core_client.py:1727).
        self.reqs_in_flight: dict[str, int] = {}
        #: this client's unfinished requests per engine (core_client.py:1732).
        self.engine_inflight = [0] * num_engines
        #: [waiting, running, kv_cache_usage] per engine, as the coordinator last published.
        self.lb_engines: list[list[float]] = [[0, 0, 0.0] for _ in range(num_engines)]
        self.eng_start_index = (num_engines * client_index) // client_count
        #: open streaming-input sessions, whose aborts go to every engine (:1729, 1752-1756).
        self.streaming_reqs: dict[str, None] = {}
        self._truth: dict[str, int] = {}  # ground truth: the incarnation each entry was made for

    def choose(self, request_id: str, inc: int, resumable: bool = False,
               rank: int | None = None) -> int:
        """get_core_engine_for_request (core_client.py:1751-1811): affinity, else the pinned
        ``rank`` (``X-data-parallel-rank``, entrypoints/generate/base/serving.py:221; checked
        only after the affinity, :1758-1763), else the lowest load score scanning from
        ``eng_start_index``; records the choice in reqs_in_flight."""
        if resumable:
            self.streaming_reqs[request_id] = None
        elif self.streaming_reqs:
            self.streaming_reqs.pop(request_id, None)  # a session's final add ends it
        engine = self.reqs_in_flight.get(request_id)
        if engine is not None:
            self._truth[request_id] = inc
            self.world.emit(self.component, request_id, inc, DpRoute(engine, True))
            return engine
        if rank is not None:
            # a pin skips the load scan and its bookkeeping (:1763, 1806-1811)
            self.reqs_in_flight[request_id] = rank
            self.engine_inflight[rank] += 1
            self._truth[request_id] = inc
            self.world.emit(self.component, request_id, inc, DpRoute(rank, False))
            return rank
        counts = self.lb_engines
        n = len(counts)
        best, chosen = _MAX_SCORE, 0
        for i in range(n):
            idx = (self.eng_start_index + i) % n
            waiting, running, usage = counts[idx]
            score = max(float(self.client_count * self.engine_inflight[idx]), waiting + running)
            if waiting:
                score += waiting * 6.0 * max(0.0, usage - 0.5)
            if score < best:
                best, chosen = score, idx
        counts[chosen][0] += self.client_count
        self.eng_start_index = (self.eng_start_index + 1) % n
        self.reqs_in_flight[request_id] = chosen
        self.engine_inflight[chosen] += 1
        self._truth[request_id] = inc
        self.world.emit(self.component, request_id, inc, DpRoute(chosen, False))
        return chosen

    def finished(self, request_ids: Sequence[str]) -> None:
        """process_engine_outputs (core_client.py:1819-1825): forget the finished IDs."""
        for rid in request_ids:
            engine = self.reqs_in_flight.pop(rid, None)
            if engine is not None:
                self.engine_inflight[engine] -= 1
                self._truth.pop(rid, None)

    def route_aborts(self, request_ids: Sequence[str]) -> tuple[dict[int, list[str]], list[str]]:
        """abort_requests_async (core_client.py:1874-1900): the IDs per engine, and the IDs
        with no entry, which are sent nowhere. An open session's abort goes to every engine:
        a chunk in flight may have re-created it anywhere."""
        by_engine: dict[int, list[str]] = {}
        unrouted = []
        for rid in request_ids:
            if rid in self.streaming_reqs:
                del self.streaming_reqs[rid]
                for e in range(len(self.engine_inflight)):
                    by_engine.setdefault(e, []).append(rid)
                continue
            engine = self.reqs_in_flight.get(rid)
            if engine is None:
                unrouted.append(rid)
            else:
                by_engine.setdefault(engine, []).append(rid)
        return by_engine, unrouted

    def publish(self, counts: Counts) -> None:
        """The stats task (core_client.py:1586-1599) takes the coordinator's latest counts."""
        self.lb_engines = [[w, r, u] for w, r, u in counts]

    def live_ids(self) -> list[tuple[str, int]]:
        """``(request ID, incarnation)`` for every ``reqs_in_flight`` entry (the leak audit)."""
        return [(rid, self._truth.get(rid, 0)) for rid in self.reqs_in_flight]


class DPCoordinator:
    """Publishes the engines' request counts to the load balancers after they change."""

    def __init__(self, world: World, counts: Callable[[], Counts],
                 balancers: Sequence[DPLoadBalancer], latency: float) -> None:
        self.world = world
        self._counts = counts
        self._balancers = balancers
        self._latency = latency
        self._armed = False

    def note_change(self) -> None:
        """An engine stepped: publish within ``STATS_INTERVAL`` (once per interval)."""
        if not self._armed:
            self._armed = True
            self.world.env.process(self._publish())

    def _publish(self) -> Generator[simpy.Event, Any, None]:
        world = self.world
        yield world.env.timeout(STATS_INTERVAL)
        self._armed = False
        counts = self._counts()
        for lb in self._balancers:
            delay = world.pause("dp.coordinator:publish", self._latency, "dp.coordinator")
            world.env.timeout(delay, (lb, counts)).callbacks.append(_deliver_counts)


def _deliver_counts(ev: Any) -> None:
    lb, counts = ev.value
    lb.publish(counts)
