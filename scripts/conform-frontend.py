"""Compare the frontend under --engine vllm (vLLM's engine classes in both) on every bundled
scenario vLLM's own frontend runs: the model's AsyncLLM over vLLM's OutputProcessor against
vLLM's own AsyncLLM (RACESIM_VLLM_FRONTEND=asyncllm). Run 0 (no delay) per scenario and
policy; prints the verdicts and client outcomes that differ. Usage:
python scripts/conform-frontend.py [POLICY...]"""

from __future__ import annotations

import os
import sys

from racesim.runner import run_scenario
from racesim.runner.engines import cannot_run
from racesim.scenarios import bundled_names, load_scenario
from racesim.sim.errors import InputError


def main() -> None:
    policies = sys.argv[1:] or ["buggy", "internal-id"]
    from racesim.engine_vllm.frontend.system import unsupported

    for name in bundled_names():
        sc = load_scenario(name)
        if cannot_run(sc.workload, "vllm"):
            continue
        why = unsupported(sc.workload)
        if why is not None:
            print(f"{name}: real frontend does not run {why}")
            continue
        for policy in policies:
            out = []
            for mode in ("model", "asyncllm"):
                os.environ["RACESIM_VLLM_FRONTEND"] = mode
                try:
                    r = run_scenario(sc, policy, engine="vllm")
                    out.append((r.violated, tuple((q.id, q.tokens, q.finish_reason)
                                                  for q in r.requests)))
                except InputError as exc:
                    out.append((f"refused: {exc}", ()))
            same = "same" if out[0] == out[1] else "DIFFERS"
            print(f"{name} {policy}: {same} model-frontend={out[0][0]} vllm-frontend={out[1][0]}")
            if out[0] != out[1] and out[0][1] != out[1][1]:
                diff = [(a, b) for a, b in zip(out[0][1], out[1][1]) if a != b]
                print(f"    outcomes differ: {diff[:4]}")


if __name__ == "__main__":
    main()
