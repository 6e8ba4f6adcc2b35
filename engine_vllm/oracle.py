"""vLLM's own exceptions as the oracle: where in vLLM's code an exception was raised.

An exception or failed assert raised by vLLM's code during a vllm-backend run kills
EngineCoreProc (vllm/v1/engine/core.py, ``run_engine_core``: any exception escaping the busy
loop is logged and ENGINE_DEAD is sent). Its violation names the innermost frame of the
traceback that lies inside the vllm package, as a path relative to that package with its line
(``v1/core/sched/async_scheduler.py:53``), and the message. Both depend only on the installed
release's files, never on the process (no absolute paths, no object ids), so the trace hash
stays the same in every process on one release.
"""

from __future__ import annotations

import linecache
import os
from dataclasses import dataclass
from functools import cache
from types import TracebackType

__all__ = ["VllmRaise", "vllm_raise", "raised_by_racesim", "StandInGap"]


class StandInGap(AttributeError):
    """vLLM's code read an attribute racesim's stand-in for one of its objects (the facade
    ``EngineCoreProc``, the executor) does not have: a path racesim does not feed, so a racesim
    gap, never vLLM's verdict. An AttributeError, so vLLM's own ``hasattr`` / ``getattr(...,
    default)`` on the stand-in still work. (One message argument: simpy re-raises an
    exception from a process by its class and args.)"""

    @classmethod
    def of(cls, owner: str, name: str) -> StandInGap:
        return cls(f"racesim's stand-in for vLLM's {owner} has no {name!r}: a path racesim "
                   f"does not feed (engine_vllm/engine/stepper.py)")


@dataclass(frozen=True, slots=True)
class VllmRaise:
    """An exception raised inside vLLM: its message and vLLM's ``file:line`` (or None when no
    frame of the traceback is in the vllm package)."""

    message: str
    where: str | None


@cache
def _vllm_root() -> str:
    import vllm

    return os.path.dirname(os.path.abspath(vllm.__file__)) + os.sep


def _innermost_vllm_frame(tb: TracebackType | None) -> tuple[str, int] | None:
    root = _vllm_root()
    found = None
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename.startswith(root):
            found = (filename, tb.tb_lineno)
        tb = tb.tb_next
    return found


def vllm_raise(exc: BaseException) -> VllmRaise:
    """What ``exc`` says and where in vLLM it was raised. A bare ``assert`` has no message:
    the asserted source line stands in for it, as a traceback would show it."""
    frame = _innermost_vllm_frame(exc.__traceback__)
    text = str(exc)
    if frame is None:
        return VllmRaise(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, None)
    filename, line = frame
    if not text:
        text = linecache.getline(filename, line).strip()
    rel = filename[len(_vllm_root()):].replace(os.sep, "/")
    return VllmRaise(f"{type(exc).__name__}: {text}" if text else type(exc).__name__,
                     f"{rel}:{line}")


def raised_by_racesim(exc: BaseException) -> bool:
    """Whether racesim's own code raised ``exc``: of the traceback's frames that are vLLM's or
    racesim's, the innermost is racesim's. vLLM's code calls back into racesim (the wrappers
    around the Scheduler, the executor), so a racesim bug there must not pass for vLLM's."""
    if isinstance(exc, StandInGap):
        return True
    root = _vllm_root()
    last = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_filename.startswith(root):
            last = "vllm"
        elif str(frame.f_globals.get("__name__", "")).startswith("racesim."):
            last = "racesim"
        tb = tb.tb_next
    return last == "racesim"
