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
from concurrent.futures import TimeoutError as FuturesTimeout
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


#: How long to wait for a Dask scheduler to answer and for a worker to join, when there is no
#: --time-limit (with one: that limit, up to this).
DASK_WAIT = 30.0


def _dask_client(address: str, wait: float) -> Any:
    """A connected Dask client with at least one worker, or an InputError within ``wait``
    seconds (plus a second's grace): an address that is not a Dask scheduler can accept the
    connection and never answer, so the connection is made in a thread that is left behind."""
    try:
        from distributed import Client
    except ImportError:
        raise InputError("--dask needs the optional extra: pip install 'racesim[dask]'") \
            from None
    box: dict[str, Any] = {}

    def connect() -> None:
        try:
            box["client"] = Client(address, timeout=wait, set_as_default=False)
        except BaseException as exc:  # unreachable scheduler, bad address: the user's input
            box["error"] = exc

    thread = threading.Thread(target=connect, daemon=True, name="racesim-dask-connect")
    thread.start()
    thread.join(wait + 1.0)
    if thread.is_alive():
        raise InputError(f"--dask {address!r}: no Dask scheduler answered within {wait:g} s "
                         f"(is it a scheduler's address, such as tcp://HOST:8786?)")
    if "error" in box:
        exc = box["error"]
        raise InputError(f"--dask {address!r}: cannot connect ({type(exc).__name__}: {exc})")
    client = box["client"]
    try:
        client.wait_for_workers(1, timeout=wait)
    except Exception:
        client.close()
        raise InputError(f"--dask {address!r}: the scheduler has no workers (waited {wait:g} s);"
                         f" start one with 'dask worker {address}'") from None
    return client


@contextmanager
def executor(workers: int | None, dask: str | None,
             time_limit: float | None = None) -> Iterator[Executor | None]:
    """None means: run in this process. With ``dask``, connecting and finding a worker take
    at most ``time_limit`` (at most ``DASK_WAIT``) seconds."""
    if dask:
        client = _dask_client(dask, min(time_limit, DASK_WAIT) if time_limit else DASK_WAIT)
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
                ex: Executor | None, *, batch: int = 16, window: int = 8,
                deadline: float | None = None) -> Iterator[R]:
    """Yield ``fn(context, batch)`` results run by run, in order, ``window`` batches ahead.

    ``deadline`` (a ``time.monotonic()`` value): a batch not back by then (plus a grace of
    ``DASK_WAIT``, for one batch's own runs) ends the iteration instead of waiting forever on
    a cluster whose workers left."""
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
        timeout = None if deadline is None else \
            max(0.0, deadline - time.monotonic()) + DASK_WAIT
        try:
            results = fut.result(timeout=timeout)
        except FuturesTimeout:
            for f in pending:
                f.cancel()
            return
        yield from results

