"""Version profiles of the releases between the seed's era (``0.8``) and the newest (``0.33``).

Each is 0.33's profile with what that release does differently, every difference cited by
file:line in that release's wheel (paths under ``vllm/``). A field not listed here was checked to
be as in 0.33 where a citation says so, and is otherwise marked unverified in ``behaviours``.
Releases whose frontend and IPC do not differ share their semantics: ``0.11`` is ``0.10`` under
its own name (one profile per supported release name, so a counterexample names its release).

Names: a profile is named by its release's major.minor (``0.20``); ``--vllm`` and ``[engine]
vllm`` also take the full release (``0.20.0``), see :data:`RELEASES`.

Features the model follows for 0.33 only (data parallelism's client, and for some releases
pause_generation's PauseState, the input thread's preprocess ERROR and the KV load failure
policy) are left out of an older profile's ``features`` unless checked there, so a scenario
that needs one is refused on that release in one line (exit 2), as a model-only refusal is.
"""

from __future__ import annotations

from dataclasses import replace

from racesim.engine_model.profile_types import Behaviour, VllmProfile

__all__ = ["RELEASES", "release_profiles"]

#: profile name -> the vLLM release it follows (the one supported patch), in release order.
#: "0.8" follows the code at f90d34b (March 2025), not a published patch release.
RELEASES: dict[str, str] = {"0.8": "", "0.9": "0.9.2", "0.10": "0.10.1.1", "0.11": "0.11.0",
                            "0.14": "0.14.0", "0.20": "0.20.0", "0.33": "0.33.0"}

_SAME_WIDTHS = Behaviour(
    "await widths as 0.33: the ADD/ABORT send is an eager pyzmq send on a ROUTER with "
    "SNDHWM=0, and the output handler yields between chunks of "
    "VLLM_V1_OUTPUT_PROC_CHUNK_SIZE=128",
    "0.9.2 utils/__init__.py:2585, envs.py:105; 0.10.1.1 utils/__init__.py:2849, envs.py:113; "
    "0.14.0 utils/network_utils.py:288; 0.20.0 utils/network_utils.py:315")

_NOT_MODELLED = Behaviour(
    "not modelled for this release (a scenario needing it is refused): data parallelism "
    "(its DP client and waves differ from 0.33's; unverified), pause_generation",
    "0.14.0 v1/engine/__init__.py:204 (START_DP_WAVE); 0.14.0 v1/engine/async_llm.py:565")

_NOT_MODELLED_020 = Behaviour(
    "not modelled for this release (a scenario needing it is refused): data parallelism "
    "(its DP client and waves differ from 0.33's; unverified)",
    "0.20.0 v1/engine/core.py:1675-1689 (start_wave)")

_KV_IDLE_BLOCKS = Behaviour(
    "P/D: a request held for the decode side (or an aborted one waiting for its read) is in "
    "no queue, so an engine with only such requests blocks on its input queue: a notice or a "
    "timeout is seen at the next request's step (0.33 counts them and keeps stepping)",
    "0.9.2 v1/engine/core.py:608-616, v1/core/sched/scheduler.py:998-1002; "
    "0.10.1.1 v1/engine/core.py:722-731, v1/core/sched/scheduler.py:1040-1044; 0.11.0 "
    "v1/engine/core.py:730-740; 0.14.0 v1/engine/core.py:958-966, "
    "v1/core/sched/scheduler.py:1514-1518; 0.20.0 v1/engine/core.py:1152-1158, "
    "v1/core/sched/scheduler.py:1856-1869")



