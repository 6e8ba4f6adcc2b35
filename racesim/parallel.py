"""Run exploration batches in this process, a process pool, or a Dask cluster.

Every run is a pure function of (context, run index), and results are consumed in run order,
so the runs, the first violating run and the counterexample do not depend on the executor.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from racesim.sim import InputError

__all__ = ["ordered_map", "executor", "default_workers", "max_workers", "check_workers"]

R = TypeVar("R")


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def max_workers() -> int:
    """More processes than this only add memory: each run is CPU-bound."""
    return 4 * default_workers()


def check_workers(workers: int | None) -> int:
    """The worker count to use, or an InputError for one that is not sane."""
    n = default_workers() if workers is None else workers
    if n < 1:
        raise InputError(f"--workers must be >= 1, got {n}")
    if n > max_workers():
        raise InputError(f"--workers {n}: at most {max_workers()} on this machine "
                         f"(4 per core, {default_workers()} cores); runs are CPU-bound")
    return n


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _init_worker(parent: int) -> None:
    """Workers leave Ctrl-C to the parent, which stops cleanly and keeps what was found; and
    they die with the parent, however it ends (SIGKILL, SIGTERM), rather than run on alone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not _pdeathsig():
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                         name="racesim-parent-watch").start()
    if os.getppid() != parent:  # the parent died before the watch was set up
        os._exit(1)


def _pdeathsig() -> bool:
    """Ask Linux to send this process SIGTERM when its parent dies; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    """Where prctl is missing: poll, once a second, whether the parent is still ours."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


@contextmanager
def executor(workers: int | None, dask: str | None) -> Iterator[Executor | None]:
    """None means: run in this process."""
    if dask:
        try:
            from distributed import Client
        except ImportError:
            raise InputError("--dask needs the optional extra: pip install 'racesim[dask]'") \
                from None
        try:
            client = Client(dask, timeout=10)
        except Exception as exc:  # unreachable scheduler, bad address: the user's input
            raise InputError(f"--dask {dask!r}: cannot connect ({type(exc).__name__}: {exc})") \
                from None
        try:
            yield client.get_executor()
        finally:
            client.close()
        return
    n = check_workers(workers)
    if n == 1:
        yield None
        return
    pool = ProcessPoolExecutor(max_workers=n, initializer=_init_worker,
                               initargs=(os.getpid(),))
    try:
        yield pool
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def ordered_map(fn: Callable[[Any, Sequence[int]], list[R]], context: Any, runs: Sequence[int],
                ex: Executor | None, *, batch: int = 16, window: int = 8) -> Iterator[R]:
    """Yield ``fn(context, batch)`` results run by run, in order, ``window`` batches ahead."""
    # Lazily: a huge budget bounded by --time-limit must not build every batch up front.
    batches = (list(runs[i:i + batch]) for i in range(0, len(runs), batch))
    if ex is None:
        for b in batches:
            yield from fn(context, b)
        return
    pending: list[Any] = []
    it = iter(batches)
    for b in itertools.islice(it, window):
        pending.append(ex.submit(fn, context, b))
    while pending:
        fut = pending.pop(0)
        nxt = next(it, None)
        if nxt is not None:
            pending.append(ex.submit(fn, context, nxt))
        yield from fut.result()

