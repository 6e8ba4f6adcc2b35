"""An EngineCore whose engine-side state is vLLM's own: its Scheduler and KVCacheManager.

The simulated parts are the model's: the process shell (racesim.engine_model.engine_shell: the
input thread, ``engine.input:preprocess``, the eager ``aborts_queue``'s copies, the idle wait,
the GPU timing, ``engine.step:execute``, and death). Each pass of the busy loop is the release's
own ``_process_input_queue`` with ``_handle_client_request``
(racesim.engine_vllm.engine.inputs), then its ``EngineCore.step`` / ``step_with_batch_queue``
with ``_process_aborts_queue`` and ``post_step`` (racesim.engine_vllm.engine.stepper), which
call the Scheduler's ``add_request``, ``schedule`` and ``update_from_output`` through this
core's bookkeeping (the trace, the block-table shadow, ``engine.step:update_from_output``). The
executor (racesim.engine_vllm.engine.executor) steps vLLM's own model runner; its sampled tokens
carry their incarnation through ``Vocabulary``. An exception from vLLM's code is what kills
EngineCoreProc (core.py:1582-1587): the engine dies.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from racesim.engine_model.config import EngineConfig
from racesim.engine_model.engine_shell import EngineShell
from racesim.engine_model.events.engine import (
    SchedAdd, SchedFinish, SchedPreempt, SchedStep, SchedUpdate)
from racesim.engine_model.messages import (
    AbortMessage, EngineCoreRequest, KVDoneNotice, KVHeartbeat)
from racesim.engine_model.versions import VllmProfile
from racesim.engine_vllm import _vllm
from racesim.engine_vllm.connectors import new_transport, pd
from racesim.engine_vllm.engine import finishes, sessions
from racesim.engine_vllm.engine.executor import Executor
from racesim.engine_vllm.engine.stepper import Stepper
from racesim.engine_vllm.frontend import EngineCoreOutputs, Envelope
from racesim.engine_vllm.connectors.nixl import NixlFabric, NixlTransport
from racesim.engine_vllm.oracle import vllm_raise
from racesim.engine_vllm.engine.views import (
    EosIds, KvShadow, PromptTokens, SchedulerView, Vocabulary)
from racesim.sim.world import World

__all__ = ["VllmEngineCore"]

_EOS = EosIds([Vocabulary.BASE + 1])
_REASON = {"STOP": "stop", "LENGTH": "length", "ABORT": "abort", "ERROR": "error"}


def _reason(finish: Any) -> str | None:
    """vLLM's FinishReason as the trace writes it (its ``__str__``: "stop", "length", ...)."""
    return str(finish) if finish is not None else None


class _Fatal(Exception):
    """An exception raised by vLLM's code inside the engine: EngineCoreProc dies of it (the
    shell's busy loop catches this, not the model's EngineFatal). ``where`` is vLLM's
    ``file:line`` (relative to the vllm package) when vLLM's code raised it."""

    def __init__(self, message: str, where: str | None = None) -> None:
        super().__init__(message)
        self.where = where


