"""A deterministic asyncio event loop whose clock is the World's simpy clock.

vLLM's ``AsyncLLM`` is asyncio code; here it runs on :class:`SimLoop`, a ``BaseEventLoop`` with
no selector, no self-pipe and no threads. Its ``time()`` is ``env.now``. One simpy process (the
*kernel*, :meth:`SimLoop.kernel`) runs the loop's ready handles at each instant, in asyncio's own
FIFO order, batch by batch as ``BaseEventLoop._run_once`` does (timers due now join the ready
queue before each batch), and then sleeps until the loop's next timer or until something outside
the loop (a socket delivery, an executor completion) makes a handle ready. Exploration never
reorders the ready queue: asyncio's FIFO order is what a real loop runs for the same arrivals
(research/asyncio.md, "Risks" 1); its choices are arrival times.

What the loop pins (research/asyncio.md, "Determinism hazards"):

- ``run_in_executor`` (vLLM's ``make_async``, ``asyncio.to_thread``) runs the function inline,
  at the await point ``exec:<function>`` (live: a thread pool's completion time is free);
- ``asyncio.sleep(0)`` passes the await point ``yield:<vLLM function>:sleep(0)`` (yield width:
  it gives the loop up, and may resume late when other ready work holds the loop);
- task names are per loop; garbage collection is off for a run (the frontend's ``run``).
"""

from __future__ import annotations

import asyncio
import heapq
import sys
import types
from asyncio import events, futures, tasks
from collections.abc import Callable, Generator
from typing import Any

import simpy

from racesim.sim.world import World

__all__ = ["SimLoop", "point_of_frame"]

_VLLM_MARK = "/vllm/"


def point_of_frame(frame: Any) -> str:
    """``<vLLM module>.<function>``: an await point's name is keyed by vLLM's function (and
    its await expression), never by a line number, which moves between releases."""
    code = frame.f_code
    path = code.co_filename
    i = path.rfind(_VLLM_MARK)
    module = path[i + len(_VLLM_MARK):] if i >= 0 else path.rsplit("/", 1)[-1]
    module = module[:-3] if module.endswith(".py") else module
    name = code.co_qualname.replace(".<locals>", "")
    return f"{module.replace('/', '.')}.{name}"


