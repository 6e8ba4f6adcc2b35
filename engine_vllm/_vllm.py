"""The installed vLLM release's own classes (through its generation's adapter, _api.py), imported
once per process, and the objects a run builds from them.

Importing vLLM takes seconds, so it happens on the first run of a process and is reused; so is
the ``VllmConfig`` of each engine shape (``ModelConfig`` inspects the model in a subprocess the
first time, then reads ``VLLM_CACHE_ROOT``, one folder per release: :func:`_cache_root`) and what
vLLM derives from files that do not change during a process: the model's generation config and
the plugin entry points (:func:`run_caches`). Once vLLM is imported its module objects are
frozen out of the cyclic garbage collector's sight (``gc.freeze``): they live as long as the
process, and a full collection would walk them all. A run builds only what holds request state:
a fresh ``Scheduler`` (with its ``KVCacheManager``) per engine. The model is a folder holding one
tiny OPT ``config.json`` (no weights, no tokenizer); tokens come from the fake executor.

Determinism: every ``Request`` gets a simulated ``arrival_time`` (never ``time.time()``), block
hashes use sha256 (``init_none_hash``), and ``random_uuid`` in ``InputProcessor.assign_request_id``
is replaced, for each call, by a draw from the World's RNG.
"""

from __future__ import annotations

import copy
import gc
import importlib
import importlib.metadata
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from racesim.engine_vllm import _api

__all__ = ["vllm", "VllmEngineShape", "new_scheduler", "new_request", "assign_request_id",
           "run_caches", "BLOCK_SIZE_ATTR"]

BLOCK_SIZE_ATTR = "block_size"
#: the model's vocabulary with speculative decoding: room for the fake vocabulary's ids
SPEC_VOCAB_SIZE = 1 << 16
#: the release whose adapter (_api.py) runs vLLM, when a tree's own version is not one
#: (``--vllm-src`` of a dev tree, ``--vllm-base``); set by racesim.runner.vllm_tree.activate
API_RELEASE: str | None = None

_ENV = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1", "VLLM_LOGGING_LEVEL": "CRITICAL", "TRANSFORMERS_OFFLINE": "1",
        # before 0.33 vLLM installs its stdout log handler at import: a --json document on
        # stdout must stay JSON (its errors then reach stderr)
        "VLLM_CONFIGURE_LOGGING": "0"}


def _cache_root() -> str:
    """vLLM's cache folder for this release. vLLM's default (``~/.cache/vllm``, envs.py
    ``VLLM_CACHE_ROOT``) is shared by every installed release, and ``ModelConfig`` caches its
    inspection of the model class there in one file per architecture, valid for one release's
    model file (0.33 model_executor/models/registry.py:1087-1133): with two releases in use,
    each finds the other's file stale and inspects the class again in a subprocess that
    imports vLLM (seconds, in every process's first run). A user's ``VLLM_CACHE_ROOT`` wins."""
    try:
        release = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        release = "unknown"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "racesim", "vllm-cache", release)


