"""What stands in for the native and I/O parts under vLLM 0.33's own MooncakeConnector worker
(``kv_connector/v1/mooncake/mooncake_connector.py``): no racesim imports, standard library only.

- :class:`TransferEngine`: ``mooncake.engine.TransferEngine`` (a native RDMA/TCP engine):
  ``initialize``, ``get_rpc_port``, ``batch_register_memory`` / ``batch_unregister_memory``
  (they keep the registered regions) and ``batch_transfer_sync_write``, which tells ``on_write``
  what would be copied (the time it takes is the executor task's, engine_vllm/connectors/
  mooncake.py);
- :class:`ZmqContext`, :class:`Router`, :class:`Dealer`: ``zmq.asyncio``'s context and the
  ROUTER (P's ``_mooncake_sender_listener``, :1505-1540) and DEALER (D's
  ``receive_kv_from_single_worker``, :2443-2452) sockets, whose frames go where ``send_frames``
  puts them (a World channel) and arrive by :meth:`Router.arrive` / :meth:`Dealer.arrive`;
- :class:`Httpx`: the module ``huggingface_hub.utils.httpx`` as the connector sees it, whose
  ``AsyncClient`` hands ``/register`` and ``/query`` to a route (vLLM's own
  ``MooncakeBootstrapServer`` handlers, reached over a World channel from D);
- :class:`Secrets`: ``secrets`` with a seeded ``randbits`` (the KV layout ID, :2081).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["TransferEngine", "ZmqContext", "Router", "Dealer", "Httpx", "Secrets"]


class TransferEngine:
    """``mooncake.engine.TransferEngine``: memory registration kept, writes reported."""

    def __init__(self, rpc_port: int,
                 on_write: Callable[[str, list[int], list[int], list[int]], int]) -> None:
        self.rpc_port = rpc_port
        self.regions: dict[int, int] = {}
        self._on_write = on_write

    def initialize(self, hostname: str, metadata: str, protocol: str, device: str) -> int:
        return 0

    def get_rpc_port(self) -> int:
        return self.rpc_port

    def batch_register_memory(self, ptrs: list[int], lens: list[int]) -> int:
        self.regions.update(zip(ptrs, lens))
        return 0

    def batch_unregister_memory(self, ptrs: list[int]) -> int:
        for p in ptrs:
            self.regions.pop(p, None)
        return 0

    def batch_transfer_sync_write(self, session: str, src: list[int], dst: list[int],
                                  lengths: list[int]) -> int:
        return self._on_write(session, list(src), list(dst), list(lengths))


class Secrets:
    """``secrets`` for one call of ``register_kv_caches``: ``randbits`` from a seeded stream."""

    def __init__(self, randbits: Callable[[int], int]) -> None:
        self.randbits = randbits


class _Socket:
    """What both socket kinds share: frames in, awaited in arrival order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._inbox: deque[Any] = deque()
        self._waiters: deque[asyncio.Future[Any]] = deque()
        self.closed = False

    def arrive(self, frames: Any) -> None:
        if self.closed:
            return  # ZMQ drops what reaches a closed socket
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(frames)
                return
        self._inbox.append(frames)

    async def _recv(self) -> Any:
        if self._inbox:
            return self._inbox.popleft()
        fut = self._loop.create_future()
        self._waiters.append(fut)
        return await fut

    def setsockopt(self, option: int, value: Any) -> None:
        pass

    def close(self, linger: int | None = None) -> None:
        self.closed = True

    def __enter__(self) -> _Socket:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Router(_Socket):
    """P's ROUTER: ``recv_multipart`` gives ``[identity, bytes]``; ``send_multipart`` sends
    ``(identity, bytes)`` back to the DEALER that identity names."""

    def __init__(self, loop: asyncio.AbstractEventLoop, port: int,
                 send: Callable[[bytes, bytes], None]) -> None:
        super().__init__(loop)
        self.port = port
        self._send = send

    def bind_to_random_port(self, addr: str, *args: Any, **kwargs: Any) -> int:
        return self.port

    async def recv_multipart(self) -> list[bytes]:
        return list(await self._recv())

    async def send_multipart(self, frames: Any) -> None:
        identity, data = frames
        self._send(bytes(identity), bytes(data))


class Dealer(_Socket):
    """D's DEALER to one P worker: ``send`` reaches P's ROUTER with this socket's identity."""

    def __init__(self, loop: asyncio.AbstractEventLoop, identity: bytes, addr: str,
                 send: Callable[[Dealer, bytes], None]) -> None:
        super().__init__(loop)
        self.identity = identity
        self.addr = addr
        self._send = send

    async def send(self, data: bytes) -> None:
        self._send(self, bytes(data))

    async def recv(self) -> bytes:
        return bytes(await self._recv())


class ZmqContext:
    """``zmq.asyncio.Context``: ``socket(ROUTER)`` gives P's :class:`Router`; ``dealer`` is
    what the connector's ``make_zmq_socket`` call (:2443) gets."""

    def __init__(self, router: Callable[[], Router], dealer: Callable[[str], Dealer]) -> None:
        self._router = router
        self.dealer = dealer

    def socket(self, kind: int) -> Router:
        return self._router()

    def term(self) -> None:
        pass


def make_zmq_socket(real: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's ``make_zmq_socket`` as the connector module sees it: a :class:`ZmqContext`'s
    DEALER, anything else to vLLM's own function."""

    def make(ctx: Any, path: str, socket_type: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(ctx, ZmqContext):
            return ctx.dealer(path)
        return real(ctx, path, socket_type, *args, **kwargs)

    return make


#: An HTTP route: (method, path, JSON body) -> (status, JSON reply), awaited.
Route = Callable[[str, str, Any], Awaitable[tuple[int, Any]]]


class _Response:
    def __init__(self, status: int, body: Any) -> None:
        self.status_code = status
        self.text = json.dumps(body)
        self._body = body

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"HTTP {self.status_code}: {self.text}")

    def json(self) -> Any:
        return json.loads(self.text)


class Httpx:
    """``huggingface_hub.utils.httpx`` for the connector module: ``AsyncClient`` reaches the
    routes in :attr:`routes` (``"http://host:port"`` -> :data:`Route`), every other name is the
    real module's (its exception classes)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.routes: dict[str, Route] = {}
        fake = self

        class AsyncClient:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                pass

            async def __aenter__(self) -> AsyncClient:
                return self

            async def __aexit__(self, *exc: Any) -> None:
                return None

            async def post(self, url: str, json: Any = None) -> _Response:
                return await fake._call("POST", url, json)

            async def get(self, url: str) -> _Response:
                return await fake._call("GET", url, None)

        self.AsyncClient = AsyncClient

    async def _call(self, method: str, url: str, body: Any) -> _Response:
        base, _, path = url.partition("://")[2].partition("/")
        route = self.routes.get(f"http://{base}")
        if route is None:
            raise self._real.ConnectError(f"no route to {url}")
        status, reply = await route(method, "/" + path, body)
        return _Response(status, reply)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)
