"""One thin adapter per vLLM API generation: what differs in how the backend calls vLLM's classes.

The backend calls the same classes on every supported release (Scheduler / AsyncScheduler with
their KVCacheManager, OutputProcessor, ParentRequest, the release's own request-ID assignment);
only their signatures and a few names moved. A generation is a run of releases with the same
calling convention; a release picks the newest generation at or below it:

- ``0.20`` (0.20.0, 0.33.0): ``EngineCoreRequest.resumable`` and streaming-input sessions,
  ``STREAM_FINISHED``, ``PauseState``; ``Scheduler(block_size=)`` (0.33 also takes
  ``hash_block_size``, defaulting to ``block_size``, scheduler.py:74 in 0.20);
- ``0.14`` (0.14.0): ``InputProcessor.assign_request_id`` (v1/engine/input_processor.py:434-444)
  and ``external_req_id``; ``OutputProcessor.add_request`` raises "already running" for a held
  ID (output_processor.py:467-468); ``EngineCoreRequest.eos_token_id`` is required;
  ``Scheduler(block_size=)`` is required (scheduler.py:71); no sessions, no pause state;
- ``0.10`` (0.10.1.1, 0.11.0): no external/internal ID split: ``v1/engine/processor.Processor``
  passes the caller's ID through, ``OutputProcessor.abort_requests(ids)`` takes no ``internal``
  and keeps no ``external_req_ids`` (0.11.0 output_processor.py:325-353), and
  ``ParentRequest(request_id, sampling_params)`` (parallel_sampling.py:34); the Scheduler takes
  no ``block_size``; ``SchedulerConfig`` has no ``is_encoder_decoder``;
  ``ModelRunnerOutput`` needs ``logprobs``, ``prompt_logprobs_dict`` and ``pooler_output``
  (0.10.1.1 also ``spec_token_ids``); ``sha256`` lives in ``vllm.utils``;
  ``FullAttentionSpec`` needs ``use_mla`` in 0.10.1.1; ``SchedulerOutput`` has no
  ``preempted_req_ids`` (0.14.0 output.py:222 added it).

Before 0.33 a PyPI wheel ignores ``VLLM_TARGET_DEVICE=cpu`` (no CUDA, ROCm, ... platform is
found, so it resolves the unspecified platform): :func:`select_cpu_platform` names the CPU
platform before ``vllm.config`` is imported (vllm/platforms/__init__.py:250-277 in 0.10.1.1).
"""

from __future__ import annotations

import importlib
from dataclasses import fields, is_dataclass
from typing import Any

__all__ = ["Api", "api_for", "select_cpu_platform", "release_key"]


def release_key(version: str) -> tuple[int, ...]:
    """``"0.10.1.1"`` -> (0, 10, 1, 1); a local or dev suffix is ignored."""
    out = []
    for part in version.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
        if digits != part:
            break
    return tuple(out)


def select_cpu_platform() -> None:
    """Name vLLM's CPU platform before anything resolves it (a no-op once one is chosen)."""
    platforms = importlib.import_module("vllm.platforms")
    if getattr(platforms, "_current_platform", None) is None:
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()


class Api:
    """The ``0.20`` generation (0.20.0 and 0.33.0): the calling convention the backend was
    written against. Subclasses override what an older generation does differently."""

    generation = "0.20"
    #: vLLM's OutputProcessor takes a same-ID add as a streaming update and finishes the old
    #: stream (0.20.0 output_processor.py:517-520), rather than raising "already running"
    finishes_duplicates = True
    #: the release's own ``assign_request_id`` gives internal IDs (``internal-id`` runs)
    assigns_internal_ids = True
    #: streaming-input sessions (``resumable``) and ``pause_generation``'s PauseState
    streaming = True
    pause = True
    #: ``SchedulerOutput.preempted_req_ids`` exists (0.14.0 output.py:222)
    lists_preemptions = True

    def __init__(self, version: str) -> None:
        self.version = version
        self.key = release_key(version)

    # -- imports --------------------------------------------------------------------------------

    def sha256(self) -> Any:
        from vllm.utils.hashing import sha256

        return sha256

    def stream_finished(self) -> Any:
        from vllm.outputs import STREAM_FINISHED

        return STREAM_FINISHED

    def pause_state(self) -> Any:
        from vllm.v1.core.sched.interface import PauseState

        return PauseState

    def id_module(self) -> Any:
        """The module whose ``random_uuid`` the release's ID assignment calls."""
        return importlib.import_module("vllm.v1.engine.input_processor")

    # -- constructors ---------------------------------------------------------------------------

    def scheduler_config(self, cls: Any, **kw: Any) -> Any:
        return cls(is_encoder_decoder=False, **kw)

    def attention_spec(self, cls: Any, **kw: Any) -> Any:
        return cls(**kw)

    def scheduler(self, cls: Any, block_size: int, **kw: Any) -> Any:
        return cls(block_size=block_size, **kw)

    def engine_core_request(self, cls: Any, *, external_req_id: str | None = None,
                            resumable: bool = False, **kw: Any) -> Any:
        return cls(external_req_id=external_req_id, resumable=resumable, **kw)

    def model_runner_output(self, cls: Any, **kw: Any) -> Any:
        return cls(**kw)

    def parent_request(self, cls: Any, request: Any) -> Any:
        return cls(request)

    # -- calls ----------------------------------------------------------------------------------

    def abort_requests(self, output_processor: Any, request_ids: list[str],
                       internal: bool) -> list[str]:
        return list(output_processor.abort_requests(request_ids, internal=internal))

    def external_req_ids(self, output_processor: Any) -> dict[str, Any]:
        return dict(output_processor.external_req_ids)

    def preempted(self, so: Any, running_before: list[Any]) -> list[str]:
        """The IDs ``schedule()`` preempted: its own list (0.14+)."""
        return sorted(so.preempted_req_ids or ())

    def assign_request_id(self, ecr: Any) -> None:
        self.id_module().InputProcessor.assign_request_id(ecr)


