"""The engine's output side: one channel per client (API server), engine-initiated finishes,
and, under data parallelism, the finished-request IDs the load balancers read.

Outputs go to the API server named by each request's ``client_index`` (vLLM 0.33
v1/engine/core.py:2100-2110, the output thread's ``sockets[client_index]``). With
``include_finished_set`` (data parallelism, core.py:130, 184) the scheduler also collects each
client's finished IDs (scheduler.py:3055-3056) and attaches them to the next outputs
(scheduler.py:2646-2658); engine-initiated finishes carry their IDs directly
(``_send_finish_outputs_to_client``, core.py:2249-2268).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from racesim.engine_model.events.engine import EngineReject
from racesim.engine_model.ipc import Channel
from racesim.engine_model.messages import EngineCoreOutput, EngineCoreOutputs
from racesim.engine_model.request import Request
from racesim.sim.world import World

if TYPE_CHECKING:
    from racesim.engine_model.data_parallel import DPCoordinator

__all__ = ["EngineOutputs"]


class EngineOutputs:
    """Sends one engine's outputs, grouped per client, on that client's channel."""

    __slots__ = ("world", "index", "component", "channels", "finished_by_client",
                 "coordinator")

    def __init__(self, world: World, index: int, component: str) -> None:
        self.world = world
        self.index = index
        self.component = component
        self.channels: dict[int, Channel] = {}
        #: data parallelism: the IDs finished per client since the last outputs (None: off).
        self.finished_by_client: dict[int, list[str]] | None = None
        #: data parallelism: told after every step that the request counts changed.
        self.coordinator: DPCoordinator | None = None

    def step_outputs(self, results: list[tuple[int, EngineCoreOutput]]) -> None:
        """A step's update_from_output results, with each client's finished IDs under DP."""
        by_client: dict[int, list[EngineCoreOutput]] = {}
        for client, output in results:
            by_client.setdefault(client, []).append(output)
        finished = self.finished_by_client
        if finished is None:
            if by_client:
                self.send(by_client)
            return
        for client, output in results:
            if output.finish_reason is not None and not output.chunk_end:
                finished.setdefault(client, []).append(output.request_id)
        for client in finished:
            by_client.setdefault(client, [])
        if by_client:
            self.send(by_client, dict(finished))
        finished.clear()
        if self.coordinator is not None:
            self.coordinator.note_change()

    def note_finished(self, finished: list[Request]) -> None:
        """Requests freed outside update_from_output (aborts): reported with the next outputs."""
        by_client = self.finished_by_client
        if by_client is not None:
            for req in finished:
                by_client.setdefault(req.client_index, []).append(req.request_id)

    def finish(self, finished: list[Request], reason: str) -> None:
        """_send_finish_outputs_to_client: an empty final output per request, by client."""
        by_client: dict[int, list[EngineCoreOutput]] = {}
        for req in finished:
            by_client.setdefault(req.client_index, []).append(
                EngineCoreOutput(req.request_id, (), reason, None, req.inc))
        self.send(by_client, {c: [o.request_id for o in outs] for c, outs in by_client.items()})

    def reject(self, rid: str, inc: int, client: int, why: str) -> None:
        """An ADD answered with an ERROR output and never scheduled."""
        self.world.emit(self.component, rid, inc, EngineReject(why))
        self.send({client: [EngineCoreOutput(rid, (), "error", None, inc)]}, {client: [rid]})

    def send(self, by_client: dict[int, list[EngineCoreOutput]],
             finished: dict[int, list[str]] | None = None) -> None:
        for client in (sorted(by_client) if len(by_client) > 1 else by_client):
            outputs = by_client[client]
            channel = self.channels.get(client)
            if channel is None:
                continue
            done = finished.get(client) if finished is not None else None
            detail = [[o.request_id, o.inc, len(o.new_tokens), o.finish_reason] for o in outputs]
            if done and self.finished_by_client is not None:
                channel.send(EngineCoreOutputs(self.index, tuple(outputs), tuple(done)),
                             [o.request_id for o in outputs] or list(done), outputs=detail,
                             finished=list(done))
            else:
                channel.send(EngineCoreOutputs(self.index, tuple(outputs), None),
                             [o.request_id for o in outputs], outputs=detail)