class _Vllm:
    """The vLLM names the backend uses, bound on first use (one import per process)."""

    def __init__(self) -> None:
        for key, value in _ENV.items():
            os.environ.setdefault(key, value)
        os.environ.setdefault("VLLM_CACHE_ROOT", _cache_root())
        # vLLM configures its log handler only when an engine starts, which the backend never
        # does; until then its warnings about this CPU build (no vllm._C, no Triton) reach
        # Python's last-resort handler whatever VLLM_LOGGING_LEVEL says. Apply that level.
        level = os.environ["VLLM_LOGGING_LEVEL"].upper()
        if isinstance(logging.getLevelName(level), int):  # vLLM itself rejects a bad name later
            logging.getLogger("vllm").setLevel(level)
        import vllm

        self.version: str = vllm.__version__
        self.api = api = _api.api_for(API_RELEASE or self.version)
        if api.key < (0, 33):  # before vllm.config: older wheels ignore VLLM_TARGET_DEVICE
            _api.select_cpu_platform()
        import torch
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.engine import (
            EngineCoreOutput,
            EngineCoreOutputs,
            EngineCoreRequest,
            FinishReason,
        )
        from vllm.v1.engine.exceptions import EngineDeadError
        from vllm.v1.engine.output_processor import OutputProcessor
        from vllm.v1.engine.parallel_sampling import ParentRequest
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request, RequestStatus
        from vllm.v1.structured_output import StructuredOutputManager

        sha256 = api.sha256()
        #: None before 0.20 (no streaming sessions, no pause state)
        self.STREAM_FINISHED = api.stream_finished() if api.streaming else None
        self.PauseState = api.pause_state() if api.pause else None
        self.torch = torch
        self.CacheConfig, self.ModelConfig = CacheConfig, ModelConfig
        self.SchedulerConfig, self.VllmConfig = SchedulerConfig, VllmConfig
        self.SamplingParams, self.RequestOutputKind = SamplingParams, RequestOutputKind
        self.Scheduler = Scheduler
        self.AsyncScheduler: Any = None
        if api.async_scheduler:  # 0.10+
            from vllm.v1.core.sched.async_scheduler import AsyncScheduler

            self.AsyncScheduler = AsyncScheduler
        self.EngineCoreRequest, self.FinishReason = EngineCoreRequest, FinishReason
        self.EngineCoreOutput, self.EngineCoreOutputs = EngineCoreOutput, EngineCoreOutputs
        self.OutputProcessor, self.ParentRequest = OutputProcessor, ParentRequest
        self.EngineDeadError = EngineDeadError
        self.FullAttentionSpec, self.KVCacheConfig = FullAttentionSpec, KVCacheConfig
        self.KVCacheGroupSpec = KVCacheGroupSpec
        self.ModelRunnerOutput = ModelRunnerOutput
        #: None on 0.9.2: the connector's results were ModelRunnerOutput's own
        #: finished_sending/finished_recving (0.9.2 v1/outputs.py:108-109); KVConnectorOutput
        #: came with 0.10 (only the P/D path reads it, model-only on 0.9)
        self.KVConnectorOutput = getattr(importlib.import_module("vllm.v1.outputs"),
                                         "KVConnectorOutput", None)
        self.Request, self.RequestStatus = Request, RequestStatus
        self.StructuredOutputManager = StructuredOutputManager
        self._hashers: dict[int, Any] = {}
        self._hasher_factory: Any = None
        if api.block_hasher:  # 0.10+
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

            # NONE_HASH from sha256, so block hashes do not depend on the process
            # (kv_cache_utils.py)
            init_none_hash(sha256)
            self._hasher_factory = (get_request_block_hasher, sha256)

    def block_hasher(self, block_size: int) -> Any:
        if self._hasher_factory is None:  # 0.9: the KV cache manager hashes blocks itself
            return None
        hasher = self._hashers.get(block_size)
        if hasher is None:
            factory, hash_fn = self._hasher_factory
            hasher = self._hashers[block_size] = factory(block_size, hash_fn)
        return hasher


@cache
def vllm() -> _Vllm:
    """vLLM's classes (imported on the first call in a process)."""
    names = _Vllm()
    # vLLM's, torch's and transformers' modules, classes and functions (about 650 000 objects)
    # never die: a full collection would traverse every one of them, in a run's middle, and
    # the interpreter's last collection at exit (1.5 s of a 7 s `racesim run`). No collection
    # first: it would cost half a second for the little garbage importing leaves.
    gc.freeze()
    return names


_ENTRY_POINTS: dict[tuple[Any, ...], Any] = {}


def _entry_points(*args: Any, **kwargs: Any) -> Any:
    key = (args, tuple(sorted(kwargs.items())))
    found = _ENTRY_POINTS.get(key)
    if found is None:
        found = _ENTRY_POINTS[key] = _READ_ENTRY_POINTS(*args, **kwargs)
    return found


_READ_ENTRY_POINTS = importlib.metadata.entry_points


