"""Where a vllm-backend run's time goes: vLLM's own code or racesim's harness, by sampling.

A profiling timer (``setitimer(ITIMER_PROF)``: the process's CPU time, so other processes on the
machine do not move the figure) interrupts the explore every ``INTERVAL`` seconds of CPU; its
signal handler, which Python runs in the main thread at the next bytecode boundary, gives the
sample to the innermost frame that is either vLLM's (its module is ``vllm`` or under it) or
racesim's (under ``racesim``). Frames of any other library (torch, numpy, asyncio, simpy,
msgspec, the standard library) belong to whoever called them, and a C call (a torch kernel)
ends before the handler runs, in its Python caller's frame. Not always at once: CPython checks
for a pending signal at a call's end, a loop's back edge and a function's entry, not after an
operator (a tensor's ``a[idx]`` or ``a + b`` is C work with no call in the bytecode), so a sample
taken during such work is handled at the entry of the next Python function called, with none of
that function's code run: a sample whose frame stands at its ``RESUME`` (its entry, or a
generator's re-entry) is its caller's. (Without that, vLLM's tensor work before it calls a
racesim stand-in, the model's ``compute_logits`` or the sampler seam, was racesim's.) So torch
work that vLLM's model runner asks for is vLLM's time, and a racesim stand-in that vLLM calls
(the fake sockets, the virtual clock, the runner's shims) is the harness's, as is asyncio running
vLLM's tasks on racesim's loop (a real server's event loop is not vLLM's code either). A sample
with neither on the stack is the harness's (the explore driver is racesim's).

The share is statistical: ``harness_share`` is the fraction of samples that are the harness's,
with its standard error ``sqrt(p (1 - p) / samples)``. Compiled (mypyc) racesim functions have
no frames: their time goes to the nearest Python caller (the bench reports ``build`` beside it).
Without ``setitimer`` (Windows) or off the main thread the share is None.

``areas`` splits each side further by module (vLLM: ``v1.worker`` the model runner, ``v1.core``
the scheduler and KV cache, ``v1.engine`` AsyncLLM and the OutputProcessor, ``v1.sample`` the
sampler; racesim: ``sim``, ``engine_model``, ``engine_vllm.frontend``, ``engine_vllm.engine``,
``engine_vllm.runner``, ...), as fractions of all samples.
"""

from __future__ import annotations

import dis
import math
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

__all__ = ["sample_share", "INTERVAL"]

#: CPU seconds between two samples asked for (the kernel's timer tick may space them wider:
#: ``interval_s`` in the answer is the measured one)
INTERVAL = 0.001

_VLLM_AREAS = ("v1.worker", "v1.core", "v1.engine", "v1.sample")
_RACESIM_AREAS = ("engine_vllm.frontend", "engine_vllm.engine", "engine_vllm.runner",
                  "engine_vllm", "engine_model", "sim", "explore", "runner")


#: the opcode a function's code starts (and a generator's resumes) with: CPython 3.11+
_RESUME = dis.opmap.get("RESUME")


def _area(frame: Any) -> str:
    """``vllm:<area>`` or ``racesim:<area>`` of the innermost frame that is one of theirs,
    frames that have not started to run their own code left to their callers."""
    while (frame is not None and _RESUME is not None and frame.f_lasti >= 0
           and frame.f_code.co_code[frame.f_lasti] == _RESUME):
        frame = frame.f_back
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name == "vllm" or name.startswith("vllm."):
            rest = name[5:]
            return "vllm:" + next((a for a in _VLLM_AREAS if rest.startswith(a)), "other")
        if name.startswith("racesim."):
            rest = name[8:]
            return "racesim:" + next((a for a in _RACESIM_AREAS if rest.startswith(a)),
                                     "other")
        frame = frame.f_back
    return "racesim:other"


def sample_share(work: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
    """``work()``'s result, and where its time went (the module docstring)."""
    counts: Counter[str] = Counter()
    can = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not can:
        return work(), {"harness_share": None, "harness_share_stderr": None, "samples": 0,
                        "cpu_s": None, "interval_s": None, "areas": {}}

    def on_tick(_signum: int, frame: Any) -> None:
        counts[_area(frame)] += 1

    saved = signal.signal(signal.SIGPROF, on_tick)
    cpu = time.process_time()
    signal.setitimer(signal.ITIMER_PROF, INTERVAL, INTERVAL)
    try:
        result = work()
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0.0, 0.0)
        signal.signal(signal.SIGPROF, saved)
    cpu = time.process_time() - cpu
    total = sum(counts.values())
    harness = sum(n for k, n in counts.items() if k.startswith("racesim:"))
    p = harness / total if total else None
    return result, {
        "harness_share": None if p is None else round(p, 3),
        "harness_share_stderr": None if p is None else round(math.sqrt(p * (1 - p) / total), 3),
        "samples": total, "cpu_s": round(cpu, 3),
        "interval_s": round(cpu / total, 4) if total else None,
        "areas": {k: round(n / total, 3) for k, n in sorted(counts.items(),
                                                           key=lambda kv: (-kv[1], kv[0]))}}