class _Api014(Api):
    """0.14.0: external and internal IDs, no streaming sessions or pause state yet."""

    generation = "0.14"
    finishes_duplicates = False  # output_processor.py:467-468: ValueError "already running"
    streaming = False
    pause = False

    def engine_core_request(self, cls: Any, *, external_req_id: str | None = None,
                            resumable: bool = False, **kw: Any) -> Any:
        assert not resumable, "no streaming-input sessions before 0.20"
        return cls(external_req_id=external_req_id, eos_token_id=None, **kw)

    def model_runner_output(self, cls: Any, **kw: Any) -> Any:
        return cls(**kw)


class _Api010(_Api014):
    """0.10.1.1 and 0.11.0: one request ID end to end (``Processor``), and older signatures."""

    generation = "0.10"
    assigns_internal_ids = False
    lists_preemptions = False

    def sha256(self) -> Any:
        from vllm.utils import sha256

        return sha256

    def id_module(self) -> Any:
        return importlib.import_module("vllm.v1.engine.processor")

    def scheduler_config(self, cls: Any, **kw: Any) -> Any:
        # enable_chunked_prefill defaults to None here and the V1 engine always chunks
        return cls(enable_chunked_prefill=True, **kw)

    def attention_spec(self, cls: Any, **kw: Any) -> Any:
        if any(f.name == "use_mla" for f in fields(cls)):  # 0.10.1.1 kv_cache_interface.py:62
            kw["use_mla"] = False
        return cls(**kw)

    def scheduler(self, cls: Any, block_size: int, **kw: Any) -> Any:
        return cls(**kw)

    def engine_core_request(self, cls: Any, *, external_req_id: str | None = None,
                            resumable: bool = False, **kw: Any) -> Any:
        assert not resumable, "no streaming-input sessions before 0.20"
        names = set(cls.__struct_fields__)
        if "mm_features" not in names:  # 0.10.1.1: mm_kwargs/mm_hashes/mm_placeholders
            kw.pop("mm_features", None)
            kw.update(mm_kwargs=None, mm_hashes=None, mm_placeholders=None)
        return cls(eos_token_id=None, **kw)

    def model_runner_output(self, cls: Any, **kw: Any) -> Any:
        assert is_dataclass(cls)
        required = {"logprobs": None, "prompt_logprobs_dict": {}, "pooler_output": [],
                    "spec_token_ids": None}
        names = {f.name for f in fields(cls)}
        kw.update({k: v for k, v in required.items() if k in names and k not in kw})
        return cls(**kw)

    def parent_request(self, cls: Any, request: Any) -> Any:
        return cls(request.request_id, request.sampling_params)

    def abort_requests(self, output_processor: Any, request_ids: list[str],
                       internal: bool) -> list[str]:
        # no external IDs to resolve: every ID is the caller's (output_processor.py:325-353)
        return list(output_processor.abort_requests(request_ids))

    def external_req_ids(self, output_processor: Any) -> dict[str, Any]:
        return {}

    def preempted(self, so: Any, running_before: list[Any]) -> list[str]:
        """No ``preempted_req_ids`` yet: the requests that were running before ``schedule()``
        and are PREEMPTED after it (``_preempt_request`` sets it, scheduler.py:264 in 0.10.1.1)."""
        from vllm.v1.request import RequestStatus

        return sorted(r.request_id for r in running_before
                      if r.status == RequestStatus.PREEMPTED)

    def assign_request_id(self, ecr: Any) -> None:
        raise AssertionError("vLLM before 0.14 assigns no internal request IDs")


_GENERATIONS: tuple[tuple[tuple[int, ...], type[Api]], ...] = (
    ((0, 20), Api), ((0, 14), _Api014), ((0, 10), _Api010))


def api_for(version: str) -> Api:
    """The adapter of the generation ``version`` belongs to (newest at or below it)."""
    key = release_key(version)
    for first, cls in _GENERATIONS:
        if key >= first:
            return cls(version)
    raise AssertionError(f"vLLM {version} is older than any adapter (0.10 is the oldest)")