@contextmanager
def run_caches() -> Iterator[None]:
    """During a run, ``importlib.metadata.entry_points`` answers each query once per process.
    vLLM asks it for its plugin groups each time it builds a model runner (the logits
    processors: 0.33 v1/sample/logits_processor/__init__.py:57-61) and an AsyncLLM (its stat
    loggers: 0.33 plugins/__init__.py:36-42), a scan of every installed distribution's
    metadata; what is installed does not change while a process runs."""
    md = importlib.metadata
    saved = md.entry_points
    md.entry_points = _entry_points  # type: ignore[assignment]
    try:
        yield
    finally:
        md.entry_points = saved  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class VllmEngineShape:
    """What a ``VllmConfig`` depends on: one scenario engine's limits and scheduling mode."""

    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    async_scheduling: bool
    prefix_caching: bool
    #: P/D: (kv_role, engine_id, kv_lease_duration, kv_load_failure_policy, connector class
    #: name: "NixlConnector", "NixlPushConnector" or "MooncakeConnector"), or None for no KV
    #: connector
    kv_transfer: tuple[str, str, int, str, str] | None = None
    #: P/D: more ``kv_connector_extra_config`` entries, as (key, value) pairs (the scenario's
    #: ``[pd] bidirectional_kv_xfer`` and ``decoder_kv_blocks_ttl``)
    kv_extra: tuple[tuple[str, Any], ...] = ()
    #: ``--speculative-config '{"method": "ngram_gpu", "num_speculative_tokens": k}'``; 0: none
    num_speculative_tokens: int = 0


@cache
def _config(shape: VllmEngineShape) -> tuple[Any, Any]:
    v = vllm()
    model = str(resources.files("racesim.engine_vllm") / "tiny_model")
    extra: dict[str, Any] = {}
    if shape.num_speculative_tokens:
        # the fake vocabulary's ids (racesim.engine_vllm.engine.views.Vocabulary, from 1024 up)
        # inside the model's vocabulary: the ngram drafter takes a sampled id >= vocab_size for
        # no token (0.20 v1/spec_decode/ngram_proposer_gpu.py:436-439)
        extra["hf_overrides"] = {"vocab_size": SPEC_VOCAB_SIZE}
    mc = v.ModelConfig(model=model, skip_tokenizer_init=True, max_model_len=shape.max_model_len,
                       **extra)
    sc = v.api.scheduler_config(v.SchedulerConfig, max_model_len=shape.max_model_len,
                                max_num_seqs=shape.max_num_seqs,
                                max_num_batched_tokens=shape.max_num_batched_tokens,
                                async_scheduling=shape.async_scheduling)
    cc = v.CacheConfig(block_size=shape.block_size,
                       enable_prefix_caching=shape.prefix_caching)
    spec_config = _speculative_config(shape.num_speculative_tokens, mc)
    vc = v.VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                      speculative_config=spec_config)
    _keep_generation_config(vc.model_config)
    # CpuPlatform switches async scheduling off (platforms/cpu.py:348): put the scenario's back.
    vc.scheduler_config.async_scheduling = shape.async_scheduling
    # BlockPool keeps block 0 as its null block (block_pool.py): one more gives the scenario's
    # num_blocks usable blocks, as the model has. EngineCore sets num_gpu_blocks from the KV
    # memory; the Scheduler asserts it is set.
    vc.cache_config.num_gpu_blocks = shape.num_blocks + 1
    if shape.kv_transfer is not None:
        # what `vllm serve --kv-transfer-config '{"kv_connector":"NixlConnector",...}'` sets;
        # the Scheduler then builds vLLM's own connector (scheduler.py:174-203)
        role, engine_id, lease, on_failure, connector = shape.kv_transfer
        from vllm.config import KVTransferConfig

        extra = {}
        if "kv_load_failure_policy" in getattr(KVTransferConfig, "__dataclass_fields__", {}):
            extra["kv_load_failure_policy"] = on_failure  # 0.14+
        vc.kv_transfer_config = KVTransferConfig(
            kv_connector=connector, kv_role=role, engine_id=engine_id,
            kv_connector_extra_config={"kv_lease_duration": lease, **dict(shape.kv_extra)},
            **extra)
        if hasattr(vc.scheduler_config, "disable_hybrid_kv_cache_manager"):
            # VllmConfig turns HMA off when a connector is configured and the user expressed
            # no preference (0.14.0 config/vllm.py:978-984); set after construction here
            vc.scheduler_config.disable_hybrid_kv_cache_manager = True
    spec = v.api.attention_spec(v.FullAttentionSpec, block_size=shape.block_size,
                                num_kv_heads=1, head_size=1, dtype=v.torch.float32)
    return vc, spec


def _keep_generation_config(mc: Any) -> None:
    """``ModelConfig.try_get_generation_config`` parses the model folder's config with
    transformers at each call, and every AsyncLLM's InputProcessor calls it (0.33
    v1/engine/input_processor.py:64): this config's answer, read once, is what each later call
    returns (a copy of its own, as each call's dict is)."""
    fields = mc.try_get_generation_config()

    def kept() -> dict[str, Any]:
        return copy.deepcopy(fields)

    try:
        object.__setattr__(mc, "try_get_generation_config", kept)
    except AttributeError:  # a config without an instance dict: each call reads the folder
        pass


