"""A socket hop: FIFO per (sender, receiver), a transit latency and an await point per message."""

from __future__ import annotations

from collections.abc import Callable
from math import inf, nextafter
from typing import Any

from racesim.engine_model.events.engine import IpcDropped, IpcSend
from racesim.sim.world import World

__all__ = ["Channel", "message_kind"]


def message_kind(msg: object) -> str:
    return type(msg).__name__


class Channel:
    """Delivers messages in send order; a delayed message holds back the ones behind it.

    ZMQ gives per-pair FIFO order, so a later message never overtakes an earlier one on the same
    channel even when the plan gives it a shorter transit.
    """

    __slots__ = ("world", "name", "point", "latency", "_deliver", "_last", "_seq", "_arrived",
                 "_due", "connected")

    def __init__(self, world: World, name: str, point: str, latency: float,
                 deliver: Callable[[Any], None]) -> None:
        self.world = world
        self.name = name
        self.point = point
        self.latency = latency
        self._deliver = deliver
        self._last = 0.0
        self._due = 0.0  # when simpy will deliver the last message sent
        self._seq = 0
        self._arrived = self._arrive  # one bound method for every message's timeout
        #: whether the receiver is connected now (None: always). A ROUTER socket without
        #: ROUTER_MANDATORY drops a message for a peer it has no pipe to.
        self.connected: Callable[[], bool] | None = None

    def _arrive(self, ev: Any) -> None:
        self._deliver(ev.value)

    def send(self, msg: Any, request_ids: list[str], *, to: int | None = None,
             incs: list[int] | None = None, tag: int | None = None,
             outputs: list[list[Any]] | None = None, remote_inc: int | None = None,
             finished: list[str] | None = None, resumable: bool | None = None) -> None:
        """Put ``msg`` on the wire for ``request_ids``; the keywords are what the trace's
        ipc.send event records about it (see :class:`IpcSend`)."""
        world = self.world
        delay = world.pause(self.point, self.latency, self.name)
        now = world.now
        at = now + delay
        if at < self._last:
            at = self._last
        self._last = at
        self._seq += 1
        name = self.name
        world.trace.emit(name, request_ids[0] if len(request_ids) == 1 else None, 0,
                         IpcSend(f"{name}#{self._seq}", type(msg).__name__, request_ids, at,
                                 to, incs, tag, outputs, remote_inc, finished, resumable))
        connected = self.connected
        if connected is not None and not connected():
            world.emit(name, request_ids[0] if len(request_ids) == 1 else None, 0,
                       IpcDropped(f"{name}#{self._seq}", type(msg).__name__, request_ids))
            return
        wait = at - now
        if now + wait < self._due:
            # simpy delivers at ``now + wait``, which can round one ulp below the time of the
            # message ahead of this one: it would overtake it.
            while now + wait < self._due:
                wait = nextafter(wait, inf)
        self._due = now + wait
        # The message rides on the timeout as its value: no closure per message.
        world.env.timeout(wait, msg).callbacks.append(self._arrived)
