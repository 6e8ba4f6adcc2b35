"""Running ``racesim corpus --release R --json`` in release R's own virtual environment, and
reading its answer without trusting it.

The child is another program (whatever ``DIR/<release>/bin/python`` is), so everything about
it is bounded here: it starts isolated (``python -I``: nothing from the current folder or from
``PYTHON*`` variables is imported, so a ``rich.py`` where the user typed the command never
runs), it dies with this process (Linux's ``PR_SET_PDEATHSIG``, else the child would run on
alone after a SIGKILL of corpus), its stdout is capped (:data:`MAX_OUTPUT` bytes) and its
run time is bounded when ``--time-limit`` is given, and its document is checked field by
field before anything is merged. Every failure is one line (:class:`ReleaseFailed`).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["MAX_OUTPUT", "STARTUP_S", "ReleaseFailed", "BadOutput", "run_release",
           "parse_answer", "ROLE_FIELDS"]

#: the most bytes read from a release's stdout (a corpus document is a few KB per entry)
MAX_OUTPUT = 16 * 1024 * 1024
#: the most bytes of its stderr kept (only the last line is shown)
MAX_STDERR = 64 * 1024
#: seconds a release gets beyond its explorations' --time-limit: starting Python and
#: importing vLLM and torch (115-150 s measured on a loaded 2-core machine), and shrinking
STARTUP_S = 300.0

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class ReleaseFailed(Exception):
    """The release's process could not run or did not finish: skip the release (one line)."""


class BadOutput(ReleaseFailed):
    """The release's process finished but printed something that is not a corpus document:
    that venv is not what it claims (one line; the corpus command exits 2)."""


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: SIGKILL when the parent dies (kept across exec), and go
    now if the parent already has."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL),
                                                    0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(1)


def _drain(stream: Any, box: bytearray, cap: int, keep_tail: bool, over: threading.Event) -> None:
    """Read ``stream`` to its end, keeping at most ``cap`` bytes (the first ones, or with
    ``keep_tail`` the last ones); set ``over`` when more came."""
    while True:
        chunk = stream.read(65536)
        if not chunk:
            return
        box += chunk
        if len(box) > cap:
            over.set()
            if keep_tail:
                del box[:len(box) - cap]
            else:
                del box[cap:]
                return  # stop reading: the caller kills the child


def run_release(python: Path, args: Sequence[str], *, deadline_s: float | None,
                env: dict[str, str] | None = None, max_output: int = MAX_OUTPUT) -> str:
    """Run ``python -I -m racesim ARGS``; its stdout as text. Raises ReleaseFailed (one line)
    when it cannot start, runs past ``deadline_s`` (then it is killed), exits non-zero, or
    prints more than ``max_output`` bytes or bytes that are not UTF-8."""
    if not os.access(python, os.X_OK) or not python.is_file():
        raise ReleaseFailed(f"{python} is not an executable file")
    argv = [str(python), "-I", "-m", "racesim", *args]
    parent = os.getpid()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env,
                                preexec_fn=lambda: _die_with_parent(parent))
    except (OSError, subprocess.SubprocessError) as exc:
        raise ReleaseFailed(f"{python} could not start: {exc}") from None
    out, err = bytearray(), bytearray()
    too_much, _ = threading.Event(), threading.Event()
    readers = [threading.Thread(target=_drain, args=(proc.stdout, out, max_output, False,
                                                     too_much), daemon=True),
               threading.Thread(target=_drain, args=(proc.stderr, err, MAX_STDERR, True, _),
                                daemon=True)]
    for t in readers:
        t.start()
    started = time.monotonic()
    try:
        while proc.poll() is None:
            if too_much.is_set():
                proc.kill()
                proc.wait()
                raise BadOutput(f"{python} printed more than {max_output} bytes on stdout "
                                f"(a corpus document is far smaller)")
            if deadline_s is not None and time.monotonic() - started > deadline_s:
                proc.kill()
                proc.wait()
                raise ReleaseFailed(f"{python} was still running after {deadline_s:g} s "
                                    f"(its explorations' --time-limit, plus time to start "
                                    f"and import vLLM); killed")
            time.sleep(0.05)
    except BaseException:  # Ctrl-C included: the child goes with us
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise
    for t in readers:
        t.join(5.0)
    if too_much.is_set():
        raise BadOutput(f"{python} printed more than {max_output} bytes on stdout "
                        f"(a corpus document is far smaller)")
    if proc.returncode != 0:
        text = err.decode("utf-8", "replace").strip().splitlines()
        why = text[-1] if text else (f"killed by signal {-proc.returncode}"
                                     if proc.returncode < 0 else f"exit {proc.returncode}")
        raise ReleaseFailed(f"{python} failed: {why}")
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadOutput(f"{python} printed bytes that are not UTF-8 (at byte {exc.start})") \
            from None


