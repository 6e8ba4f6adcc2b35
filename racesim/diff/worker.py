"""One side of ``racesim diff``: a child process that runs scenarios on one vLLM tree.

vLLM can be imported once per process, and a baseline and a candidate run different trees, so
each side is its own process: ``python -I -m racesim.diff.worker`` (isolated: no
``PYTHONPATH``, no user site, not the current folder first). It reads requests from stdin and
answers on the stdout it was started with; anything vLLM or torch prints goes to stderr, so it
cannot corrupt an answer.

Framing: 8 bytes big-endian length, then the body. Requests are pickles from the parent (which
made this process); answers are JSON, so the parent never unpickles what a vLLM tree's code
could have shaped.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["main", "HEADER", "read_frame"]

HEADER = struct.Struct(">Q")


def read_frame(stream: BinaryIO, limit: int) -> bytes | None:
    """One frame's body, or None at end of stream; over ``limit`` bytes is an error."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (size,) = HEADER.unpack(head)
    if size > limit:
        raise ValueError(f"a frame of {size} bytes, over the {limit}-byte cap")
    body = stream.read(size)
    if len(body) < size:
        return None
    return body


def _summary(spec: Any, result: Any) -> dict[str, Any]:
    from racesim.reports.verdict import verdict

    reaches: dict[str, str] = {}
    for v in result.violations:  # an invariant broken twice: live if either is
        r = result.reach(v).reach
        reaches[v.invariant] = "live" if "live" in (r, reaches.get(v.invariant)) else r
    return {"violated": list(result.violated), "reaches": reaches,
            "reach": result.reach().reach if result.violations else None,
            "verdict": verdict(result.violated),
            "trace_hash": result.trace_hash}


def _explore(req: dict[str, Any]) -> dict[str, Any]:
    """Explore as ``racesim explore`` does (same seeds, strategy, budget and reach), keeping
    every violating run's schedule: the parent replays them on the other side."""
    from racesim.engine_model.versions import get_profile, reach_of
    from racesim.explore import explore

    spec = req["spec"]
    profile = get_profile(spec.scenario.vllm)
    fixed = [(p, d) for p, _k, d in spec.scenario.delays]
    runs: list[dict[str, Any]] = []

    def on_run(s: Any) -> None:
        if s.violated:
            widened = frozenset(s.widened)
            reach = reach_of(profile, [*fixed, *((d.point, d.delay) for d in s.schedule
                                                 if (d.point, d.occurrence) not in widened)])
            runs.append({"run": s.run, "violated": list(s.violated), "reach": reach.reach,
                         "schedule": [list(d) for d in s.schedule]})

    res = explore(spec.scenario, spec.policy, options=spec.option_dict, strategy=req["strategy"],
                  budget=req["budget"], time_limit=req.get("time_limit"), seed=spec.seed,
                  workers=1, skip=spec.skip, shrink_runs=0, reach=req["reach"],
                  engine=spec.backend, on_run=on_run)
    return {"runs": res.runs, "violating": runs, "stopped_early": res.stopped_early,
            "warnings": list(res.warnings)}


def _replay(req: dict[str, Any]) -> dict[str, Any]:
    spec = req["spec"]
    out = []
    for scenario, schedule in req["items"]:
        s = spec if scenario is None else spec.with_scenario(scenario)
        r = s.run(schedule=tuple(schedule), retain_trace=False)
        out.append(_summary(s, r))
    return {"results": out}


def _record(req: dict[str, Any]) -> dict[str, Any]:
    """Run a schedule in full and write its counterexample file (this side's backend)."""
    from racesim.documents import Counterexample, violation_dicts, write_counterexample

    spec = req["spec"]
    r = spec.run(schedule=tuple(req["schedule"]))
    backend = spec.backend
    cx = Counterexample(spec.scenario, spec.policy, spec.option_dict, spec.seed, r.schedule,
                        spec.skip, tuple(violation_dicts(r)), r.trace_hash,
                        req.get("shrunk_from"), req.get("found_by") or {},
                        r.reach().reach if r.violations else None, engine=backend.engine,
                        vllm_release=backend.release or "",
                        vllm_tree=backend.tree_record(),
                        frontend=r.frontend if backend.is_vllm else "", runner=r.runner)
    path = write_counterexample(Path(req["path"]), cx)
    return {"path": str(path), **_summary(spec, r)}


def _init(req: dict[str, Any]) -> dict[str, Any]:
    backend = req["backend"]
    backend.activate()
    if backend.is_vllm:
        import vllm

        return {"vllm_file": vllm.__file__, "version": vllm.__version__}
    return {}


_OPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "init": _init, "explore": _explore, "replay": _replay, "record": _record}


def main() -> None:
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # vLLM's and torch's prints go to stderr, never into an answer
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    while True:
        body = read_frame(requests, 1 << 30)
        if body is None:
            return
        req = pickle.loads(body)
        try:
            answer = {"ok": True, **_OPS[req["op"]](req)}
        except Exception as exc:  # an InputError is the user's; anything else with its frames
            from racesim.sim import InputError

            answer = {"ok": False, "input_error": isinstance(exc, InputError),
                      "error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                      "traceback": "" if isinstance(exc, InputError)
                      else traceback.format_exc(limit=-8)}
        data = json.dumps(answer).encode()
        answers.write(HEADER.pack(len(data)) + data)
        answers.flush()


if __name__ == "__main__":
    main()
