"""The Mooncake worker's two asyncio loops, as World tasks on the World's clock.

vLLM runs each of P's sender loop and D's receiver loop on its own thread (``_async_loop``,
mooncake_connector.py:1342-1362) and reaches it from the engine thread with
``asyncio.run_coroutine_threadsafe`` (``start_load_kv``, :2718-2729; ``get_finished``,
:2355-2371, which blocks on the future's ``result()``). Here each is a
:class:`racesim.engine_vllm.frontend.loop.SimLoop` (no threads, FIFO ready order, ``time()`` is
the World's): a submission from the engine thread runs on the loop at once, before the engine
thread goes on (the loop's thread takes it at the same instant; ``get_finished`` needs its
future done), and the executor that ``send_kv_to_decode`` hands ``_send_blocks`` to
(``run_in_executor``, :1738) is a World task that takes ``[pd] transfer_time`` at the
``pd.kv:push`` await point before the simulated ``batch_transfer_sync_write`` returns.
"""

from __future__ import annotations

from asyncio import events
from collections.abc import Callable, Generator
from typing import Any

import simpy

from racesim.engine_vllm.frontend.loop import SimLoop
from racesim.sim.world import World

__all__ = ["MooncakeLoop", "finish_loops"]

#: the loops of the run in progress, closed when it ends (engine_vllm/system.py), and what
#: else to undo then
_LIVE: list[MooncakeLoop] = []
AFTER_RUN: list[Callable[[], None]] = []


class MooncakeLoop(SimLoop):
    """One Mooncake worker's asyncio loop; ``after`` runs after each pass over ready work."""

    def __init__(self, world: World, name: str, transfer_time: float,
                 after: Callable[[], None]) -> None:
        super().__init__(world, name)
        self.transfer_time = transfer_time
        self._after = after
        self._depth = 0
        # a run whose runner did not call finish_loops (another entry point): close its loops
        for old in [loop for loop in _LIVE if loop.world is not world]:
            _LIVE.remove(old)
            old.finish()
        _LIVE.append(self)

    def call_soon_threadsafe(self, callback: Any, *args: Any, context: Any = None) -> Any:
        handle = super().call_soon_threadsafe(callback, *args, context=context)
        if events._get_running_loop() is not self:  # from the engine thread: runs now
            self.run_ready()
        return handle

    def run_ready(self) -> None:
        self._depth += 1
        try:
            super().run_ready()
        finally:
            self._depth -= 1
        if self._depth == 0:
            self._after()

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> Any:
        """``_sender_executor``'s thread: ``func`` (``_send_blocks``) returns when the
        write's simulated time has passed."""
        fut = self.create_future()
        self._env.process(self._executor(fut, func, args))
        return fut

    def _executor(self, fut: Any, func: Callable[..., Any],
                  args: tuple[Any, ...]) -> Generator[simpy.Event, Any, None]:
        ev = self.world.sleep("pd.kv:push", self.transfer_time, self.name)
        if ev is not None:
            yield ev
        if fut.cancelled():
            return
        try:
            fut.set_result(func(*args))
        except Exception as exc:  # delivered to send_kv_to_decode, as a thread's would be
            fut.set_exception(exc)


def finish_loops() -> None:
    """After a run: close every coroutine still suspended on a Mooncake loop (vLLM's listener
    and sender tasks wait for ever) while its loop is open."""
    while _LIVE:
        _LIVE.pop().finish()
    while AFTER_RUN:
        AFTER_RUN.pop()()