class SimLoop(asyncio.BaseEventLoop):
    """An event loop run by a simpy process: virtual time, FIFO ready order, no I/O."""

    def __init__(self, world: World, name: str) -> None:
        super().__init__()
        self.world = world
        self.name = name
        self._env = world.env
        self._wakeup: simpy.Event | None = None
        self._tasks = 0
        #: (point -> source line) of every await point passed, for ``list points``
        self.seen: dict[str, str] = {}
        #: exceptions asyncio would log (a task failing with nobody awaiting it)
        self.errors: list[str] = []
        self.all: list[asyncio.Task[Any]] = []
        self.set_exception_handler(self._on_error)

    # -- the clock and the wake-up --------------------------------------------------------------

    def time(self) -> float:
        return float(self._env._now)

    def _kick(self) -> None:
        ev = self._wakeup
        if ev is not None and not ev.triggered:
            ev.succeed()

    def _call_soon(self, callback: Any, args: Any, context: Any) -> Any:
        handle = super()._call_soon(callback, args, context)  # type: ignore[misc]
        if self._wakeup is not None:
            self._kick()
        return handle

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> Any:
        timer = super().call_at(when, callback, *args, context=context)
        if self._wakeup is not None:
            self._kick()
        return timer

    def _process_events(self, event_list: Any) -> None:
        pass

    def _write_to_self(self) -> None:
        # call_soon_threadsafe (vLLM's cancel_task_threadsafe, RequestOutputCollector.close)
        # needs no pipe: there is no other thread
        pass

    def _on_error(self, loop: Any, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        text = context.get("message", "")
        if exc is not None:
            text = f"{text}: {type(exc).__name__}: {exc}"
        self.errors.append(text)

    # -- tasks and executors --------------------------------------------------------------------

    def create_task(self, coro: Any, *, name: str | None = None, context: Any = None) -> Any:
        self._tasks += 1
        qual = getattr(coro, "__qualname__", "task").replace(".<locals>", "")
        task = tasks.Task(coro, loop=self, name=name or f"T{self._tasks}:{qual}",
                          context=context)
        # a task pending when the run ends is dropped with the loop, not reported
        task._log_destroy_pending = False  # type: ignore[attr-defined]
        self.all.append(task)
        return task

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> Any:
        """The function runs inline at ``exec:<function>``'s delay (no thread)."""
        fut = self.create_future()
        point = f"exec:{getattr(func, '__qualname__', 'call')}"
        self.seen.setdefault(point, "")
        delay = self.world.pause(point, 0.0, self.name)

        def done(_ev: Any) -> None:
            if fut.cancelled():
                return
            try:
                fut.set_result(func(*args))
            except BaseException as exc:  # delivered to the awaiting coroutine
                fut.set_exception(exc)

        self._env.timeout(delay).callbacks.append(done)
        return fut

    # -- the kernel -----------------------------------------------------------------------------

    def run_ready(self) -> None:
        """Run every handle ready now, batch by batch as ``_run_once`` does."""
        ready = self._ready  # type: ignore[attr-defined]
        scheduled = self._scheduled  # type: ignore[attr-defined]
        old = events._get_running_loop()
        events._set_running_loop(self)
        hooks = sys.get_asyncgen_hooks()
        sys.set_asyncgen_hooks(firstiter=self._asyncgen_firstiter_hook,  # type: ignore[attr-defined]
                               finalizer=self._asyncgen_finalizer_hook)  # type: ignore[attr-defined]
        try:
            while True:
                now = self.time()
                while scheduled and scheduled[0]._when <= now:
                    timer = heapq.heappop(scheduled)
                    timer._scheduled = False
                    if not timer._cancelled:
                        ready.append(timer)
                if not ready:
                    return
                for _ in range(len(ready)):
                    handle = ready.popleft()
                    if not handle._cancelled:
                        handle._run()
        finally:
            sys.set_asyncgen_hooks(*hooks)
            events._set_running_loop(old)

    def _next_timer(self) -> float | None:
        scheduled = self._scheduled  # type: ignore[attr-defined]
        while scheduled and scheduled[0]._cancelled:
            heapq.heappop(scheduled)._scheduled = False
        return scheduled[0]._when if scheduled else None

    def kernel(self) -> Generator[simpy.Event, Any, None]:
        """The simpy process that runs this loop: the ready handles at each instant, then a
        wait for the next timer or an outside wake-up."""
        env = self._env
        while True:
            self.run_ready()
            when = self._next_timer()
            self._wakeup = env.event()
            if when is None:
                yield self._wakeup
            else:
                yield self._wakeup | env.timeout(max(0.0, when - float(env._now)))
            self._wakeup = None

    def start(self) -> None:
        self._env.process(self.kernel())

    def finish(self) -> None:
        """End of a run: close every coroutine still suspended, now, while the loop is open
        (left to the garbage collector, they would run their cleanup later, in another run's
        time), then drop what is left. The caller has silenced the frontend first."""
        self._wakeup = None
        old = events._get_running_loop()
        events._set_running_loop(self)
        try:
            for task in self.all:
                if not task.done():
                    coro = task.get_coro()
                    try:
                        coro.close()
                    except BaseException:  # a coroutine that cannot close cleanly: dropped
                        pass
        finally:
            events._set_running_loop(old)
        self._ready.clear()  # type: ignore[attr-defined]
        self._scheduled.clear()  # type: ignore[attr-defined]
        self.all.clear()


@types.coroutine
def _sleep0() -> Generator[Any, Any, None]:
    """``asyncio.sleep(0)``'s bare yield, as an await point on a SimLoop: ``yield:`` then the
    vLLM function that slept. A delay makes the task resume that much later."""
    loop = events._get_running_loop()
    if isinstance(loop, SimLoop):
        frame = sys._getframe(2)  # _sleep0 <- asyncio.sleep <- the sleeping coroutine
        point = f"yield:{point_of_frame(frame)}:sleep(0)"
        loop.seen.setdefault(point, f"{frame.f_code.co_filename}:{frame.f_lineno}")
        delay = loop.world.pause(point, 0.0, loop.name)
        if delay > 0:
            fut = loop.create_future()
            loop.call_later(delay, futures._set_result_unless_cancelled, fut, None)
            yield from fut.__await__()
            return
    yield


def install_sleep0() -> None:
    """``asyncio.sleep`` looks ``__sleep0`` up in its module on every call (tasks.py)."""
    setattr(tasks, "__sleep0", _sleep0)
