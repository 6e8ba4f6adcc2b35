"""The two version profiles written out in full: ``0.8`` (the code PR #15326 was written
against) and ``0.33`` (the newest release), with the await-point widths they share.

The releases between are 0.33's profile with what each does differently (release_profiles.py);
looking a profile up, and what it means for a run, is versions.py's.
"""

from __future__ import annotations

from racesim.engine_model.profile_types import Behaviour, VllmProfile

__all__ = ["WRITTEN_OUT"]

# Every required point is listed in both profiles (a test checks the catalogue is covered).
_WIDTHS = {
    "client.send": "live",
    "frontend.add_request:before_send": "latent",
    "frontend.abort:after_pop": "latent",
    "frontend.output_handler:between_chunks": "yield",
    "frontend.output_handler:before_abort_send": "latent",
    "ipc.input:transit": "live",
    "ipc.output:transit": "live",
    "engine.input:preprocess": "live",
    "engine.step:execute": "live",
    "engine.step:update_from_output": "live",
    "pd.proxy:after_prefill": "live",
    "pd.kv:read": "live",
    "pd.kv:notify": "live",
    "pd.kv:push": "live",
    "pd.mooncake:bootstrap": "live",
    "dp.coordinator:publish": "live",
}

_WIDTH_SOURCES = Behaviour(
    "frontend.abort:after_pop, frontend.add_request:before_send and "
    "frontend.output_handler:before_abort_send are latent: the ADD/ABORT send is an eager pyzmq "
    "send (ROUTER, SNDHWM=0) whose awaited future is already done; the stop-string ABORT of "
    "any output chunk but a step's last waits behind the sleep(0) between chunks: yield there",
    "0.33 v1/engine/core_client.py:1281-1300 (AsyncMPClient._send_input_message), "
    "utils/network_utils.py:376 (SNDHWM=0); async_llm.py:891-922, envs.py:1476 (chunks of "
    "VLLM_V1_OUTPUT_PROC_CHUNK_SIZE = 128)")

