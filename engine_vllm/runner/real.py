"""vLLM's own V1 model runner, built without weights and stepped on real SchedulerOutputs.

The runner is the release's ``CPUModelRunner`` (a ``GPUModelRunner`` subclass,
vllm/v1/worker/cpu_model_runner.py), what vLLM's CPU worker builds (0.33 cpu_worker.py:148-164),
built from the engine's own ``VllmConfig`` and never given weights (``load_model`` is not
called). Each step the executor calls its real ``execute_model(scheduler_output)`` and
``sample_tokens(None)`` (0.14+; 0.33 gpu_model_runner.py:3906-4525): ``_update_states``, the
persistent batch, ``_prepare_inputs`` (async carry-over included), ``_bookkeeping_sync`` and the
``ModelRunnerOutput`` (``AsyncGPUModelRunnerOutput`` under async scheduling) are vLLM's.

Only the network is fake, at three seams: the attention metadata (no KV tensors exist) is
empty, the forward pass returns zeros, and the ``Sampler`` (``runner.sampler``, called by
``_sample``) is replaced by :meth:`RealRunner._sample`, which reads each row's last model input
token and position from the runner's own buffers and answers with a token of the fake
vocabulary: the row's incarnation, the incarnation of its input token when that is another's
(what a model fed the wrong token would continue from), and end-of-sequence at the scenario's
``eos_at``. So a token the runner routes wrong carries its origin to the client.
"""

from __future__ import annotations

import contextlib
from typing import Any

from racesim.engine_vllm.engine.views import Vocabulary
from racesim.engine_vllm.runner import shims, spec

__all__ = ["RealRunner", "query_starts"]


def query_starts(runner: Any) -> Any:
    """The batch rows' token offsets (numpy): a CpuGpuBuffer's ``.np`` from 0.11, the
    runner's own ``query_start_loc_np`` on 0.10 (gpu_model_runner.py:315)."""
    qsl = runner.query_start_loc
    return qsl.np if hasattr(qsl, "np") else runner.query_start_loc_np


class _StubModel:
    """The model's place: logits of width 1 (the sampler seam picks the token). Called by
    ``execute_model`` itself before ``_model_forward`` existed (0.11 gpu_model_runner.py:2298)."""

    def __init__(self, forward: Any) -> None:
        self._forward = forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward(*args, **kwargs)

    def compute_logits(self, hidden: Any, *args: Any) -> Any:
        return hidden


