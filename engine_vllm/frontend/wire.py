"""Fake ZMQ sockets faithful to pyzmq's asyncio semantics, on the World's channels.

vLLM's ``AsyncMPClient`` talks to its engine through a ROUTER (inputs) and a PULL (outputs)
socket (v1/engine/core_client.py ``MPClient.__init__``, the ``client_addresses`` branch). What
decides live versus latent is how pyzmq's ``zmq.asyncio`` sockets behave (research/asyncio.md
section 3, pyzmq 27 ``zmq/_future.py``):

- **send** (``_add_send_event``): with no send pending, a ``DONTWAIT`` send is tried first and,
  on success, an *already done* future is returned, so ``await`` does not suspend. vLLM sets
  ``SNDHWM=0`` on the ROUTER (utils/network_utils.py ``make_zmq_socket``), so on a live
  connection it always succeeds: the send is eager. The message enters the connection's one FIFO
  pipe (a racesim ``Channel``: the ``ipc.input:transit`` latency, live).
  A delay at the send's await point ``send:<vLLM caller>:<what it sends>`` is what an inserted
  ``await`` before the send would do (#15326's seed report): the coroutine suspends and the
  message enters the pipe that much later. vLLM never suspends there: the point is latent.
- **receive** (``_add_recv_event``): eager when a message is waiting, else a pending future that
  the delivery completes (``ipc.output:transit``, live).

The engine side decodes with vLLM's own ``MsgpackDecoder`` as ``EngineCoreProc``'s input thread
does (core.py ``process_input_sockets``) and hands the engine ``(request_type, request)``; outputs
are encoded per client with vLLM's ``MsgpackEncoder`` (core.py ``process_output_sockets``).
Ground truth (incarnations, abort tags) rides beside the frames and vLLM never reads it.
"""

from __future__ import annotations

import sys
import types
from collections import deque
from dataclasses import dataclass
from typing import Any

from racesim.engine_vllm.frontend.loop import SimLoop, point_of_frame

__all__ = ["AddTruth", "EngineCoreRequest", "AbortMessage", "UtilityMessage", "FakeRouter",
           "FakePull", "zmq_shim"]


@dataclass(frozen=True, slots=True)
class AddTruth:
    """Ground truth of one ADD: the incarnation, the client and its scripted behaviour."""

    inc: int
    uid: int
    eos_at: int | None
    prompt: str
    fault: str = ""


class _Wire:
    """Frames on the wire (named as the model's messages: the trace and monitors key on it)."""

    __slots__ = ("frames", "truth")

    def __init__(self, frames: tuple[Any, ...], truth: Any) -> None:
        self.frames = frames
        self.truth = truth


class EngineCoreRequest(_Wire):
    """An ADD's frames."""


class AbortMessage(_Wire):
    """An ABORT's frames."""


class UtilityMessage(_Wire):
    """A UTILITY call's frames."""


def _caller_point(kind: str) -> tuple[str, str]:
    """``send:<the vLLM function whose await sends>:<kind>``: the outermost vLLM frame below
    the client, walked up from the socket call (e.g. ``AsyncLLM.abort`` for an abort's ABORT,
    ``output_handler`` for a stop-string ABORT)."""
    frame = sys._getframe(3)
    best = None
    while frame is not None:
        path = frame.f_code.co_filename
        if "/vllm/" not in path:
            break
        if "/vllm/v1/engine/core_client" not in path:
            best = frame
            break
        best = frame
        frame = frame.f_back
    if best is None:
        return f"send:{kind}", ""
    return (f"send:{point_of_frame(best)}:{kind}",
            f"{best.f_code.co_filename}:{best.f_lineno}")


class _Socket:
    """What vLLM asks of a socket besides sending and receiving."""

    closed = False

    def close(self, linger: int | None = None) -> None:
        self.closed = True

    def getsockopt(self, *_a: Any) -> bytes:
        return b"inproc://racesim"

    def getsockopt_string(self, *_a: Any) -> str:
        return "inproc://racesim"

    def setsockopt(self, *_a: Any) -> None:
        pass


