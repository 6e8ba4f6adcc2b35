"""Which model runner the vllm backend steps on a release (no vLLM import), and the user's
request for racesim's model of it.

The request is read once, where the backend is resolved (``racesim.runner.backend``), from the
environment variable ``RACESIM_VLLM_RUNNER``: unset (the default: vLLM's own runner where it
runs) or ``model`` (racesim's model of the runner, the fake executor 0.9.2 steps: for testing a
frontend change without vLLM's runner in every step; conform and corpus keep vLLM's runner).
"""

from __future__ import annotations

__all__ = ["ENV", "CHOICES", "runner_kind", "requested", "RUNNER_NOTE", "MODEL_REASON"]

ENV = "RACESIM_VLLM_RUNNER"
CHOICES = ("model",)
#: why the model's runner ran where vLLM's would (provenance, the bench)
MODEL_REASON = f"{ENV}=model"

RUNNER_NOTE = {
    "vllm-v1-cpu-runner": "vLLM's own V1 CPUModelRunner (no weights; the GPU default on 0.33 is "
                          "Model Runner V2, config/vllm.py:731-760, which needs Triton and is "
                          "not run)",
    "model-fake-runner": "racesim's model of the runner (fake executor)",
}


def requested() -> str | None:
    """The runner the user asked for: None (the default) or "model"."""
    from racesim.engine_vllm.support import env_choice

    return env_choice(ENV, CHOICES, "vLLM's own runner where it runs")


def runner_kind(key: tuple[int, ...], wanted: str | None = None) -> str:
    """vLLM's V1 CPUModelRunner from 0.10 on (0.33 picks V1 on CPU, cpu_worker.py:148-164);
    0.9.2 steps the model's fake runner (its runner was never probed: racesim did not import
    there, ../shared/research/runner.md), and so does every release when ``wanted`` is
    "model" (``RACESIM_VLLM_RUNNER=model``)."""
    if wanted == "model":
        return "model-fake-runner"
    return "vllm-v1-cpu-runner" if key >= (0, 10) else "model-fake-runner"