def release_profiles(p033: VllmProfile) -> dict[str, VllmProfile]:
    """The profiles of 0.9, 0.10, 0.11, 0.14 and 0.20, built from 0.33's."""
    p010 = replace(
        p033, name="0.10",
        release="vLLM 0.10.1.1 (2025-08): one request ID end to end, sync scheduling, one "
                "input queue",
        duplicate_add="overwrite", frontend_duplicate="reject",
        abort_unknown_external="as-internal", async_scheduling=False, eager_aborts=False,
        idle_clears_aborts=False, pd_hold="timeout", hold_timeout=120.0,
        remote_kv_abort="free-now", prefix_caching=True, free_order="append",
        # #19223 (0.10.1.1 nixl_connector.py:386-395): an aborted, never-scheduled decode
        # request still notifies P
        # #25067 came after 0.11.0: an ABORT re-finishes a finished, held request
        # kv-idle-blocks: an engine holding only finished requests for the decode side does
        # not step (0.10.1.1 v1/engine/core.py:722-731); 0.33 keeps stepping
        # "runner-duplicate-row": a second request under an ID that keeps its row in the
        # runner's persistent batch gets a row of its own, and _prepare_inputs raises
        # (engine_model/runner.py)
        # "batch-queue-drops-empty": step_with_batch_queue submits no batch without tokens
        # (0.10.1.1 v1/engine/core.py:319-346; 0.9.2 :264-272), 0.11 submits every output
        features=frozenset({"pd-abort-notify", "reabort-held", "kv-idle-blocks",
                            "runner-duplicate-row", "batch-queue-drops-empty",
                            "runner-no-carry"}),
        cancel_before_collector="abort",
        fan_out="per-child",
        pd_held_finishes=frozenset({"FINISHED_LENGTH_CAPPED"}), external_abort_parent="drop",
        behaviours=(
            Behaviour("Scheduler.add_request overwrites requests[id] with no check; the old "
                      "object stays in its queue", "0.10.1.1 v1/core/sched/scheduler.py:970-973 "
                      "(0.11.0 the same at :1097-1100)"),
            Behaviour("OutputProcessor.add_request raises 'Request id ... already running' for "
                      "a held ID", "0.10.1.1 v1/engine/output_processor.py:333-335"),
            Behaviour("a re-added ID scheduled while the old request's row stays in the model "
                      "runner's persistent batch gets a second row, and the step dies in "
                      "_prepare_inputs (ValueError; vLLM 0.11.0's own runner on the vllm "
                      "backend, the same code in 0.10.1.1)",
                      "0.11.0 v1/worker/gpu_model_runner.py:557-564, 652-657, 694-695, 952; "
                      "0.10.1.1 :457-459, 582-587, 622-624, 718"),
            Behaviour("no external/internal ID split: Processor passes the caller's ID "
                      "through; an abort names that ID (a parent's ID aborts its children and "
                      "drops the parent)", "0.11.0 v1/engine/output_processor.py:325-353"),
            Behaviour("synchronous scheduling by default", "0.10.1.1 config/scheduler.py:155"),
            Behaviour("one input queue: an ABORT is applied only between steps (no "
                      "aborts_queue)", "0.10.1.1 v1/engine/core.py (no aborts_queue)"),
            Behaviour("a cancelled generate() aborts the request ID unconditionally",
                      "0.11.0 v1/engine/async_llm.py:397-398"),
            Behaviour("n > 1: each child is registered and its ADD sent before the next",
                      "0.11.0 v1/engine/async_llm.py:292-318"),
            Behaviour("prefix caching on by default for V1; freed blocks are appended to the "
                      "free queue", "0.10.1.1 engine/arg_utils.py:1593-1594, "
                      "v1/core/block_pool.py:240-255"),
            Behaviour("P/D: the prefill side holds LENGTH_CAPPED requests' blocks for "
                      "VLLM_NIXL_ABORT_REQUEST_TIMEOUT=120 s; an aborted request waiting for "
                      "remote KV is freed at once", "0.10.1.1 envs.py:155, "
                      "kv_connector/v1/nixl_connector.py:398, v1/core/sched/scheduler.py:999 "
                      "(finish_requests)"),
            _KV_IDLE_BLOCKS,
            _NOT_MODELLED, _SAME_WIDTHS,
        ))
    p011 = replace(p010, name="0.11",
                   release="vLLM 0.11.0 (2025-10): 0.10's lifecycle semantics",
                   # #25844: finished_sending for a freed request is a warning
                   # (0.11.0 v1/core/sched/scheduler.py:1291-1294)
                   # a step with no tokens keeps the runner's last sampled tokens for the
                   # next one (engine_model/runner.py): #29355's carry-over
                   features=(p010.features - {"batch-queue-drops-empty", "runner-no-carry"})
                   | {"xfer-unknown-warns", "runner-carry-persists"},
                   behaviours=p010.behaviours + (Behaviour(
                       "async scheduling: a step with nothing to compute keeps the runner's "
                       "last sampled tokens, which the next step feeds by ID, a re-added ID's "
                       "prefill included (#29355)", "0.11.0 v1/worker/gpu_model_runner.py:"
                       "849-860, 2163-2170, 2241-2246"),))

    p09 = replace(
        p010, name="0.9",
        release="vLLM 0.9.2 (2025-07): 0.10's lifecycle semantics, no async scheduling, no "
                "final output for a frontend abort",
        abort_final_output=False,
        # the KV cache manager keeps block hashes by request ID (kv_cache_manager.py:112,
        # 158-163, 373): a duplicate ADD looks its prompt up in the first request's hashes
        features=p010.features | {"block-hashes-by-id"},
        pd_unverified="0.9.2's NIXL connector is not modelled: this profile keeps 0.10's hold",
        behaviours=(
            Behaviour("as 0.10: add_request overwrites requests[id]; the OutputProcessor "
                      "raises 'already running'; one ID end to end; a cancelled generate() "
                      "aborts its ID; n > 1 registers and sends each child in turn",
                      "0.9.2 v1/core/sched/scheduler.py:927-931, "
                      "v1/engine/output_processor.py:301-328, v1/engine/async_llm.py:246, "
                      "336-337"),
            Behaviour("an abort in the frontend pops the request's state and gives its "
                      "client no final output (0.10 added the final 'abort' output, #22283)",
                      "0.9.2 v1/engine/output_processor.py:301-316"),
            Behaviour("no AsyncScheduler: synchronous scheduling only (a scenario setting "
                      "async_scheduling is refused on the vllm backend)",
                      "0.9.2 v1/core/sched/ (no async_scheduler.py)"),
            Behaviour("freed blocks are appended to the free queue",
                      "0.9.2 v1/core/block_pool.py:291"),
            Behaviour("a re-added ID scheduled while the old request's row stays in the "
                      "model runner's persistent batch gets a second row, and the step dies in "
                      "_prepare_inputs (ValueError; derived from the code, as 0.10)",
                      "0.9.2 v1/worker/gpu_model_runner.py:392-394, 507-512, 547-549, 607"),
            Behaviour("block hashes are kept by request ID in the KV cache manager: a "
                      "duplicate ADD finds the first request's cached blocks as a prefix hit "
                      "and the engine dies on assert len(new_computed_blocks) == 0",
                      "0.9.2 v1/core/kv_cache_manager.py:112, 158-163, 373; "
                      "single_type_kv_cache_manager.py:105"),
            Behaviour("P/D: unverified for 0.9 (0.10's NIXL hold is kept; 0.9.2 has no "
                      "VLLM_NIXL_ABORT_REQUEST_TIMEOUT)", "0.9.2 envs.py"),
            _KV_IDLE_BLOCKS,
            _NOT_MODELLED, _SAME_WIDTHS,
        ))
    p014 = replace(
        p033, name="0.14",
        release="vLLM 0.14.0 (2026-01): internal request IDs, async scheduling, aborts in two "
                "queues; no streaming sessions yet",
        duplicate_add="overwrite", frontend_duplicate="reject", pd_hold="timeout",
        hold_timeout=480.0, remote_kv_abort="free-now", free_order="append",
        # a re-added ID's second row in the runner's batch: as 0.10 (0.14.0
        # v1/worker/gpu_model_runner.py:878-883, 1061-1062, 1371), measured on its own runner
        features=frozenset({"preprocess-error", "pd-abort-notify", "kv-idle-blocks",
                            "runner-duplicate-row", "runner-carry-drops-finished"}),
        fan_out="per-child",
        pd_held_finishes=frozenset({"FINISHED_LENGTH_CAPPED"}),
        behaviours=(
            Behaviour("Scheduler.add_request overwrites requests[id] with no check; a re-added "
                      "ID scheduled while the old request's row stays in the runner's batch "
                      "gets a second row, and the step dies in _prepare_inputs (ValueError)",
                      "0.14.0 v1/core/sched/scheduler.py:1446-1450; "
                      "v1/worker/gpu_model_runner.py:878-883, 1061-1062, 1371"),
            Behaviour("OutputProcessor.add_request raises 'Request id ... already running' "
                      "for a held internal ID", "0.14.0 v1/engine/output_processor.py:467-468"),
            Behaviour("internal IDs: InputProcessor.assign_request_id appends 8 random hex "
                      "characters; an unknown external ID in an abort does nothing; an abort "
                      "by external ID leaves an n > 1 parent in parent_requests",
                      "0.14.0 v1/engine/input_processor.py:434-444, "
                      "v1/engine/output_processor.py:393-452"),
            Behaviour("async scheduling is on by default",
                      "0.14.0 config/vllm.py:588-620"),
            Behaviour("an ABORT goes to aborts_queue and input_queue; aborts_queue is cleared "
                      "when the busy loop is idle",
                      "0.14.0 v1/engine/core.py:211, 530-531, 966-971, 1139-1144"),
            Behaviour("a caller cancelled before add_request returned is not aborted "
                      "(q is None)", "0.14.0 v1/engine/async_llm.py:417, 448-449"),
            Behaviour("n > 1: each child is registered and its ADD sent before the next",
                      "0.14.0 v1/engine/async_llm.py:355-376"),
            Behaviour("freed blocks are appended to the free queue",
                      "0.14.0 v1/core/block_pool.py:400"),
            Behaviour("P/D: LENGTH_CAPPED requests' blocks held for "
                      "VLLM_NIXL_ABORT_REQUEST_TIMEOUT=480 s; an aborted request waiting for "
                      "remote KV is freed at once (no delay_free_blocks in finish_requests)",
                      "0.14.0 envs.py:206, nixl_connector.py:770, "
                      "v1/core/sched/scheduler.py:1452-1510"),
            _KV_IDLE_BLOCKS,
            Behaviour("an exception preprocessing an ADD sends an ERROR output",
                      "0.14.0 v1/engine/core.py:1134"),
            Behaviour("not modelled for 0.14: kv_load_failure_policy (its default is "
                      "'recompute', 0.33's 'fail')", "0.14.0 config/kv_transfer.py:67"),
            _NOT_MODELLED, _SAME_WIDTHS,
        ))
    p020 = replace(
        p033, name="0.20",
        release="vLLM 0.20.0 (2026-04): streaming-input sessions and the duplicate-ID assert",
        pd_hold="timeout", hold_timeout=480.0, free_order="append",
        features=frozenset({"preprocess-error", "kv-load-failure", "streaming-input",
                            "pd-abort-notify", "kv-idle-blocks",
                            "runner-carry-drops-finished", "pause", "pause-vllm-only"}),
        fan_out="per-child", pd_held_finishes=frozenset({"FINISHED_LENGTH_CAPPED"}),
        behaviours=(
            Behaviour("Scheduler.add_request asserts 'duplicate request id' for a held ID that "
                      "is not a streaming session", "0.20.0 v1/core/sched/scheduler.py:1741-1755"),
            Behaviour("OutputProcessor.add_request of a held internal ID is a streaming "
                      "update (the old stream ends)",
                      "0.20.0 v1/engine/output_processor.py:517-520"),
            Behaviour("async scheduling on by default; aborts in two queues, cleared when "
                      "idle", "0.20.0 config/vllm.py:798-820; v1/engine/core.py:218, 564-565, "
                      "1184"),
            Behaviour("n > 1: each child is registered and its ADD sent before the next",
                      "0.20.0 v1/engine/async_llm.py:385-406"),
            Behaviour("a caller cancelled before add_request returned is not aborted",
                      "0.20.0 v1/engine/async_llm.py:553, 586-587"),
            Behaviour("freed blocks are appended to the free queue",
                      "0.20.0 v1/core/block_pool.py:420"),
            Behaviour("P/D: LENGTH_CAPPED requests' blocks held for "
                      "VLLM_NIXL_ABORT_REQUEST_TIMEOUT=480 s; an aborted request waiting for "
                      "remote KV keeps its blocks until the read completes",
                      "0.20.0 envs.py:205, kv_connector/v1/nixl/scheduler.py:466, "
                      "v1/core/sched/scheduler.py:1812-1822"),
            _KV_IDLE_BLOCKS,
            Behaviour("kv_load_failure_policy defaults to 'fail'",
                      "0.20.0 config/kv_transfer.py:70"),
            Behaviour("pause_generation is the engine's pause_scheduler: 'abort' finishes "
                      "every request with an ABORT output, 'keep' freezes the queues "
                      "(PAUSED_ALL); adds while paused are queued, not rejected (0.33 rejects "
                      "them in 'abort' mode). Runs on the vllm backend only: the model's pause "
                      "follows 0.33 (on pause-abort-reuse 0.20 applies the aborted X's "
                      "in-flight output to the queued retry and dies on the placeholder "
                      "assert; the model does not)",
                      "0.20.0 v1/engine/async_llm.py:718-759, v1/engine/core.py:1542-1581; "
                      "v1/core/sched/scheduler.py:372-374, 568, 1856-1866"),
            _NOT_MODELLED_020, _SAME_WIDTHS,
        ))
    return {"0.9": p09, "0.10": p010, "0.11": p011, "0.14": p014, "0.20": p020}