def _speculative_config(k: int, mc: Any) -> Any:
    """What ``EngineArgs.create_speculative_config`` builds for ``--speculative-config
    '{"method": "ngram_gpu", "num_speculative_tokens": k}'`` (0.20 arg_utils.py:1567-1592), or
    None. ngram_gpu: vLLM refuses async scheduling with any other method that needs no draft
    model (0.20 config/vllm.py:774-792, 0.33 :1650-1665); its drafter proposes from the
    request's own tokens, as the CPU ngram does."""
    if not k:
        return None
    from vllm.config import ParallelConfig, SpeculativeConfig

    return SpeculativeConfig(method="ngram_gpu", num_speculative_tokens=k,
                             target_model_config=mc, target_parallel_config=ParallelConfig())


def new_scheduler(shape: VllmEngineShape, include_finished_set: bool = False) -> Any:
    """A fresh ``Scheduler`` (``AsyncScheduler`` under async scheduling, as
    ``SchedulerConfig.get_scheduler_cls`` picks, config/scheduler.py:231). A DP rank's has
    ``include_finished_set`` (v1/engine/core.py:1219-1238): each client's finished IDs."""
    v = vllm()
    vc, spec = _config(shape)
    kvc = v.KVCacheConfig(num_blocks=shape.num_blocks + 1, kv_cache_tensors=[],
                          kv_cache_groups=[v.KVCacheGroupSpec(["layer"], spec)])
    cls = v.AsyncScheduler if shape.async_scheduling else v.Scheduler
    return v.api.scheduler(cls, shape.block_size, vllm_config=vc, kv_cache_config=kvc,
                           structured_output_manager=v.StructuredOutputManager(vc),
                           log_stats=False, include_finished_set=include_finished_set)


def new_request(request_id: str, prompt_token_ids: list[int], max_tokens: int, client_index: int,
                arrival_time: float, block_size: int, stop_ids: Any,
                resumable: bool = False, kv_transfer_params: dict[str, Any] | None = None) -> Any:
    """A vLLM ``Request`` as ``EngineCoreProc.preprocess_add_request`` builds it
    (``Request.from_engine_core_request``, vllm/v1/request.py:244); ``resumable``: a
    streaming-input session's chunk (:264)."""
    v = vllm()
    sp = v.SamplingParams(max_tokens=max_tokens, detokenize=False,
                          output_kind=v.RequestOutputKind.DELTA)
    sp.stop_token_ids = stop_ids  # the fake vocabulary's end-of-sequence tokens
    if kv_transfer_params is not None:
        # the OpenAI server puts the request body's kv_transfer_params here (request.py:118-122)
        sp.extra_args = {"kv_transfer_params": kv_transfer_params}
    ecr = v.api.engine_core_request(
        v.EngineCoreRequest, request_id=request_id, prompt_token_ids=prompt_token_ids,
        mm_features=None, sampling_params=sp, pooling_params=None, arrival_time=arrival_time,
        lora_request=None, cache_salt=None, data_parallel_rank=None, client_index=client_index,
        resumable=resumable)
    return v.api.request(v.Request, ecr, v.block_hasher(block_size))


def assign_request_id(request_id: str, draw: Any) -> str:
    """The internal ID vLLM's own ``InputProcessor.assign_request_id`` gives ``request_id``
    (input_processor.py:354-371), with ``draw()`` standing in for ``random_uuid``."""
    v = vllm()
    sp = v.SamplingParams(max_tokens=1, detokenize=False)
    ecr = v.api.engine_core_request(
        v.EngineCoreRequest, request_id=request_id, prompt_token_ids=[3], mm_features=None,
        sampling_params=sp, pooling_params=None, arrival_time=0.0, lora_request=None,
        cache_salt=None, data_parallel_rank=None)
    module = v.api.id_module()
    saved = module.random_uuid  # it is bound in that module (input_processor.py:31)
    module.random_uuid = draw
    try:
        v.api.assign_request_id(ecr)
    finally:
        module.random_uuid = saved
    return str(ecr.request_id)
