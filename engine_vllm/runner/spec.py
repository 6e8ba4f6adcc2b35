"""Speculative decoding on vLLM's own model runner: what runs as vLLM's code and the one seam.

With ``[engine] num_speculative_tokens = k`` the engine's ``VllmConfig`` carries vLLM's own
``SpeculativeConfig`` (method ``ngram_gpu``, racesim.engine_vllm._vllm), so vLLM's Scheduler
schedules k draft tokens per decode (``scheduled_spec_decode_tokens``; under async scheduling
-1 placeholders and ``num_output_placeholders += 1 + k``, 0.20.0 async_scheduler.py:18-35) and
takes back the rejected ones in ``update_from_output`` (0.20.0 scheduler.py:1367-1390). The
runner is built with that config: its drafter (``NgramProposerGPU``), its draft bookkeeping
(``_draft_token_ids``, ``prev_num_draft_tokens``, the async input ids of the drafts, the
``valid_sampled_token_count`` of each row) and its spec-decode metadata are vLLM's.

Two things make the drafter run on this CPU machine, neither bookkeeping:

- ``NgramGPUKernel`` is a ``@support_torch_compile`` module compiled with Inductor and Triton
  options the CPU build lacks (0.20.0 v1/spec_decode/ngram_proposer_gpu.py:26, 221-235): vLLM's
  own ``ignore_torch_compile`` (compilation/decorators.py:55-71) makes it run eagerly, the same
  torch code;
- the runner asks for two pinned buffers for it with ``pin_memory=True`` (0.20.0
  gpu_model_runner.py:549-554, 0.33.0 :636-639) and 0.33's drafter pins a copy each step
  (ngram_proposer_gpu.py:551), which only an accelerator can give: while the runner is built
  and steps, pinning is a no-op (the memory is the same CPU memory, unpinned).

The network's part is the rejection sampler (``runner.rejection_sampler``, called by
``_sample``): :class:`Verifier` answers for each row with the tokens a greedy target would
give (a token of the fake vocabulary per position, as the plain sampler seam does) and accepts
the drafts that equal them, up to a count the run draws (``accept(n)`` -> 0..n, from the
World's seeded ``spec-accept`` stream): how many drafts a real model accepts is the network's
decision. The output is what ``rejection_sample`` returns: accepted drafts, then the first
target token not accepted (or the bonus token), -1 after (v1/sample/rejection_sampler.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["eager_drafter", "no_pinned_memory", "gpu_bookkeeping", "Verifier"]


def eager_drafter() -> None:
    """``NgramGPUKernel`` uncompiled, through vLLM's own ``ignore_torch_compile``."""
    from vllm.compilation.decorators import ignore_torch_compile
    from vllm.v1.spec_decode.ngram_proposer_gpu import NgramGPUKernel

    ignore_torch_compile(NgramGPUKernel)


@contextlib.contextmanager
def no_pinned_memory() -> Iterator[None]:
    """``torch.zeros``/``torch.empty`` ignore ``pin_memory=True`` and ``Tensor.pin_memory()``
    is the tensor itself (no pinned allocator here)."""
    import torch

    saved = torch.zeros, torch.empty

    def unpinned(fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            kwargs.pop("pin_memory", None)
            return fn(*args, **kwargs)
        return call

    pin = torch.Tensor.pin_memory
    torch.zeros, torch.empty = unpinned(saved[0]), unpinned(saved[1])
    torch.Tensor.pin_memory = lambda self, *a, **k: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.zeros, torch.empty = saved
        torch.Tensor.pin_memory = pin  # type: ignore[method-assign]


def gpu_bookkeeping(runner: Any) -> None:
    """The GPU runner's async draft bookkeeping on the CPU runner.

    The drafter's copy streams and events, built as the CPU runner's placeholders (0.20
    gpu_model_runner.py:821-849), become the no-op stream of racesim.engine_vllm.runner.shims.
    0.20's ``CPUModelRunner._copy_valid_sampled_token_count`` (cpu_model_runner.py:184-194)
    drops what the GPU runner's keeps for async spec decoding, ``valid_sampled_token_count_gpu``
    (gpu_model_runner.py:4489-4491), from which ``_prepare_inputs`` corrects the optimistic
    ``num_computed_tokens`` of rows whose drafts were rejected (:1952-1972): the bugs this
    feature is for live on GPUs, so the GPU runner's method runs (0.33's CPU runner has no
    such override)."""
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from racesim.engine_vllm.runner import shims

    for name, value in list(vars(runner).items()):
        if type(value).__name__ in ("_StreamPlaceholder", "_EventPlaceholder"):
            setattr(runner, name, shims.STREAM)
    name = "_copy_valid_sampled_token_count"
    if name in vars(CPUModelRunner):
        setattr(runner, name, getattr(GPUModelRunner, name).__get__(runner))


class Verifier:
    """``runner.rejection_sampler``: greedy verification by the fake network.

    ``target(row, flat)`` is the token the network samples after the model input at flattened
    batch index ``flat`` of batch row ``row`` (the plain sampler seam's answer);
    ``accept(n)`` how many of a row's n drafts the network accepts at most."""

    def __init__(self, begin: Any, target: Any, accept: Any) -> None:
        self.begin = begin
        self.target = target
        self.accept = accept
        from vllm.v1.outputs import SamplerOutput

        self._out = SamplerOutput
        #: (row's drafts, drafts accepted) of every row verified, in order: what tests read
        self.verified: list[tuple[int, int]] = []

    def __call__(self, metadata: Any, draft_probs: Any = None, logits: Any = None,
                 sampling_metadata: Any = None, *args: Any, **kwargs: Any) -> Any:
        import torch

        self.begin()
        counts = list(metadata.num_draft_tokens)
        width = metadata.max_spec_len + 1
        flat = metadata.logits_indices.tolist()
        drafts = metadata.draft_token_ids.tolist()
        rows: list[list[int]] = []
        at = 0  # the row's first logits index
        d = 0  # the row's first draft
        for row, n in enumerate(counts):
            limit = self.accept(n) if n else 0
            out: list[int] = []
            for j in range(n + 1):
                token = self.target(row, flat[at + j])
                if j < n and j < limit and drafts[d + j] == token:
                    out.append(token)  # accepted: the draft is what the target samples
                    continue
                out.append(token)  # the first target token not accepted, or the bonus
                break
            if n:
                self.verified.append((n, len(out) - 1))
            rows.append(out + [-1] * (width - len(out)))
            at += n + 1
            d += n
        sampled = torch.tensor(rows, dtype=torch.int32).reshape(len(counts), width)
        return self._out(sampled_token_ids=sampled, logprobs_tensors=None)
