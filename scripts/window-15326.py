"""Measure how often a scenario's runs reach #15326's window on a backend: an ABORT of X was
issued after the frontend popped X (incarnation A), and an ADD of X for a later incarnation B
reached the Scheduler before that ABORT did. Usage:
python scripts/window-15326.py SCENARIO POLICY REACH BUDGET [ENGINE [VLLM]]
(ENGINE vllm runs vLLM's own frontend; RACESIM_VLLM_FRONTEND=model the model's). Prints runs,
runs that reached the window, and the first such run's schedule."""

from __future__ import annotations

import sys
import time

from racesim.engine_model.versions import get_profile
from racesim.runner import RunSpec
from racesim.scenarios import load_scenario
from racesim.sim.strategies import StrategyConfig, make_strategy


def reached(trace) -> bool:
    """After the frontend popped X (incarnation A) in an abort or on a stop string, an ADD of X for another
    incarnation enters the frontend's pipe before that abort's ABORT does (one FIFO pipe per
    connection: it reaches the engine first)."""
    popped: dict[str, int] = {}  # rid -> the incarnation an abort popped, its ABORT not sent
    for ev in trace:
        d = ev.detail
        if ev.kind == "fe.pop" and getattr(d, "why", "") in ("abort", "stop-string"):
            popped[ev.request] = ev.inc
        elif ev.kind == "ipc.send" and ev.component.startswith("ipc:frontend"):
            if d.type == "AbortMessage":
                for rid in d.ids:
                    popped.pop(rid, None)
            elif d.type == "EngineCoreRequest":
                for rid in d.ids:
                    if rid in popped and popped[rid] not in (d.incs or ()):
                        return True
    return False


def main() -> None:
    name, policy, reach, budget = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    engine = sys.argv[5] if len(sys.argv) > 5 else "vllm"
    sc = load_scenario(name)
    if len(sys.argv) > 6:  # a vLLM profile (0.20): the installed release's
        sc = sc.with_vllm(sys.argv[6])
    spec = RunSpec.of(sc, policy, engine=engine)
    base = spec.run()
    occ = base.occurrences
    if reach == "live":
        prof = get_profile(sc.vllm)
        occ = {p: n for p, n in occ.items() if prof.width(p) != "latent"}
    strat = make_strategy("random", StrategyConfig(occurrences=occ,
                                                   scale=sc.workload.engine.step_time, seed=0))
    hits, first, started = 0, None, time.monotonic()
    for i in range(budget):
        r = base if i == 0 else spec.run(decider=strat.decider(i))
        if reached(r.trace):
            hits += 1
            if first is None:
                first = (i, r.schedule, r.violated, r.reach().reach)
    took = time.monotonic() - started
    print(f"{name} {policy} reach={reach} runs={budget} window_reached={hits} "
          f"({took:.1f}s, {budget / took:.1f} runs/s)")
    print(f"first: {first}")


if __name__ == "__main__":
    main()
