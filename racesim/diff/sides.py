"""A side of a diff (baseline or candidate): a worker process on one backend, and its calls.

The worker is ``python -I -m racesim.diff.worker`` (see worker.py): isolated from
``PYTHONPATH``, the user site and the current folder, killed when this process dies
(``PR_SET_PDEATHSIG`` on Linux), each answer capped in size and each call in time. Its stderr
goes to a temporary file, of which the last lines name what went wrong.
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any

from racesim.diff.worker import HEADER, read_frame
from racesim.runner.backend import Backend
from racesim.sim import InputError

__all__ = ["Side", "SideError", "MAX_ANSWER"]

#: an answer over this is a broken worker, not a result (a budget of 10k runs answers < 5 MB)
MAX_ANSWER = 64 << 20
_STDERR_TAIL = 2000


class SideError(RuntimeError):
    """A worker died, timed out or failed in racesim's own code."""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


class Side:
    """``name`` ("baseline" or "candidate") running ``backend`` in its own process."""

    def __init__(self, name: str, backend: Backend, time_limit: float) -> None:
        self.name, self.backend, self.time_limit = name, backend, time_limit
        self._err = tempfile.TemporaryFile()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pending = False

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-m", "racesim.diff.worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._err, preexec_fn=_die_with_parent)
        self.send({"op": "init", "backend": self.backend})

    def send(self, request: dict[str, Any]) -> None:
        """Send one request (the answer is read by :meth:`receive`)."""
        assert self._proc is not None and self._proc.stdin is not None and not self._pending
        body = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._proc.stdin.write(HEADER.pack(len(body)) + body)
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise SideError(self._died("died")) from None
        self._pending = True

    def receive(self) -> dict[str, Any]:
        """The answer to the last request, within the time limit, or SideError."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None and self._pending
        timer = threading.Timer(self.time_limit, proc.kill)
        timer.daemon = True
        timer.start()
        try:
            body = read_frame(proc.stdout, MAX_ANSWER)
        except ValueError as exc:
            proc.kill()
            raise SideError(f"the {self.name} worker ({self.backend.label}): {exc}") from None
        finally:
            timer.cancel()
            self._pending = False
        if body is None:
            proc.wait()
            why = f"took over {self.time_limit:g} s" if proc.returncode == -signal.SIGKILL \
                else f"died (exit {proc.returncode})"
            raise SideError(self._died(why))
        answer: dict[str, Any] = json.loads(body)
        if not answer.get("ok"):
            if answer.get("input_error"):
                raise InputError(f"{self.name} ({self.backend.label}): {answer['error']}")
            raise SideError(f"the {self.name} worker ({self.backend.label}) failed: "
                            f"{answer.get('error')}\n{answer.get('traceback', '')}")
        return answer

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        self.send(request)
        return self.receive()

    def _died(self, why: str) -> str:
        self._err.seek(0, os.SEEK_END)
        size = self._err.tell()
        self._err.seek(max(0, size - _STDERR_TAIL))
        tail = self._err.read().decode("utf-8", "replace").strip().splitlines()[-6:]
        return (f"the {self.name} worker ({self.backend.label}) {why}"
                + (": " + " | ".join(tail) if tail else ""))

    def close(self) -> None:
        proc = self._proc
        if proc is not None:
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self._err.close()
        self._proc = None

    def __enter__(self) -> Side:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None and self._proc is not None:
            self._proc.kill()
        self.close()
