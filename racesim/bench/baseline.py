"""The bench's yardsticks, measured without racesim: bare simpy's speed on a model-free workload,
and how much two processes can run at once on this machine right now."""

from __future__ import annotations

import time

__all__ = ["bare_simpy", "parallel_capacity"]


def bare_simpy(pairs: int, rounds: int) -> tuple[int, float]:
    """``(env steps, wall seconds)`` of a model-free workload: ``pairs`` senders that each yield
    ``rounds`` timeouts and after each one trigger the event their receiver waits on."""
    import simpy

    env = simpy.Environment()
    waiting: list[simpy.Event | None] = [None] * pairs

    def sender(i: int, delay: float):  # type: ignore[no-untyped-def]
        for _ in range(rounds):
            yield env.timeout(delay)
            ev = waiting[i]
            if ev is not None and not ev.triggered:
                ev.succeed(i)

    def receiver(i: int):  # type: ignore[no-untyped-def]
        while True:
            ev = waiting[i] = env.event()
            yield ev

    for i in range(pairs):
        env.process(sender(i, 0.001 * (1 + i % 7)))
        env.process(receiver(i))
    step, peek, horizon = env.step, env.peek, 1e12
    steps = 0
    started = time.perf_counter()
    while peek() <= horizon:  # the loop of racesim.engine_model.system.run_workload
        step()
        steps += 1
    return steps, time.perf_counter() - started


def _burn(n: int) -> float:
    started = time.perf_counter()
    x = 0
    for i in range(n):
        x += i
    return time.perf_counter() - started


def parallel_capacity(n: int) -> tuple[float, float]:
    """``(alone, both)``: seconds of one pure-Python burn in this process, and of two burns in
    two processes at once. ``2 * alone / both`` is the physical limit ``parallel_speedup`` can
    reach right now (2.0 on two idle cores, less when other processes hold a core)."""
    from concurrent.futures import ProcessPoolExecutor

    alone = _burn(n)
    with ProcessPoolExecutor(max_workers=2) as pool:
        list(pool.map(_burn, [n // 10, n // 10]))  # workers up before the clock starts
        started = time.perf_counter()
        list(pool.map(_burn, [n, n]))
        both = time.perf_counter() - started
    return alone, both
