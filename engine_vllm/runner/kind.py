"""Which model runner the vllm backend steps on a release (no vLLM import)."""

from __future__ import annotations

__all__ = ["runner_kind", "RUNNER_NOTE"]

RUNNER_NOTE = {
    "vllm-v1-cpu-runner": "vLLM's own V1 CPUModelRunner (no weights; the GPU default on 0.33 is "
                          "Model Runner V2, config/vllm.py:731-760, which needs Triton and is "
                          "not run)",
    "model-fake-runner": "racesim's model of the runner (fake executor)",
}


def runner_kind(key: tuple[int, ...]) -> str:
    """vLLM's V1 CPUModelRunner from 0.10 on (0.33 picks V1 on CPU, cpu_worker.py:148-164);
    0.9.2 steps the model's fake runner (its runner was never probed: racesim did not import
    there, ../shared/research/runner.md)."""
    return "vllm-v1-cpu-runner" if key >= (0, 10) else "model-fake-runner"
