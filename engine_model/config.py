"""The workload a run simulates: topology, engine and IPC settings, and the scripted clients.

These are plain frozen records; ``scenarios`` loads them from TOML and validates them, and
``racesim.engine_model.system`` builds the modelled system from them. Times given as ints (a
workload built in Python) are stored as floats: the compiled build keeps every time as a C
double, so an int would otherwise reach the trace as ``1`` from source and ``1.0`` compiled.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = ["EngineConfig", "IpcConfig", "FrontendConfig", "PDConfig", "RequestSpec", "Workload",
           "TOPOLOGIES", "batch_queue_depth"]

TOPOLOGIES = ("single", "pd")


def _float_times(record: object, *names: str) -> None:
    """Store the int values of ``names`` as floats (bools, None and the rest as they are)."""
    for name in names:
        value = getattr(record, name)
        if isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(record, name, float(value))


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One EngineCore: scheduler limits, KV pool, step time and scheduling mode."""

    num_blocks: int = 64
    block_size: int = 16
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    step_time: float = 0.01
    #: None: the vLLM profile's default (racesim.engine_model.versions).
    async_scheduling: bool | None = None
    #: vLLM #29987: ABORTs also go to an ``aborts_queue`` applied just before update_from_output.
    #: None: the vLLM profile's default.
    eager_aborts: bool | None = None
    #: seconds the input thread spends preprocessing one message (natural delay of its point).
    preprocess_time: float = 0.0
    #: the vLLM release whose engine semantics the run follows (None: the default profile).
    vllm: str | None = None
    #: ``enable_prefix_caching``: full blocks are hashed from their tokens, shared by
    #: reference count, and kept (evictable) after their owners free them. None: the profile's
    #: default.
    prefix_caching: bool | None = None
    #: ``--data-parallel-size``: this many engine cores behind every API server, each API
    #: server's DPLBAsyncMPClient choosing one per request (None: 1, no data parallelism).
    data_parallel_size: int | None = None
    #: ``AsyncLLM.pause_generation`` called by API server 0 at this time (None: never).
    pause_at: float | None = None
    #: its mode: "abort" (the default: abort every request, reject adds until resume) or
    #: "keep" (freeze the queues; adds wait).
    pause_mode: str | None = None
    #: ``AsyncLLM.resume_generation`` at this time (None: never).
    resume_at: float | None = None
    #: the pause's ``clear_cache`` argument: once the pause completes (the engine idle),
    #: ``reset_prefix_cache(reset_running_requests=True)`` preempts every running request and
    #: empties the prefix cache (0.33.0 v1/engine/core.py:930-953, 0.20.0 :629-632). vLLM's
    #: default is True; None here is False, as racesim ran pauses before this key (the vllm
    #: backend passes it to vLLM's own ``pause_generation``; the model refuses True).
    pause_clear_cache: bool | None = None
    #: ``AsyncLLM.reset_prefix_cache(reset_running_requests=True)`` awaited by API server 0's
    #: caller at this time (the ``/reset_prefix_cache?reset_running_requests=true`` endpoint,
    #: an RL framework around a weight update; None: never): the engine preempts every running
    #: request between two steps, with a step possibly in flight (0.20.0 v1/engine/core.py:
    #: 602-607, entrypoints/serve/cache/api_router.py:21-44). vllm backend only.
    reset_prefix_cache_at: float | None = None
    #: NIXL ``kv_load_failure_policy`` on the decode side: "fail" (vLLM's default) or
    #: "recompute". Only read when a request's remote KV read fails.
    kv_load_failure_policy: str | None = None
    #: ``enable_fault_tolerance`` (vLLM 0.33 config/parallel.py:466, off by default): an
    #: exception in the busy loop aborts every request and waits for a retry instead of
    #: killing the engine (v1/fault_tolerance/engine_core_sentinel.py:207-231).
    fault_tolerance: bool | None = None
    #: seconds after a fault when the operator's retry instruction arrives (None: never;
    #: the engine dies when ``engine_recovery_timeout_sec``, 120 s, ends).
    ft_retry_after: float | None = None
    #: the engine core starts listening at this time: an ADD sent to it before then is
    #: dropped by the API server's ROUTER socket (no ROUTER_MANDATORY; None: from the start).
    connect_at: float | None = None
    #: ``--speculative-config`` with ``num_speculative_tokens`` = this (method ngram_gpu, the
    #: draft-model-free method vLLM allows with async scheduling); None: no speculative
    #: decoding. Runs on the vllm backend only (the model refuses it).
    num_speculative_tokens: int | None = None
    #: ``--pipeline-parallel-size``: its only effect here is the depth of EngineCore's batch
    #: queue, the executor's ``max_concurrent_batches`` (:func:`batch_queue_depth`); the stages
    #: themselves are not modelled (one GPU queue). None: 1.
    pipeline_parallel_size: int | None = None

    def __post_init__(self) -> None:
        _float_times(self, "step_time", "preprocess_time", "pause_at", "resume_at",
                     "ft_retry_after", "connect_at", "reset_prefix_cache_at")

    @property
    def dp_size(self) -> int:
        """The number of data-parallel engine cores (1 without data parallelism)."""
        return self.data_parallel_size or 1


