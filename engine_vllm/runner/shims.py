"""What vLLM's model runner needs to be built and stepped on this CPU machine without weights.

Each shim replaces a piece of hardware or of the network, never bookkeeping:

- CUDA events and streams are no-ops (:func:`no_cuda`): the runner builds a
  ``prepare_inputs_event`` and, under async scheduling, ``AsyncGPUModelRunnerOutput`` records
  one (0.33 gpu_model_runner.py:269-316, 0.20 :227-272); the CPU runner's own placeholders
  (cpu_model_runner.py:141-161) lack ``record(stream)`` and ``torch.cuda.Event``;
- the slot mapping is computed in numpy where vLLM launches a Triton kernel (0.20
  block_table.py:141-163, 0.33 :153-178): ``block_table[req, pos // bs] * bs + pos % bs``;
- a ``numba`` stub before the runner is imported on 0.14 and older (only the ngram proposer
  uses it; gpu_model_runner.py:153 imports it at module level; numba is not installed);
- the distributed state of one rank (``_update_states`` reads ``get_pp_group()``), as vLLM's
  own runner tests set it up, once per process.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import types
from typing import Any

__all__ = ["STREAM", "no_cuda", "stub_numba", "init_distributed", "cpu_slot_mapping",
           "NumpyView"]


class _Event:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, *args: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, *args: Any) -> None:
        pass

    def query(self) -> bool:
        return True


class _Stream(_Event):
    def wait_stream(self, *args: Any) -> None:
        pass

    def wait_event(self, *args: Any) -> None:
        pass


STREAM = _Stream()


class _NoCuda:
    """The context of :func:`no_cuda` (a class: entered twice per engine step, where a
    generator-based context manager costs several times more)."""

    __slots__ = ("_saved",)
    _torch: Any = None

    def __enter__(self) -> None:
        torch = _NoCuda._torch
        if torch is None:
            import torch

            _NoCuda._torch = torch
        cuda = torch.cuda
        self._saved = (torch.Event, cuda.Event, cuda.Stream, cuda.current_stream,
                       cuda.default_stream, cuda.stream)
        torch.Event = cuda.Event = _Event
        cuda.Stream = _Stream
        cuda.current_stream = cuda.default_stream = _current_stream
        cuda.stream = _stream

    def __exit__(self, *exc: Any) -> None:
        torch = _NoCuda._torch
        cuda = torch.cuda
        (torch.Event, cuda.Event, cuda.Stream, cuda.current_stream, cuda.default_stream,
         cuda.stream) = self._saved


def _current_stream(*args: Any, **kwargs: Any) -> _Stream:
    return STREAM


def _stream(*args: Any, **kwargs: Any) -> contextlib.nullcontext[None]:
    return contextlib.nullcontext()


def no_cuda() -> _NoCuda:
    """CUDA events and streams as no-ops while the runner is built or steps (no GPU here)."""
    return _NoCuda()


def stub_numba() -> None:
    """A ``numba`` module whose ``jit``/``njit`` are identity decorators (0.14 and older import
    it with the ngram proposer, which racesim never runs)."""
    if "numba" in sys.modules:
        return
    try:
        import numba  # noqa: F401
        return
    except ImportError:
        pass

    def jit(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return lambda fn: fn

    mod = types.ModuleType("numba")
    mod.jit = mod.njit = jit  # type: ignore[attr-defined]
    mod.prange = range  # type: ignore[attr-defined]
    mod.get_num_threads = lambda: 1  # type: ignore[attr-defined]
    mod.set_num_threads = lambda n: None  # type: ignore[attr-defined]
    sys.modules["numba"] = mod


def init_distributed(vc: Any) -> None:
    """World size 1, rank 0, gloo (what vLLM's runner tests do); once per process."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return
    # One intra-op thread: the runner's tensors are a few hundred elements, and explore forks
    # its workers from this process (an OpenMP pool used before fork hangs the child)
    torch.set_num_threads(1)
    with set_current_vllm_config(vc):
        # the rendezvous file is named and removed by torch; nothing of it reaches a trace
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo",
            distributed_init_method=f"file://{tempfile.mktemp(prefix='racesim-')}")
        parallel_state.ensure_model_parallel_initialized(1, 1)


class NumpyView:
    """The numpy view of a CPU tensor, made again only when the tensor object changes (vLLM
    allocates its buffers once and reuses them)."""

    __slots__ = ("_tensor", "_array")

    def __init__(self) -> None:
        self._tensor: Any = None
        self._array: Any = None

    def of(self, tensor: Any) -> Any:
        if tensor is not self._tensor:
            self._tensor, self._array = tensor, tensor.numpy()
        return self._array


#: up to this many tokens a step's slot mapping is computed in Python, row by row (a decode
#: step's one token per request); past it numpy's vectorised arithmetic is cheaper
FEW_TOKENS = 16


def cpu_slot_mapping(block_table: Any) -> Any:
    """``BlockTable.compute_slot_mapping`` for one block table, on the CPU tensors' numpy views:
    the kernel's arithmetic ``block_table[row, pos // bs] * bs + pos % bs`` for each scheduled
    token of each row, then -1 past the batch's tokens (a few small arrays, for which numpy's
    per-call cost, or for a few tokens Python's, is a fraction of torch's)."""
    import numpy as np

    bs = block_table.block_size
    # numpy views of the table's two buffers (allocated once by BlockTable) and the row
    # numbers 0..max_num_reqs-1
    table_view, out_view = NumpyView(), NumpyView()
    rows_of = np.arange(block_table.block_table.gpu.shape[0])

    def compute(num_reqs: int, query_start_loc: Any, positions: Any) -> None:
        table_np = table_view.of(block_table.block_table.gpu)
        out_np = out_view.of(block_table.slot_mapping.gpu)
        n = positions.shape[0]
        if n <= FEW_TOKENS:
            starts = query_start_loc[:num_reqs + 1].tolist()
            pos = positions.tolist()
            block = table_np.item
            out_np[:n] = [block(row, p // bs) * bs + p % bs for row in range(num_reqs)
                          for p in pos[starts[row]:starts[row + 1]]]
        else:
            qsl = query_start_loc.numpy()[:num_reqs + 1].astype(np.int64)
            rows = np.repeat(rows_of[:num_reqs], qsl[1:] - qsl[:-1])
            pos = positions.numpy()[:n].astype(np.int64, copy=False)
            out_np[:n] = table_np[rows, pos // bs].astype(np.int64) * bs + pos % bs
        out_np[n:] = -1

    return compute