class FakeRouter(_Socket):
    """The API server's input ROUTER: eager DONTWAIT sends into one FIFO pipe per engine."""

    def __init__(self, loop: SimLoop, frontend: Any) -> None:
        self.loop = loop
        self.frontend = frontend

    def send_multipart(self, msg: Any, copy: bool = True, track: bool = False,
                       **_kw: Any) -> Any:
        loop = self.loop
        if self.frontend.closed:
            fut = loop.create_future()
            fut.set_result(None)
            return fut
        frames = tuple(bytes(f) if not isinstance(f, bytes) else f for f in msg[1:])
        if self.frontend.starting:  # the server's start-up call, before the run's time 0
            self.frontend.answer_startup(frames)
            fut = loop.create_future()
            fut.set_result(None)
            return fut
        kind, cls, truth = self.frontend.classify(frames)
        point, where = _caller_point(kind)
        loop.seen.setdefault(point, where)
        delay = loop.world.pause(point, 0.0, loop.name)
        fut = loop.create_future()
        if delay <= 0:
            self.frontend.send_wire(cls(frames, truth))
            fut.set_result(_Tracker() if track else None)
            return fut

        def later() -> None:
            self.frontend.send_wire(cls(frames, truth))
            if not fut.done():
                fut.set_result(_Tracker() if track else None)

        loop.call_later(delay, later)
        return fut



class _Tracker:
    """A done ``MessageTracker`` (0.20 tracks sends that carry tensors)."""

    done = True


class FakePull(_Socket):
    """The API server's output PULL: eager receive when a message waits, else a pending
    future the next delivery completes."""

    def __init__(self, loop: SimLoop) -> None:
        self.loop = loop
        self.inbox: deque[list[Any]] = deque()
        self.waiter: Any = None

    def recv_multipart(self, copy: bool = True, **_kw: Any) -> Any:
        fut = self.loop.create_future()
        if self.inbox:
            fut.set_result(self.inbox.popleft())
        else:
            self.waiter = fut
        return fut

    def deliver(self, frames: list[Any]) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            self.waiter = None
            waiter.set_result(frames)
        else:
            self.inbox.append(frames)



class _Shadow:
    """``zmq.Socket.shadow(input_socket)`` for the READY handshake (core_client.py, MPClient):
    the engine's identity with an empty payload, so ``_apply_ready_response`` keeps the
    frontend's config."""

    def __init__(self, engines: list[bytes]) -> None:
        self._ready = deque((e, b"") for e in engines)

    def poll(self, timeout: Any = None) -> int:
        return 1 if self._ready else 0

    def recv_multipart(self, *_a: Any, **_k: Any) -> list[bytes]:
        identity, payload = self._ready.popleft()
        return [identity, payload]


class _Context:
    """No libzmq context, so none of its I/O threads."""

    def __init__(self, *_a: Any, **_k: Any) -> None:
        pass

    def destroy(self, linger: Any = None) -> None:
        pass

    def term(self) -> None:
        pass


def zmq_shim(real: Any) -> Any:
    """The ``zmq`` name core_client.py binds: every name is pyzmq's but ``Context``,
    ``asyncio.Context`` and ``Socket.shadow``."""
    shim = types.ModuleType("zmq")
    shim.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
    shim.Context = _Context  # type: ignore[attr-defined]
    asyncio_ns = types.SimpleNamespace(Context=_Context, Socket=real.asyncio.Socket)
    shim.asyncio = asyncio_ns  # type: ignore[attr-defined]

    class Socket:
        @staticmethod
        def shadow(sock: Any) -> _Shadow:
            return _Shadow([(0).to_bytes(2, "little")])

    shim.Socket = Socket  # type: ignore[attr-defined]
    return shim