#: what each field of a role's cell may hold, as a release's process reports it
ROLE_FIELDS: dict[str, tuple[type, ...]] = {
    "release": (str,), "status": (str,), "reason": (str,), "profile": (str,),
    "policy": (str,), "policy_options": (dict,), "runs": (int,), "violating_runs": (int,),
    "first_find_run": (int, type(None)), "first_find_s": (int, float, type(None)),
    "elapsed_s": (int, float), "invariants": (list,), "found": (bool,),
    "counterexample": (str, type(None)), "violations": (list,), "error": (str, type(None)),
    "model": (dict,), "target": (str,),
}
_STATUSES = {"found", "not found", "clean", "not clean", "interrupted", "skipped", "not run",
             "open"}


def _check_cell(cell: Any, where: str, depth: int = 0) -> dict[str, Any]:
    if not isinstance(cell, dict):
        raise BadOutput(f"{where}: expected an object, got {type(cell).__name__}")
    out: dict[str, Any] = {}
    for key, value in cell.items():
        kinds = ROLE_FIELDS.get(key)
        if kinds is None:
            continue  # a newer release's field: not merged
        if isinstance(value, bool) and bool not in kinds:
            raise BadOutput(f"{where}.{key}: expected {kinds[0].__name__}, got a boolean")
        if not isinstance(value, kinds):
            raise BadOutput(f"{where}.{key}: expected {kinds[0].__name__}, "
                            f"got {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise BadOutput(f"{where}.{key}: not a finite number")
        if key == "status" and value not in _STATUSES:
            raise BadOutput(f"{where}.status: unknown status {value[:40]!r}")
        if key in ("invariants", "violations") and not all(
                isinstance(v, str if key == "invariants" else dict) for v in value):
            raise BadOutput(f"{where}.{key}: a list of the wrong items")
        if key == "model":
            if depth:
                raise BadOutput(f"{where}.model: nested too deep")
            value = _check_cell(value, f"{where}.model", depth + 1)
        out[key] = value
    return out


def parse_answer(text: str, roles: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """A release's corpus document, checked: entry name -> role -> that role's cell. Raises
    BadOutput (one line) on anything else."""
    # vLLM before 0.33 may print a log line on stdout while it imports (0.20.0: "Failed to
    # import Triton kernels"): the document is the JSON object from the first line "{" on
    start = 0 if text.startswith("{") else text.find("\n{\n") + 1
    try:
        doc = json.loads(text[start:])
    except (json.JSONDecodeError, RecursionError, ValueError):
        raise BadOutput("did not print a JSON document") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise BadOutput("printed JSON that is not a corpus document (no 'entries' list)")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for i, entry in enumerate(doc["entries"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise BadOutput(f"entries[{i}]: expected an object with a 'name'")
        out[entry["name"]] = {role: _check_cell(entry.get(role, {}), f"entries[{i}].{role}")
                              for role in roles}
    return out