def batch_queue_depth(config: EngineConfig) -> int:
    """How many batches EngineCore keeps in flight: the executor's ``max_concurrent_batches``
    (MultiprocExecutor: 0.20.0 multiproc_executor.py:475-478, ``2 if pp_size <= 1 and
    async_scheduling else pp_size``; 0.10.1.1-0.14.0 give 2 under async scheduling, else
    pp_size, and refuse the two together, as 0.33.0's V1 runner does: versions.profile_gap).
    More than 1 is ``step_with_batch_queue``."""
    pp = config.pipeline_parallel_size or 1
    if pp <= 1:
        return 2 if config.async_scheduling else 1
    return pp

@dataclass(frozen=True, slots=True)
class IpcConfig:
    """ZMQ socket hops: one latency for every hop (natural delay of the transit points)."""

    latency: float = 0.0005

    def __post_init__(self) -> None:
        _float_times(self, "latency")


@dataclass(frozen=True, slots=True)
class FrontendConfig:
    """API-server settings: VLLM_V1_OUTPUT_PROC_CHUNK_SIZE, and the RL router's abort-all."""

    output_chunk_size: int = 128
    #: the RL router's ``POST /abort_requests`` with no ``request_ids`` on API server 0 at
    #: this time (None: never): every request_states and parent_requests key is aborted by
    #: internal ID (entrypoints/rl/online/api_router.py:120-132, vLLM 0.33.0).
    abort_all_at: float | None = None

    def __post_init__(self) -> None:
        _float_times(self, "abort_all_at")


