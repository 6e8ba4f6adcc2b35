"""vLLM's own model runner on the vllm backend (:class:`RealRunner`), built without weights."""

from racesim.engine_vllm.runner.real import RealRunner

__all__ = ["RealRunner"]
