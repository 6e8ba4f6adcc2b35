"""Measure #30142's window on the installed release's own AsyncScheduler: under KV pressure a
request is preempted while its decode step (1 + k placeholders) is in flight, and that step's
output drains later. Usage:
python scripts/placeholders-30142.py DEPTH K RUNS
DEPTH: batches in flight (2 is what vLLM runs under async scheduling without pipeline
parallelism, uniproc_executor.py / multiproc_executor.py ``max_concurrent_batches``; 3 needs a
deeper batch queue). K: drafts a step, from vLLM's own SpeculativeConfig (``eagle`` with the tiny
model's config as the draft before 0.20, which has no ``ngram_gpu``; racesim's ``ngram_gpu``
from 0.20). Prints runs, underflows (vLLM's own AssertionError, file:line), preemptions of a
request whose step was in flight, drafts scheduled and requests finished.

vLLM's code here: SpeculativeConfig, Scheduler/AsyncScheduler (schedule, preemption,
placeholders, the rejection adjustment in update_from_output). Ours: the engine loop (the order
of ``step_with_batch_queue``: schedule, queue, drain the oldest once DEPTH are queued) and the
network (a step samples once it reaches the request's known tokens; each draft row accepts a
uniform 0..k of its drafts; token values from 1024 up)."""

from __future__ import annotations

import random
import sys
import traceback
from importlib import resources
from typing import Any

from racesim.engine_vllm import _api, _vllm

REQUESTS = (("A", 0, 32), ("B", 1, 20), ("C", 2, 20))  # id, first step it may arrive, prompt


def _eagle_config(k: int, mc: Any) -> Any:
    """What ``--speculative-config '{"method": "eagle", "model": DRAFT,
    "num_speculative_tokens": k}'`` builds; the draft's weights are never loaded (the
    scheduler reads num_speculative_tokens and use_eagle: 0.14 scheduler.py:203-210)."""
    from vllm.config import ParallelConfig, SpeculativeConfig

    draft = str(resources.files("racesim.engine_vllm") / "tiny_model")
    return SpeculativeConfig(method="eagle", model=draft, num_speculative_tokens=k,
                             target_model_config=mc, target_parallel_config=ParallelConfig())


def _scheduler(k: int) -> Any:
    import vllm

    if _api.release_key(vllm.__version__) < (0, 20) and k:
        # 0.14 runs async scheduling with EAGLE/MTP drafts only (config/vllm.py:570-577)
        _vllm._speculative_config = _eagle_config
    shape = _vllm.VllmEngineShape(num_blocks=6, block_size=16, max_num_seqs=16,
                                  max_num_batched_tokens=256, max_model_len=256,
                                  async_scheduling=True, prefix_caching=True,
                                  num_speculative_tokens=k)
    return _vllm.new_scheduler(shape)


def one_run(seed: int, depth: int, k: int) -> dict[str, int]:
    _api.select_cpu_platform()  # before any vLLM import resolves the platform
    from vllm.v1.outputs import ModelRunnerOutput

    rng = random.Random(seed)
    s = _scheduler(k)
    todo = list(REQUESTS)
    queue: list[tuple[Any, dict[str, bool]]] = []  # oldest first
    out = dict(preempt_inflight=0, drafts=0, finished=0)
    tok = 1024
    for step in range(1000):
        while todo and todo[0][1] <= step and rng.random() < 0.5:
            rid, _, n = todo.pop(0)
            s.add_request(_vllm.new_request(rid, list(range(3, 3 + n)), 48, 0, 0.0, 16, []))
        if not todo and not s.has_requests() and not queue:
            break
        so = s.schedule()
        inflight = {r for q, _ in queue for r in q.num_scheduled_tokens}
        out["preempt_inflight"] += len(set(so.preempted_req_ids or ()) & inflight)
        if so.total_num_scheduled_tokens:
            samples = {rid: s.requests[rid].num_computed_tokens >= s.requests[rid].num_tokens
                       for rid in so.num_scheduled_tokens}
            queue.append((so, samples))
            if len(queue) < depth:
                continue
        if not queue:
            continue
        so, samples = queue.pop(0)
        ids = sorted(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            n_drafts = len(so.scheduled_spec_decode_tokens.get(rid, ()))
            n = rng.randint(0, n_drafts) + 1 if samples[rid] else 0
            sampled.append(list(range(tok, tok + n)))
            tok += n
        out["drafts"] += sum(len(d) for d in so.scheduled_spec_decode_tokens.values())
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled, logprobs=None,
                                prompt_logprobs_dict={}, pooler_output=[])
        outs = s.update_from_output(so, mro)
        out["finished"] += sum(o.finish_reason is not None
                               for eco in outs.values() for o in eco.outputs)
    return out


def measure(depth: int, k: int, runs: int) -> dict[str, Any]:
    total: dict[str, Any] = dict(runs=runs, underflows=[], preempt_inflight=0, drafts=0,
                                 finished=0)
    for seed in range(runs):
        try:
            got = one_run(seed, depth, k)
        except AssertionError:
            frame = traceback.extract_tb(sys.exc_info()[2])[-1]
            where = frame.filename.split("site-packages/")[-1]
            total["underflows"].append(f"seed {seed}: {where}:{frame.lineno}: {frame.line}")
            continue
        for key, val in got.items():
            total[key] += val
    return total


if __name__ == "__main__":
    try:
        d, kk, n = (int(a) for a in sys.argv[1:4])
    except ValueError:
        print("usage: placeholders-30142.py DEPTH K RUNS (three integers)", file=sys.stderr)
        sys.exit(2)
    t = measure(d, kk, n)
    print(f"depth={d} k={kk} runs={n} underflows={len(t['underflows'])} "
          f"preemptions-with-step-in-flight={t['preempt_inflight']} drafts={t['drafts']} "
          f"finished={t['finished']}")
    if t["underflows"]:
        print("first:", t["underflows"][0])