@dataclass(frozen=True, slots=True)
class PDConfig:
    """Prefill/decode disaggregation: KV transfer time and the prefill side's hold timeout."""

    transfer_time: float = 0.002
    #: the prefill side's hold: VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s since vLLM #25897), or the
    #: ``kv_lease_duration`` (30 s, #41383) in profiles with leases. None: the profile's default.
    hold_timeout: float | None = None
    #: "client": the proxy forwards the client's request ID to P and D (as X-Request-Id);
    #: "uuid": the proxy makes a fresh ID per client request (the toy proxy's uuid4).
    proxy_ids: str = "client"
    #: the KV connector pairing P with D: "nixl-pull" (D reads P's blocks; NixlConnector's
    #: default), "nixl-push" (D registers its blocks with P, P writes into them; vLLM 0.33
    #: nixl/push_scheduler.py, push_worker.py), or "mooncake" (P and D paired by the
    #: router's transfer_id; mooncake/mooncake_connector.py).
    connector: str = "nixl-pull"
    #: how the proxy aborts a stage: "engine-client" (it holds each API server's AsyncLLM and
    #: calls abort(id) with the ID it sent: the prefill stage by that external ID) or "http"
    #: (it talks HTTP, so it can only close the connection: each stage's API server aborts
    #: its request by internal ID, and nothing if add_request had not returned).
    proxy: str = "engine-client"
    #: NixlConnector's ``kv_connector_extra_config["bidirectional_kv_xfer"]`` (off by default;
    #: pull mode only): D keeps a request that finished LENGTH_CAPPED or STOPPED, blocks and
    #: ID, for a turn-2 read-back (vLLM 0.33 nixl/pull_scheduler.py:232-269) ...
    bidirectional_kv_xfer: bool = False
    #: ... until a reader's notice or ``decoder_kv_blocks_ttl`` seconds, a plain timeout with
    #: no lease (base_scheduler.py:181-185; 480 by default).
    decoder_kv_blocks_ttl: float = 480.0
    #: which API endpoint each leg goes to, so the ID its server hands AsyncLLM: None, both legs
    #: one endpoint (the prefix, ``cmpl-{id}-0`` or ``chatcmpl-{id}``, is the same on both, so
    #: the proxy's ID stands for it); "completions-chat": the prefill leg to /v1/completions
    #: (``cmpl-{id}-0``, openai/completion/serving.py:147, 183), the decode leg to
    #: /v1/chat/completions (``chatcmpl-{id}``, openai/chat_completion/serving.py:320-322).
    endpoints: str | None = None

    def __post_init__(self) -> None:
        _float_times(self, "transfer_time", "hold_timeout", "decoder_kv_blocks_ttl")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One scripted client request.

    Times (``at``, ``abort_at``) are absolute simulated seconds; ``eos_at`` is the generated
    token count at which the model samples EOS; ``stop_string_at`` the count after which the
    frontend's detokenizer matches a stop string; ``disconnect_after_tokens`` makes the client
    go away after receiving that many tokens. ``prompt`` names the prompt's text: requests that
    name the same prompt have the same tokens in their first ``min(prompt_tokens)`` positions (so
    prefix caching can share those blocks); unnamed, a request's prompt is its own.
    """

    id: str
    at: float = 0.0
    prompt_tokens: int = 16
    max_tokens: int = 16
    abort_at: float | None = None
    eos_at: int | None = None
    stop_string_at: int | None = None
    disconnect_after_tokens: int | None = None
    n: int = 1
    frontend: int = 0
    prompt: str | None = None
    #: the client's HTTP handler task is cancelled at this time (a disconnect or timeout):
    #: ``generate()`` aborts by internal ID if ``add_request`` had returned, else nothing.
    cancel_at: float | None = None
    #: the engine's input thread fails to preprocess this request's ADD (an ERROR output).
    preprocess_error: bool = False
    #: the decode side's read of this request's remote KV fails (P/D only).
    kv_load_fails: bool = False
    #: a streaming-input session (vLLM #28973): this many more input chunks (each of
    #: ``chunk_tokens`` tokens, generating up to ``max_tokens``) follow the first, one every
    #: ``chunk_interval`` seconds; 0 is an ordinary request.
    input_chunks: int = 0
    chunk_interval: float = 0.05
    #: the prompt tokens of each input chunk after the first (None: ``prompt_tokens``), as a
    #: realtime client's short audio segments follow a long first prompt
    chunk_tokens: int | None = None
    #: the HTTP endpoint the client calls (racesim.engine_model.api_server): "chat",
    #: "completions" or "generate-tokens", which prefix the ID, or "responses" (a background
    #: Responses API request, cancelled by ``abort_at``); None: the client calls
    #: AsyncLLM.generate() itself with ``id`` (no API layer).
    endpoint: str | None = None
    #: where the client puts ``id``: the ``X-Request-Id`` header, the body's ``request_id``,
    #: or "none" (the endpoint makes a random_uuid()). Read only with an ``endpoint``.
    id_via: str = "header"
    #: what ``abort_at`` names in a router's ``/abort_requests``: "served" (the ID the
    #: endpoint gave AsyncLLM, prefix included) or "bare" (the client's own ``id``).
    abort_names: str = "served"
    #: the request carries an object msgpack cannot encode (say, in ``extra_args``) with
    #: VLLM_ALLOW_INSECURE_SERIALIZATION off: encoding its ADD raises TypeError after the
    #: OutputProcessor registered it (vLLM 0.33 v1/serial_utils.py:220-225).
    unserializable: bool = False
    #: a decode-side P/D request (``kv_transfer_params`` with ``do_remote_prefill``) the
    #: endpoint rejects before it reaches the engine: the serving layer then sends a
    #: pre-aborted ADD under the body's raw ``request_id`` (needs ``endpoint``).
    kv_rejected: bool = False
    #: the ``X-data-parallel-rank`` header: the DP rank the client pins (None: none).
    dp_rank: int | None = None

    def __post_init__(self) -> None:
        _float_times(self, "at", "abort_at", "cancel_at", "chunk_interval")


@dataclass(frozen=True, slots=True)
class Workload:
    """Everything the modelled system is built from (no delays: those are the plan's)."""

    topology: str = "single"
    frontends: int = 1
    horizon: float = 30.0
    engine: EngineConfig = field(default_factory=EngineConfig)
    ipc: IpcConfig = field(default_factory=IpcConfig)
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    pd: PDConfig = field(default_factory=PDConfig)
    requests: tuple[RequestSpec, ...] = ()

    def __post_init__(self) -> None:
        _float_times(self, "horizon")

    def without_requests(self, keep: tuple[int, ...]) -> Workload:
        """The same workload with only the requests at the given scenario indices."""
        return replace(self, requests=tuple(self.requests[i] for i in keep))
