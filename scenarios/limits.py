"""racesim's caps on every size a scenario (or a counterexample's embedded scenario) can ask
for: above a cap the loader refuses the file (exit 2) instead of allocating it.

The model allocates eagerly what vLLM allocates up front (the KV block pool, one list entry per
block, per engine), and every generated token is simulated and traced, so a size is memory and
time. The caps are far above any bundled scenario and sized so that the worst case allowed
stays near 1 GB of memory; docs/limits.md lists them with what each costs.
"""

from __future__ import annotations

from collections.abc import Iterator

from racesim.engine_model.config import Workload

__all__ = ["MAXIMUM", "MAX_REQUESTS", "MAX_TOTAL_BLOCKS", "MAX_TOTAL_PROMPT_TOKENS",
           "MAX_TOTAL_OUTPUT_TOKENS", "MAX_PLAN_ENTRIES", "MAX_SCHEDULE", "MAX_FILE_BYTES",
           "MAX_NAME", "over_limits"]

#: Largest value per key (same key names as the loader's minimums).
MAXIMUM: dict[str, int] = {
    "frontends": 64,
    "engine.num_blocks": 2**20,  # ~60 MB per engine in the model's pool
    "engine.block_size": 2**16,
    "engine.max_num_seqs": 2**16,
    "engine.max_num_batched_tokens": 2**24,
    "engine.data_parallel_size": 32,
    "engine.num_speculative_tokens": 16,  # drafts per step (vLLM sizes buffers by it)
    "engine.pipeline_parallel_size": 16,  # batches in flight (the batch queue's depth)
    "frontend.output_chunk_size": 2**20,
    "request.prompt_tokens": 2**20,
    "request.max_tokens": 2**16,
    "request.n": 256,
    "request.eos_at": 2**16,
    "request.stop_string_at": 2**16,
    "request.disconnect_after_tokens": 2**16,
    "request.input_chunks": 10_000,
    "request.chunk_tokens": 2**20,
}
#: ``[[request]]`` entries in one scenario.
MAX_REQUESTS = 10_000
#: KV blocks over all engines (num_blocks x data-parallel ranks, x 2 for P/D).
MAX_TOTAL_BLOCKS = 2**21
#: prompt tokens over all requests, children and input chunks (vLLM's own classes keep a
#: token list per request on the vllm backend).
MAX_TOTAL_PROMPT_TOKENS = 2**22
#: tokens the scenario can generate over all requests (max_tokens x n x chunks): each is
#: simulated and traced, about 4 KB and 2 ms apiece.
MAX_TOTAL_OUTPUT_TOKENS = 2**18
#: entries in a [delays] or [witness] table.
MAX_PLAN_ENTRIES = 10_000
#: decisions in a counterexample's schedule.
MAX_SCHEDULE = 100_000
#: bytes in a scenario or counterexample file.
MAX_FILE_BYTES = 16 * 2**20
#: characters in a scenario's name: explore and matrix name their files after it (with the
#: policy, strategy, seed and backend), and a file name has at most 255 bytes
MAX_NAME = 100


def over_limits(workload: Workload) -> Iterator[tuple[tuple[object, ...], str, int]]:
    """``(key path, problem, value)`` for each total above its cap (per-key caps are checked
    where each value is read)."""
    engine = workload.engine
    engines = engine.dp_size * (2 if workload.topology == "pd" else 1)
    blocks = engine.num_blocks * engines
    if blocks > MAX_TOTAL_BLOCKS:
        yield (("engine", "num_blocks"), f"makes {blocks} KV blocks over {engines} engines, "
               f"more than racesim's cap of {MAX_TOTAL_BLOCKS} (docs/limits.md)",
               engine.num_blocks)
    prompt = output = 0
    for r in workload.requests:
        copies = r.n * (1 + r.input_chunks)
        later = r.prompt_tokens if r.chunk_tokens is None else r.chunk_tokens
        prompt += r.n * (r.prompt_tokens + later * r.input_chunks)
        output += r.max_tokens * copies
    if prompt > MAX_TOTAL_PROMPT_TOKENS:
        yield (("request",), f"the requests' prompts total {prompt} tokens ((prompt_tokens + "
               f"chunk_tokens x input_chunks) x n), more than racesim's cap of "
               f"{MAX_TOTAL_PROMPT_TOKENS} (docs/limits.md)", prompt)
    if output > MAX_TOTAL_OUTPUT_TOKENS:
        yield (("request",), f"the requests may generate {output} tokens (max_tokens x n x "
               f"chunks), more than racesim's cap of {MAX_TOTAL_OUTPUT_TOKENS} "
               f"(docs/limits.md)", output)