class RealRunner:
    """One engine's vLLM model runner. ``truth(req_id)`` gives ``(incarnation, eos_at)`` of the
    scheduler's Request under that ID now (asked when the runner takes a new request in)."""

    def __init__(self, v: Any, vc: Any, kv_cache_config: Any, vocab: Vocabulary,
                 truth: Any, accept: Any = None) -> None:
        import torch
        from vllm.config import set_current_vllm_config

        shims.init_distributed(vc)
        if v.api.key < (0, 20):
            shims.stub_numba()
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner

        self.v = v
        self.torch = torch
        self.vocab = vocab
        self.truth = truth
        sc = vc.scheduler_config
        wanted = sc.async_scheduling
        late_async = sc.async_scheduling and v.api.key < (0, 14)
        if late_async:
            # 0.11: the CPU runner's own event placeholder cannot record(stream) in __init__
            # (gpu_model_runner.py:391): build it synchronous, then switch async on
            sc.async_scheduling = False
        speculative = vc.speculative_config is not None
        if speculative:
            spec.eager_drafter()
        try:
            with set_current_vllm_config(vc), shims.no_cuda(), (
                    spec.no_pinned_memory() if speculative else contextlib.nullcontext()):
                runner = CPUModelRunner(vc, torch.device("cpu"))
        finally:
            # the ngram_gpu drafter builds its own VllmConfig over this SchedulerConfig (0.20
            # ngram_proposer_gpu.py:240-245), whose CPU platform hook switches async scheduling
            # off (platforms/cpu.py:136): the engine's setting back for the next run's runner
            sc.async_scheduling = wanted
        if late_async:
            runner.use_async_scheduling = True
            runner.async_output_copy_stream = shims.STREAM
            runner.prepare_inputs_event = shims.STREAM
        for name in ("async_output_copy_stream", "prepare_inputs_event"):
            # the CPU runner's own placeholders (built inside its __init__) lack what the
            # async output calls (0.20: no wait_stream)
            if getattr(runner, name, None) is not None:
                setattr(runner, name, shims.STREAM)
        if speculative:
            spec.gpu_bookkeeping(runner)
        runner.kv_cache_config = kv_cache_config  # initialize_kv_cache sets it (never called)
        # no attention backend is built (no layers): one empty group per KV cache group
        runner.attn_groups = [[] for _ in kv_cache_config.kv_cache_groups]
        self._zero = torch.zeros((runner.max_num_tokens, 1), dtype=torch.float32)
        # the network's seams (module docstring): instance attributes, vLLM's classes untouched
        runner.model = _StubModel(self._forward)
        runner._model_forward = self._forward
        if not speculative:
            runner._build_attention_metadata = lambda *a, **k: ({}, None)
        # else vLLM's own: with no attention group it builds only the common metadata, which
        # the drafter needs (sample_tokens: ``input_fits_in_drafter``)
        runner.sampler = self._sample
        #: the rejection sampler seam (racesim.engine_vllm.runner.spec), None without drafts
        self.verifier: spec.Verifier | None = None
        if speculative:
            self.verifier = runner.rejection_sampler = spec.Verifier(self._verify_begin,
                                                                     self._target, accept)
        if v.api.key < (0, 11):
            # 0.10's CPU runner asserts a TorchSDPA builder in attn_groups[0][0] to reorder the
            # batch for its attention kernel (cpu_model_runner.py:33-58); no attention layer
            # exists, so no reorder, as 0.11+ do with no attention groups (0.11
            # cpu_model_runner.py:62-66)
            runner._may_reorder_batch = lambda *a, **k: None
        if v.api.key >= (0, 20):  # a Triton kernel there; 0.14 and older compute it in numpy
            for table in runner.input_batch.block_table.block_tables:
                table.compute_slot_mapping = shims.cpu_slot_mapping(table)
        self.runner = runner
        self._so: Any = None  # the SchedulerOutput being executed
        self._noted: Any = None  # the SchedulerOutput whose new states note_new has noted
        #: id(CachedRequestState) -> (it, incarnation, eos_at): the runner's request objects
        #: and the incarnation each was built for
        self._states: dict[int, tuple[Any, int, int | None]] = {}
        from vllm.v1.outputs import SamplerOutput

        self._sampler_output = SamplerOutput
        import numpy

        self._np = numpy
        #: numpy views of the runner's input ids and positions (CPU tensors made once)
        self._ids, self._positions = shims.NumpyView(), shims.NumpyView()

    # -- the executor's calls -------------------------------------------------------------------

    def execute(self, so: Any) -> tuple[Any, bool]:
        """``execute_model`` then ``sample_tokens``: the step's ModelRunnerOutput, or the
        release's async output object under async scheduling (``get_output()`` later), and
        whether ``execute_model`` left the sampling to ``sample_tokens`` (returned None)."""
        self._so = so
        self._noted = None
        if self.verifier is None:
            with shims.no_cuda():
                return self._execute(so)
        with shims.no_cuda(), spec.no_pinned_memory():
            return self._execute(so)

    def _execute(self, so: Any) -> tuple[Any, bool]:
        runner = self.runner
        out = runner.execute_model(so)
        self.note_new(so)
        deferred = out is None
        if deferred:
            out = runner.sample_tokens(None)
        return out, deferred

    def note_new(self, so: Any) -> None:
        """The runner's state objects of the requests this step brought in (new, resumed or a
        new object under an ID it held): their incarnation is the scheduler's request now.
        Once per step: the sampler seams ask again, on the same books (nothing between
        ``_update_states`` and the sampling adds a state or changes the scheduler's)."""
        if so is self._noted:
            return
        states = self._states
        requests = self.runner.requests
        new = {nr.req_id for nr in so.scheduled_new_reqs}
        for rid in self.runner.input_batch.req_ids:
            if rid is None:
                continue
            state = requests.get(rid)
            if state is None:
                continue
            entry = states.get(id(state))
            if entry is None or entry[0] is not state or rid in new:
                inc, eos_at = self.truth(rid)
                states[id(state)] = (state, inc, eos_at)
        if len(states) > 2 * len(requests) + 16:
            live = {id(s) for s in requests.values()}
            for key in [k for k in states if k not in live]:
                del states[key]
        self._noted = so

    def model_inputs(self) -> tuple[Any, Any, Any]:
        """The batch rows' token offsets, input ids and positions the runner built (numpy)."""
        runner = self.runner
        return (query_starts(runner),
                self._ids.of(getattr(runner.input_ids, "gpu", runner.input_ids)),
                self._positions.of(getattr(runner.positions, "gpu", runner.positions)))

    def inc_of_state(self, state: Any) -> int:
        entry = self._states.get(id(state))
        return entry[1] if entry is not None and entry[0] is state else 0

    # -- the network ----------------------------------------------------------------------------

    def _forward(self, input_ids: Any = None, positions: Any = None, *args: Any,
                 **kwargs: Any) -> Any:
        n = positions.shape[-1] if positions is not None else input_ids.shape[0]
        return self._zero[:n]

    def _sample(self, logits: Any = None, sampling_metadata: Any = None, *args: Any,
                **kwargs: Any) -> Any:
        """The sampler seam: one token per batch row, from that row's last model input."""
        runner = self.runner
        # before 0.14 execute_model samples inline: the rows' states are registered here
        self.note_new(self._so)
        batch = runner.input_batch
        n = batch.num_reqs
        # a CpuGpuBuffer, or (0.33 positions) a tensor; on the CPU runner .gpu is the CPU one
        qsl, ids, positions = self.model_inputs()
        requests = runner.requests
        answer = self._answer
        req_ids = batch.req_ids
        out = []
        for i in range(n):
            last = qsl.item(i + 1) - 1  # the row's last model input
            out.append(answer(requests.get(req_ids[i]), ids.item(last), positions.item(last)))
        sampled = self.torch.from_numpy(self._np.array(out, dtype=self._np.int32).reshape(n, 1))
        return self._sampler_output(sampled_token_ids=sampled, logprobs_tensors=None)

    def _answer(self, state: Any, token_in: int, position: int) -> int:
        """The token the network samples for the request of runner state ``state`` after its
        model input ``token_in`` at ``position``: its incarnation, the incarnation of its input
        token when that is another's (what a model fed the wrong token would continue from),
        end-of-sequence at its ``eos_at``."""
        entry = self._states.get(id(state))
        inc, eos_at = (entry[1], entry[2]) if entry is not None else (0, None)
        ctx = 0
        if token_in >= Vocabulary.BASE:
            came = self.vocab.inc_of(token_in)
            if came != inc:
                ctx = came  # the input token is another incarnation's
        index = position + 2 - state.num_prompt_tokens  # 1-based output index
        return self.vocab.code(inc, ctx, index == eos_at)

    def _verify_begin(self) -> None:
        self.note_new(self._so)

    def _target(self, row: int, flat: int) -> int:
        """The token the network samples after batch row ``row``'s model input at flattened
        index ``flat`` (what :meth:`_sample` answers for a row's last input)."""
        runner = self.runner
        state = runner.requests.get(runner.input_batch.req_ids[row])
        _qsl, ids, positions = self.model_inputs()
        return self._answer(state, ids.item(flat), positions.item(flat))