class VllmEngineCore(EngineShell):
    """One engine process running vLLM's Scheduler; ``index`` is its place in the system, and
    with ``dp`` a DP rank (its Scheduler lists each client's finished IDs, core.py:1219-1238)."""

    def __init__(self, world: World, index: int, name: str, config: EngineConfig,
                 policy: Any, profile: VllmProfile, *, max_model_len: int,
                 vocab: Vocabulary | None = None, dp: bool = False,
                 pd: tuple[str, NixlFabric, int, float] | None = None,
                 runner: str | None = None) -> None:
        super().__init__(world, index, name, config, profile, _Fatal)
        self.policy = policy
        self.v = _vllm.vllm()
        kv_transfer = None
        if pd is not None:  # P/D: "prefill" or "decode", the fabric, the lease, the read time
            kv_transfer = ("kv_producer" if pd[0] == "prefill" else "kv_consumer", pd[0], pd[2],
                           config.kv_load_failure_policy or "fail", pd[1].connector_class)
        shape = _vllm.VllmEngineShape(config.num_blocks, config.block_size, config.max_num_seqs,
                                      config.max_num_batched_tokens, max_model_len,
                                      bool(config.async_scheduling), bool(config.prefix_caching),
                                      kv_transfer, pd[1].extra_config if pd is not None else (),
                                      config.num_speculative_tokens or 0)
        self.sched = _vllm.new_scheduler(shape, include_finished_set=dp)
        #: ground truth by object: id(Request) -> (the Request, its incarnation); id of its
        #: SamplingParams -> (them, eos_at): a session's chunk brings its own (scheduler.py:1913)
        self._truth: dict[int, tuple[Any, int]] = {}
        self._eos: dict[int, tuple[Any, int | None]] = {}
        self.kv = KvShadow(world, f"{name}.kv", self.sched.kv_cache_manager, self._inc_of_id,
                           shape.prefix_caching, self.inc_of)
        self._prompts = PromptTokens()
        self.scheduler = SchedulerView(self.sched, self.inc_of)
        self.vocab = vocab if vocab is not None else Vocabulary()  # DP: the ranks share one
        #: execute_model / sample_tokens: vLLM's own model runner (0.10.1.1+), or the model's
        #: (before 0.10, or asked for: ``runner`` "model", RACESIM_VLLM_RUNNER)
        self.runner = Executor(self, shape, bool(config.async_scheduling),
                               "runner-duplicate-row" in profile.features, runner,
                               profile.features)
        self.coordinator: Any = None  # DP: told after each step (the model's DPCoordinator)
        #: what the last update_from_output finished and scheduled, until its outputs are sent
        self._pending: tuple[dict[str, int], dict[str, Any], bool] | None = None
        self._step_no = 0
        #: before 0.14 schedule() does not list its preemptions: diff the running queue
        self._snapshot_running = not self.v.api.lists_preemptions
        self._sessions = self.v.api.streaming  # Request.streaming_queue: 0.20+
        self.c_sched = f"{name}.scheduler"
        #: P/D: the simulated NIXL worker (also what wakes an idle busy loop for leases and
        #: heartbeats, as the model's connector does); id(Request) -> (it, the prefill
        #: incarnation its kv_transfer_params came from, its scripted fault)
        self.transport: NixlTransport | None = None
        self._remote: dict[int, tuple[Any, int, str]] = {}
        self.fabric: NixlFabric | None = None
        if pd is not None:
            self.fabric = pd[1]
            self.transport = new_transport(pd[1], self, pd[0], pd[2], pd[3])
            self.connector = self.transport  # type: ignore[assignment]
        from racesim.engine_vllm import journal  # racesim repro: off unless recording

        if (j := journal.active()) is not None:
            j.attach(self, shape, dp)
        # vLLM's own step, over the Scheduler's methods as the journal (if any) wrapped them
        self.stepper = Stepper(self, _vllm._config(shape)[0], self._max_batches)
        self.start()

    # -- ground truth ---------------------------------------------------------------------------

    def inc_of(self, req: Any) -> int:
        entry = self._truth.get(id(req))
        return entry[1] if entry is not None and entry[0] is req else 0

    def _inc_of_id(self, rid: str) -> int:
        req = self.sched.requests.get(rid)
        return self.inc_of(req) if req is not None else 0

    # -- the shell's hooks ----------------------------------------------------------------------

    def _preprocess(self, msg: EngineCoreRequest) -> Any:
        """preprocess_add_request: the vLLM Request, its incarnation kept by the object."""
        params = self.fabric.to_decode(msg.kv_transfer_params) if self.fabric else None
        req = _vllm.new_request(msg.request_id, self._prompts.ids(msg), msg.max_tokens,
                                msg.client_index, float(self.world.now), self.config.block_size,
                                _EOS, msg.resumable, params)
        req.abort_immediately = msg.fault == "abort-immediately"
        self._truth[id(req)] = (req, msg.inc)
        if params is not None and msg.kv_transfer_params is not None:
            self._remote[id(req)] = (req, msg.kv_transfer_params.remote_inc, msg.fault)
        self._eos[id(req.sampling_params)] = (req.sampling_params, msg.eos_at)
        return req

    def deliver_vllm(self, request_type: Any, request: Any, truth: Any) -> None:
        """vLLM's decoded ``(EngineCoreRequestType, request)``, ground truth beside (SEAMS.md)."""
        from racesim.engine_vllm.frontend.engine_side import to_shell
        if (msg := to_shell(self, request_type, request, truth)) is not None:
            self.deliver(msg)

    def _reject(self, rid: str, inc: int, client: int, why: str) -> None:
        finishes.reject(self, rid, inc, client, why)

    def _has_work(self) -> bool:
        return bool(self.sched.has_requests() or self.stepper.in_flight())

    def call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # EngineCoreProc dies of anything its step raises
            self.kv.sync()  # what the call did to the block tables before it raised
            raised = vllm_raise(exc)
            raise _Fatal(raised.message, raised.where) from None

    def _add(self, req: Any) -> None:
        """``Scheduler.add_request`` as vLLM's ``EngineCore.add_request`` calls it (the stepper
        puts this in its place), traced."""
        rid = req.request_id
        prev = self.sched.requests.get(rid)
        add = self.stepper.real_add
        if prev is not None and self.v.api.streaming:
            # a session's streaming update, or the duplicate-ID assert (0.20+)
            sessions.add_held(self, prev, req, add)
            return
        # before 0.20, add_request overwrites requests[id] with no check; the old object stays
        # in its queue (0.14.0 scheduler.py add_request)
        self.call(add, req)
        self.world.emit(self.c_sched, rid, self.inc_of(req),
                        SchedAdd(self.inc_of(prev) if prev is not None else 0))

    def _abort(self, msg: AbortMessage, cause: str) -> None:
        finishes.abort(self, msg, cause)

    def _abort_all_for_fault(self) -> None:
        finishes.abort_all(self, "fault")

    def _drain_batches(self) -> list[int]:
        """``_drain_batch_queue`` (engine_core_sentinel.py:109-140): without a KV connector
        nothing of a batch in flight reaches the Scheduler."""
        return self.stepper.drain()

    # -- steps ----------------------------------------------------------------------------------

    def _run_busy_loop(self) -> Generator[simpy.Event, Any, None]:
        """``run_busy_loop``: passes of the release's own ``_process_input_queue`` and step
        (stepper.py, inputs.py) until the engine dies."""
        while self.dead is None:
            yield from self.stepper.run_pass()

    def gpu_idle(self) -> bool:
        """No batch is on the GPU queue now."""
        return self._gpu_free_at <= self.world.now

    def _synced_schedule(self, so: Any, running: list[Any]) -> None:
        """The block tables and preemptions of one ``schedule()``: a new table's leading blocks
        are the prefix hits, the tokens it had computed before this step."""
        requests = self.sched.requests
        bs = self.config.block_size
        hits = {}
        if self.kv.caching:
            for rid, n in so.num_scheduled_tokens.items():
                req = requests.get(rid)
                if req is not None and req.num_computed_tokens > n:
                    hits[rid] = (req.num_computed_tokens - n) // bs
        self.kv.sync(None, hits)
        for rid in self.v.api.preempted(so, running):
            req = requests.get(rid)
            if req is not None:
                # scheduler.py:1799-1843: blocks freed, recomputed from waiting; output in
                # flight (async) is stale (a count kept from 0.33 on)
                stale = getattr(req, "num_stale_output_tokens", 0)
                self.world.emit(self.c_sched, rid, self.inc_of(req),
                                SchedPreempt(stale if stale else None))

    def _record_step(self, so: Any, step: int) -> None:
        requests = self.sched.requests
        batch = [[rid, self.inc_of(requests.get(rid)), n]
                 for rid, n in so.num_scheduled_tokens.items()]
        self.world.emit(self.c_sched, None, 0,
                        SchedStep(step, batch, sorted(so.finished_req_ids)))

    def _update(self, so: Any, mro: Any, step: int | None) -> Any:
        """The real ``update_from_output`` (vLLM's step calls this through the stepper's
        wrapper), traced; its outputs are sent once the step returns them (:meth:`_send`)."""
        requests = self.sched.requests
        objects = {rid: requests.get(rid) for rid in so.num_scheduled_tokens}
        before = {rid: (len(r.output_token_ids) if r is not None else 0)
                  for rid, r in objects.items()}
        ending: dict[str, tuple[Any, int, str]] = {}
        watch: dict[str, Any] = {}
        was_finished: dict[str, bool] = {}
        if self.transport is not None:
            ending = pd.releases(self, mro.kv_connector_output)
            # a failed load finishes an unscheduled request (scheduler.py:2552-2579)
            watch = {rid: r for rid, r in requests.items()
                     if rid not in objects and not r.is_finished()}
            was_finished = {rid: r.is_finished() for rid, r in objects.items() if r is not None}
        outs = self.call(self.stepper.real_update, so, mro)
        by_session = sessions.session_outputs(objects, outs) if self._sessions else {}
        vocab = self.vocab
        applied = []
        finished: dict[str, int] = {}
        for rid, req in objects.items():
            if req is None:
                continue
            inc = self.inc_of(req)
            out = by_session.get(rid)
            for t in req.output_token_ids[before[rid]:] if out is None else out.new_token_ids:
                token = vocab.decode(t)
                applied.append([rid, inc, token.inc, token.ctx])
            if out is not None and out.finish_reason is not None and not req.is_finished():
                sessions.chunk_stopped(self, req, inc)
            if req.is_finished() and (requests.get(rid) is not req or (
                    rid in was_finished and not was_finished[rid])):  # P/D: held on finish
                finished[rid] = inc
                reason = _REASON.get(req.get_finished_reason().name, "stop")
                self.world.emit(self.c_sched, rid, inc, SchedFinish(req.status.name, reason))
        if watch:
            pd.unscheduled_finishes(self, watch, finished)
        released = pd.record_releases(self, ending)
        if finished or released:  # update_from_output frees only the blocks of requests it
            # finished, and of held ones whose transfer ended
            self.kv.sync({**released, **finished})
        if objects:
            self.world.emit(self.c_sched, None, 0, SchedUpdate(step, applied))
        self._pending = (finished, objects, step is not None)
        return outs

    def _send(self, outs: Any) -> None:
        """``_process_engine_step`` puts the step's outputs on the output queue: the frontend's
        channel, incarnations beside them."""
        if self._pending is None:
            return
        finished, objects, traced = self._pending
        self._pending = None
        for client in sorted(outs or {}):
            real = outs[client]
            channel = self.output_channels.get(client)
            done = sorted(real.finished_requests or ())  # a set: sorted for the trace
            if channel is None or not (real.outputs or done):
                continue
            # vLLM's own outputs go to the frontend; their incarnations ride beside them
            envelopes = tuple(
                Envelope(o, finished.get(o.request_id) or self.inc_of(objects.get(o.request_id)))
                for o in real.outputs)
            channel.send(EngineCoreOutputs(self.index, envelopes, real),
                         [e.output.request_id for e in envelopes] or done,
                         outputs=[[e.output.request_id, e.inc, len(e.output.new_token_ids),
                                   _reason(e.output.finish_reason)] for e in envelopes],
                         finished=done or None)
        if traced and self.coordinator is not None:
            self.coordinator.note_change()

    # -- P/D (racesim.engine_vllm.connectors.nixl drives these) -------------------------------

    def remote_inc(self, req: Any) -> int:
        """The prefill incarnation whose blocks ``req``'s kv_transfer_params name."""
        entry = self._remote.get(id(req))
        return entry[1] if entry is not None and entry[0] is req else 0

    def read_fails(self, req: Any) -> bool:
        entry = self._remote.get(id(req))
        return entry is not None and entry[0] is req and entry[2] == "kv-load"

    def send_kv_notice(self, engine: int, notice: KVDoneNotice) -> None:
        channel = self.notify_channels.get(engine)
        if channel is not None:
            channel.send(notice, [notice.request_id], remote_inc=notice.remote_inc)

    def send_kv_heartbeat(self, engine: int, request_ids: tuple[str, ...]) -> None:
        channel = self.notify_channels.get(engine)
        if channel is not None:
            channel.send(KVHeartbeat(request_ids), list(request_ids))

    def deliver_push_done(self, notice: KVDoneNotice) -> None:
        """D, NIXL push mode: P's WRITE notification arrived."""
        if self.dead is not None or self.transport is None:
            return
        self.transport.deliver_write_notice(notice)  # type: ignore[attr-defined]

    def deliver_kv_notice(self, notice: KVDoneNotice | KVHeartbeat) -> None:
        """Prefill side: a transfer-done notice or heartbeat from the decode side."""
        if self.dead is not None or self.transport is None:
            return
        self.transport.deliver(notice)
        self._wake_loop()

    def wake(self) -> None:
        self._wake_loop()
