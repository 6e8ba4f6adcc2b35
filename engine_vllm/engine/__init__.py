"""vLLM's engine core in the World: the engine-side shell around vLLM's Scheduler and KV cache
manager (core.py), its finishes (finishes.py), read-only views of vLLM's state (views.py) and
streaming-input sessions (sessions.py)."""