#: 0.8 and 0.33, written out; the releases between are 0.33's with their differences.
WRITTEN_OUT: dict[str, VllmProfile] = {
    "0.8": VllmProfile(
        name="0.8",
        release="vLLM 0.8 (March 2025, the code PR #15326 was written against); P/D as of "
                "#20139/#25897, which came later (P/D verdicts unverified on 0.8) but is kept "
                "so old counterexamples replay",
        duplicate_add="overwrite",
        frontend_duplicate="reject",
        abort_unknown_external="as-internal",
        async_scheduling=False,
        eager_aborts=False,
        idle_clears_aborts=False,
        pd_hold="timeout",
        hold_timeout=480.0,
        remote_kv_abort="free-now",
        prefix_caching=False,
        free_order="append",
        # P/D on 0.8 is 0.33's NIXL (unverified here), stepping while requests are held as
        # 0.33 does, so the 0.8 counterexamples recorded with it replay
        features=frozenset(),
        cancel_before_collector="abort",
        fan_out="per-child",
        pd_held_finishes=frozenset({"FINISHED_LENGTH_CAPPED"}),
        external_abort_parent="drop",
        pd_unverified="0.8.5 ships no NixlConnector (its kv_connector/v1/ holds only the LMCache "
                      "and shared-storage connectors); this profile's P/D is the NIXL connector "
                      "of #20139/#25897, which came later",
        widths=_WIDTHS,
        behaviours=(
            Behaviour("Scheduler.add_request overwrites requests[id] for a live ID; the old "
                      "object keeps running", "v1/core/sched/scheduler.py at f90d34b"),
            Behaviour("OutputProcessor.add_request raises 'Request id ... already running' for "
                      "an ID in its own request_states", "v1/engine/output_processor.py"),
            Behaviour("synchronous scheduling by default", "before #27614"),
            Behaviour("one input queue: an ABORT is applied only between steps",
                      "v1/engine/core.py before #29987"),
            Behaviour("P/D (unverified on 0.8): the prefill side holds a finished request's "
                      "blocks for a fixed 480 s timeout, only when it finished LENGTH_CAPPED. "
                      "This is the NIXL connector of #20139 and #25897, which came after 0.8: "
                      "0.8.5 ships no NixlConnector at all (its kv_connector/v1/ has only "
                      "lmcache_connector.py and shared_storage_connector.py), so every P/D "
                      "verdict on this profile is unverified",
                      "nixl_connector.py, #20139 and #25897; 0.8.5 "
                      "distributed/kv_transfer/kv_connector/v1/"),
            Behaviour("n > 1: each child is registered and its ADD sent before the next child "
                      "is registered", "v1/engine/async_llm.py at f90d34b (add_request)"),
            _WIDTH_SOURCES,
        ),
    ),
    "0.33": VllmProfile(
        name="0.33",
        release="vLLM 0.33.0 (2026-11, the newest release)",
        duplicate_add="assert",
        frontend_duplicate="finish-old",
        abort_unknown_external="noop",
        async_scheduling=True,
        eager_aborts=True,
        idle_clears_aborts=True,
        pd_hold="lease",
        hold_timeout=30.0,
        remote_kv_abort="free-after-recv",
        prefix_caching=True,
        free_order="lifo-uncached",
        features=frozenset({"runner-carry-drops-finished", "dp", "pause", "preprocess-error",
                            "kv-load-failure",
                            "streaming-input", "fault-tolerance", "encode-error",
                            "api-layer", "nixl-push", "pd-proxy-http", "mooncake",
                            "nixl-bidirectional", "pd-abort-notify"}),
        cancel_before_collector="nothing",
        fan_out="register-first",
        pd_held_finishes=frozenset({"FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED"}),
        external_abort_parent="keep",
        widths=_WIDTHS,
        behaviours=(
            Behaviour("Scheduler.add_request asserts 'duplicate request id' for an ID already in "
                      "requests (not a streaming session): AssertionError, the engine dies",
                      "v1/core/sched/scheduler.py:2931-2936, v1/engine/core.py:1582-1587 "
                      "(ENGINE_DEAD; unless fault tolerance is enabled)"),
            Behaviour("OutputProcessor.add_request for an internal ID already present treats it "
                      "as a streaming update: the old stream ends with STREAM_FINISHED, the new "
                      "request is not registered, and AsyncLLM still sends its ADD",
                      "v1/engine/output_processor.py:663-713, v1/engine/async_llm.py:567-585"),
            Behaviour("an abort naming an unknown external ID does nothing",
                      "v1/engine/output_processor.py:627 (external_req_ids.pop(id, []))"),
            Behaviour("n > 1: AsyncLLM registers every child in the OutputProcessor, then "
                      "awaits each child's ADD send in turn; an exception or cancel there "
                      "aborts the parent by its internal ID and re-raises",
                      "v1/engine/async_llm.py:538-565"),
            Behaviour("n > 1: an abort by external ID pops the children's states and the "
                      "external_req_ids entry but leaves the parent in parent_requests, which "
                      "the request's lifecycle never removes (only _finish_request and an "
                      "abort by the parent's internal ID do)",
                      "v1/engine/output_processor.py:599-661, 917-932"),
            Behaviour("async scheduling is on by default (two batches in flight)",
                      "#27614; config/vllm.py:1685-1719"),
            Behaviour("an ABORT goes to both aborts_queue (applied inside step(), before "
                      "update_from_output) and input_queue; aborts_queue is cleared on every "
                      "idle pass of the busy loop",
                      "v1/engine/core.py:690, 792, 824-831, 1650-1666, 2030-2040 (#29987)"),
            Behaviour("P/D: the prefill side holds blocks on a 30 s lease; the decode side's "
                      "scheduler sends heartbeats every lease//6 s from its add until the blocks "
                      "arrive (the first one per prefill engine only starts the handshake), "
                      "each extending the lease to now + lease * 2 // 3 (20 s at 30 s)",
                      "kv_connector/v1/nixl/base_scheduler.py:82-88, 202-241, 513-518; "
                      "nixl/base_worker.py:627-631, 3380-3397 (#41383)"),
            Behaviour("P/D, NIXL push mode (pd.connector = 'nixl-push'): D registers the "
                      "blocks it allocated under its own request ID; P pairs each held request "
                      "with a registration by exact ID, else by the ID with its -<8 hex> suffix "
                      "stripped, first in insertion order, then WRITEs into D's blocks; the "
                      "WRITE's notice completes D's load (an aborted D request keeps its blocks "
                      "until then) and ends P's hold",
                      "kv_connector/v1/nixl/push_scheduler.py:177-205, 252-279; "
                      "push_worker.py:274-333, 418-448, 681, 785-806, 820-843; "
                      "nixl/utils.py:60-67"),
            Behaviour("P/D, bidirectional KV transfer (pd.bidirectional_kv_xfer, off by "
                      "default, pull mode only): the decode side keeps a request that finished "
                      "LENGTH_CAPPED or STOPPED, its blocks and its Scheduler.requests entry, "
                      "for decoder_kv_blocks_ttl (480 s), a plain timeout with no lease, unless "
                      "a reader's notice ends it first; an abort or error frees at once",
                      "kv_connector/v1/nixl/pull_scheduler.py:232-269; base_scheduler.py:"
                      "176-185; push_scheduler.py:72-75"),
            Behaviour("P/D, MooncakeConnector (pd.connector = 'mooncake'): the router sends "
                      "both legs at once with one transfer_id; P keys its sender table by "
                      "transfer_id (an allocation creates the entry if absent, a LENGTH_CAPPED "
                      "finish fills and readies the existing one, any other finish pops it); D "
                      "asks P for the transfer_id's KV and P writes the entry's blocks into D's, "
                      "popping it after the first write; an entry expires 480 s after its "
                      "finish, with no heartbeats; an exception in P's sender loop is never "
                      "read and leaves its finished request held forever",
                      "kv_connector/v1/mooncake/mooncake_connector.py:1104-1219, 1646-1770, "
                      "2326-2353, 2690-2729"),
            Behaviour("P/D: the prefill side holds the blocks of a request that finished "
                      "LENGTH_CAPPED or STOPPED (say, EOS as its one token); an abort or "
                      "error frees them at once",
                      "kv_connector/v1/nixl/pull_scheduler.py:191-254"),
            Behaviour("an aborted request still waiting for remote KV keeps its blocks until "
                      "the read completes", "v1/core/sched/scheduler.py:3017-3025"),
            Behaviour("prefix caching is on by default: full blocks are hashed (chained, from "
                      "the tokens), looked up when a waiting request is first scheduled (never "
                      "the last prompt token), shared by ref count, and kept in the free queue "
                      "until reused",
                      "config/cache.py:257; v1/core/kv_cache_manager.py:266-328, 380-627; "
                      "v1/core/block_pool.py:706-850; single_type_kv_cache_manager.py:477-543"),
            Behaviour("freed blocks without a hash go to the front of the free queue (reused "
                      "first), hashed ones to the tail (LRU eviction, evicted when reused)",
                      "v1/core/block_pool.py:816-849, 769-790"),
            Behaviour("preemption (no free blocks for a running request): FCFS preempts the "
                      "last running request; its blocks are freed, num_computed_tokens reset, it "
                      "goes to the front of waiting; output still in flight (async) is delivered "
                      "but does not touch the reset counters, and it is not resumed until that "
                      "output has drained",
                      "v1/core/sched/scheduler.py:930-980, 1084-1088, 1799-1843, 2313-2340"),
            Behaviour("data parallelism: each API server's DPLBAsyncMPClient picks an engine "
                      "per request (reqs_in_flight affinity first, else the least loaded from "
                      "eng_start_index), routes aborts by reqs_in_flight and forgets an ID when "
                      "an engine reports it in finished_requests; the ADD send is the only "
                      "await (no FIRST_REQ message in this release)",
                      "v1/engine/core_client.py:1607-1617, 1751-1811, 1819-1825, 1874-1900; "
                      "v1/core/sched/scheduler.py:2646-2658, 3055-3056"),
            Behaviour("a caller cancelled before add_request returned is not aborted "
                      "(q is None); an ADD never sent leaves its state registered (#57061)",
                      "v1/engine/async_llm.py:578-584, 772-809"),
            Behaviour("pause_generation(mode='abort') finishes every request with an ABORT "
                      "output and rejects new adds with a retryable ERROR until resume; "
                      "mode='keep' freezes the queues (PAUSED_ALL)",
                      "v1/engine/core.py:1796-1813, 2181-2233, 2249-2279; "
                      "v1/core/sched/scheduler.py:723-725, 1050-1066"),
            Behaviour("streaming-input sessions (#28973): chunks re-use the session's internal "
                      "ID with resumable=True; the frontend queues them as streaming updates, "
                      "the scheduler resumes the session with each (or queues it while a "
                      "chunk runs) and ends it on the final non-resumable add; a "
                      "non-resumable duplicate of any other live ID still asserts",
                      "v1/engine/async_llm.py:590-700; output_processor.py:695-726, 844-882; "
                      "v1/core/sched/scheduler.py:1879-1918, 2717-2742, 2931-2945"),
            Behaviour("an exception preprocessing an ADD in the input thread sends an ERROR "
                      "output at once; the request never reaches the scheduler",
                      "v1/engine/core.py:2016-2020, 2161-2168"),
            Behaviour("a failed remote KV read: kv_load_failure_policy='fail' (default) "
                      "finishes the request with an ERROR output; 'recompute' recomputes the "
                      "prompt locally", "v1/core/sched/scheduler.py:2292-2305, 2556-2575, "
                      "3476-3497, 3682-3694; config/kv_transfer.py:88"),
            Behaviour("fault tolerance (enable_fault_tolerance, off by default): an exception "
                      "in the busy loop aborts every request with ABORT outputs and waits up "
                      "to 120 s for a retry, which discards the batches in flight and resumes "
                      "the loop; no retry, the engine dies",
                      "config/parallel.py:466, 530-535; v1/fault_tolerance/"
                      "engine_core_sentinel.py:82-169, 207-231; config/fault_tolerance.py:12"),
            Behaviour("an ADD or ABORT sent to an engine core that is not connected is "
                      "dropped (ROUTER socket, no ROUTER_MANDATORY)",
                      "utils/network_utils.py:363-377; v1/engine/core_client.py:1293-1300"),
            Behaviour("the HTTP layer names requests chatcmpl-{id}, cmpl-{id}-{i} or "
                      "generate-tokens-{id} from X-Request-Id (else the body's request_id); "
                      "the routers' /abort_requests abort by external ID, the RL router's "
                      "abort-all by internal ID",
                      "entrypoints/serve/engine/serving.py:133-142; openai/chat_completion/"
                      "serving.py:320-322; openai/completion/serving.py:147, 183; scale_out/"
                      "token_in_token_out/serving.py:202-204, api_router.py:79-104; "
                      "rl/online/api_router.py:97-132"),
            _WIDTH_SOURCES,
        ),
    ),
}
