"""vLLM's own ``EngineCore.step`` / ``step_with_batch_queue``, ``_process_aborts_queue`` and
``post_step``, run in a greenlet.

The step is the release's code, called on a facade: an ``EngineCoreProc`` made with
``object.__new__`` that holds only what those methods read (the real Scheduler, a batch queue
built as the release's ``EngineCore.__init__`` builds it, the eager ``aborts_queue``, the
executor below, and the input side of racesim.engine_vllm.engine.inputs: each pass of the busy
loop runs the release's ``_process_input_queue`` before the step). Which one runs is the
release's own choice (``step_fn``: the batch queue when the executor's
``max_concurrent_batches`` > 1, 0.20.0 core.py:188-215; on 0.33.0 the ``VllmConfig``'s,
core.py:208-234, config/vllm.py:588-600), and so are its rules on when the runner is called and
when the step blocks (0.10.1.1 core.py:297-346 "no batch without tokens", 0.20.0 core.py:500-507
``done()``, 0.33.0 core.py:764-769 without it).

What stays simulated is time. The executor's ``execute_model`` runs vLLM's runner at once and
returns a future done when the GPU queue reaches the batch (``EngineShell._on_gpu``); a blocking
``result()`` switches from the step's greenlet to the busy loop's simpy process, which yields
that event and switches back. The Scheduler's ``schedule`` and ``update_from_output`` are
wrapped as instance attributes, so vLLM's step calls racesim's bookkeeping (trace events, the
block-table shadow, the ``engine.step:update_from_output`` await point) around the real ones.
A batch with nothing to compute, no finished IDs and no transfer results is untraced: vLLM's
step still runs the runner and ``update_from_output`` on it, but it emits no SchedStep, passes
no await point and carries no transfer results (so schedules and traces stay those of the
steps that do something). ``abort_requests`` is replaced on the facade: it aborts the ABORTs
``_process_aborts_queue`` took one at a time, with their ground truth (racesim's finishes).
``_process_engine_step`` itself is not run: it is the step, the output queue and ``post_step``
(0.20.0 core.py:1205-1222), with a ``time.sleep(0.001)`` spin this loop has no use for.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Generator
from contextlib import nullcontext
from typing import Any

import simpy
from greenlet import getcurrent, greenlet

from racesim.engine_model.messages import AbortMessage
from racesim.engine_vllm.engine import inputs
from racesim.engine_vllm.oracle import StandInGap, raised_by_racesim, vllm_raise

__all__ = ["Stepper"]

#: what the loop's greenlet switches out with at the end of a pass
_PASS_DONE = object()


def _wait(event: simpy.Event | None) -> None:
    """Block the step's greenlet until ``event`` has been processed (the busy loop yields it)."""
    if event is not None and not event.processed:
        getcurrent().parent.switch(event)


class _Batch:
    """One ``execute_model`` call: the runner's output, computed at submission, and the GPU
    event it is ready at (None: ready now, nothing to wait for)."""

    __slots__ = ("stepper", "so", "step", "out", "deferred", "event", "final_out", "kv_out",
                 "kv_error")

    def __init__(self, stepper: Stepper, so: Any, step: int | None, out: Any, deferred: bool,
                 event: simpy.Event | None) -> None:
        self.stepper = stepper
        self.so = so
        self.step = step  # racesim's step number when the step is traced (SchedStep), else None
        self.out = out
        self.deferred = deferred  # execute_model returned None; sample_tokens gives the output
        self.event = event
        self.final_out: Any = None
        self.kv_out: Any = None
        self.kv_error: Exception | None = None

    def collect(self, _event: Any = None) -> None:
        """The worker's ``get_finished`` at the end of its ``execute_model``: the transfers
        that ended by then (a callback of the GPU event: an error is raised where the engine
        takes the result)."""
        core = self.stepper.core
        try:
            self.kv_out = core.call(core.transport.transfer_results, core.v)
        except core._fatal as exc:
            self.kv_error = exc

    def done(self) -> bool:
        return self.event is None or self.event.processed

    def output(self) -> Any:
        """The output ``future.result()`` returns: the async output's ``get_output()``, with
        the worker's transfer results under P/D."""
        _wait(self.event)
        if self.final_out is None:
            if self.kv_error is not None:
                raise self.kv_error
            mro = self.stepper.core.runner.result(self.out)
            if self.kv_out is not None:
                mro.kv_connector_output = self.kv_out
            self.final_out = mro
        return self.final_out


class _Future:
    """The ``Future`` ``execute_model`` / ``sample_tokens(non_block=True)`` return."""

    __slots__ = ("batch", "sampled")

    def __init__(self, batch: _Batch, sampled: bool) -> None:
        self.batch = batch
        self.sampled = sampled

    def done(self) -> bool:
        return self.batch.done()

    def result(self) -> Any:
        batch = self.batch
        if batch.deferred and not self.sampled:
            _wait(batch.event)
            return None
        return batch.output()


class _Executor:
    """The executor vLLM's step calls: vLLM's runner through racesim's Executor, whose forward
    pass takes the GPU's time."""

    def __init__(self, stepper: Stepper, max_concurrent_batches: int, non_block_default: bool):
        self.stepper = stepper
        self.max_concurrent_batches = max_concurrent_batches
        #: before 0.11 MultiprocExecutor.execute_model took no ``non_block``: it returned a
        #: future whenever max_concurrent_batches > 1 (0.10.1.1 multiproc_executor.py:165-190)
        self._non_block_default = non_block_default
        self._last: _Batch | None = None

    def execute_model(self, so: Any, non_block: bool = False) -> Any:
        batch = self.stepper.submit(so)
        self._last = batch
        future = _Future(batch, False)
        if non_block or self._non_block_default:
            return future
        return future.result()

    def sample_tokens(self, grammar_output: Any, non_block: bool = False) -> Any:
        # no structured output is scheduled: the grammar bitmask is None (racesim's runner
        # samples with none)
        batch = self._last
        assert batch is not None and grammar_output is None
        future = _Future(batch, True)
        return future if non_block else future.result()

    def __getattr__(self, name: str) -> Any:
        raise StandInGap.of("executor", name)

    def take_draft_token_ids(self) -> Any:
        core = self.stepper.core
        real = core.runner.real
        if real is None:
            return None
        return core.call(real.runner.take_draft_token_ids)


class _AbortsFeed:
    """``aborts_queue`` as vLLM's ``_process_aborts_queue`` reads it (``empty`` /
    ``get_nowait``), over the shell's eager copies; the messages taken are kept so that
    ``abort_requests`` aborts them one by one, with their ground truth."""

    def __init__(self, shell_queue: deque[AbortMessage]) -> None:
        self.shell_queue = shell_queue
        self.taken: list[AbortMessage] = []
        #: an idle loop clears the queue under its mutex (0.14.0 core.py:969-970)
        self.mutex = nullcontext()
        self.queue = shell_queue

    def empty(self) -> bool:
        return not self.shell_queue

    def get_nowait(self) -> list[str]:
        msg = self.shell_queue.popleft()
        self.taken.append(msg)
        return list(msg.request_ids)


class Stepper:
    """Runs the release's step function for ``core`` (a VllmEngineCore), one pass per
    :meth:`run_pass`."""

    def __init__(self, core: Any, vllm_config: Any, batch_queue_size: int) -> None:
        self.core = core
        v = core.v
        key = v.api.key
        #: id(SchedulerOutput) -> (it, its step number, whether the step is traced)
        self._batch_no: dict[int, tuple[Any, int, bool]] = {}
        self._progressed = False
        #: whether the last pass submitted or applied a traced batch (a pass that did not, and
        #: took no input, is vLLM's spin: the loop waits for a wakeup instead)
        self._last_progressed = True
        self._loop: greenlet | None = None
        self._feed = _AbortsFeed(core.aborts_queue)
        facade = object.__new__(inputs.facade_class())
        self.facade = facade
        self.executor = _Executor(self, batch_queue_size, key < (0, 11) and batch_queue_size > 1)
        d = facade.__dict__
        d["vllm_config"] = vllm_config
        d["scheduler"] = core.sched
        d["model_executor"] = self.executor
        d["batch_queue_size"] = batch_queue_size
        d["batch_queue"] = None
        if batch_queue_size > 1:
            # 0.9.2/0.10.1.1: a queue.Queue (0.10.1.1 core.py:137-143); 0.11+: a deque
            # (0.11.0 core.py:145-152)
            d["batch_queue"] = (queue.Queue(batch_queue_size) if key < (0, 11)
                                else deque(maxlen=batch_queue_size))
        d["aborts_queue"] = self._feed
        d["abort_requests"] = self._abort_requests
        d["async_scheduling"] = bool(core.config.async_scheduling)
        d["use_spec_decode"] = d["check_for_draft_tokens"] = bool(
            core.config.num_speculative_tokens)
        d["is_ec_consumer"] = True  # no EC transfer config (0.20.0 core.py:196-199)
        d["is_ec_producer"] = False
        d["is_mm_encoder_only"] = False
        d["is_pooling_model"] = False
        d["log_stats"] = False
        d["_weight_version"] = "default"  # 0.33.0 core.py:147
        self.inputs = inputs.install(core, facade)
        self._step_fn = (facade.step if batch_queue_size <= 1 else facade.step_with_batch_queue)
        self._post_step = getattr(facade, "post_step", None)  # 0.11+
        sched = core.sched
        self.real_schedule = sched.schedule
        self.real_update = sched.update_from_output
        self.real_add = sched.add_request
        sched.schedule = self._schedule
        sched.update_from_output = self._update_from_output
        sched.add_request = core._add

    # -- the batch queue as the shell sees it ---------------------------------------------------

    def _entries(self) -> list[Any]:
        bq = self.facade.batch_queue
        if bq is None:
            return []
        return list(bq.queue) if isinstance(bq, queue.Queue) else list(bq)

    def in_flight(self) -> bool:
        """A traced batch is queued (an empty one left queued is not work: vLLM's loop would
        spin it out; here the loop idles)."""
        return any(entry[0].batch.step is not None for entry in self._entries())

    def drain(self) -> list[int]:
        """``_drain_batch_queue``: the step numbers of the traced batches discarded."""
        bq = self.facade.batch_queue
        entries = self._entries()
        if not isinstance(bq, queue.Queue):
            entries.reverse()  # appendleft / pop: the oldest is on the right
        steps = [e[0].batch.step for e in entries if e[0].batch.step is not None]
        if isinstance(bq, queue.Queue):
            with bq.mutex:
                bq.queue.clear()
                bq.unfinished_tasks = 0
        elif bq is not None:
            bq.clear()
        self._batch_no.clear()
        return steps

    # -- the wrappers vLLM's step calls ---------------------------------------------------------

    def _schedule(self, *args: Any) -> Any:
        core = self.core
        if core.transport is not None:
            core.transport.before_schedule()
        running = list(core.sched.running) if core._snapshot_running else []
        so = core.call(self.real_schedule, *args)
        core._step_no += 1
        core._synced_schedule(so, running)
        known = self._batch_no
        if len(known) > 16:  # outputs never executed (0.10 drops a batch with no tokens)
            queued = {id(e[1]) for e in self._entries()}
            for key in [k for k in known if k not in queued]:
                del known[key]
        known[id(so)] = (so, core._step_no, False)
        return so

    def submit(self, so: Any) -> _Batch:
        """The worker's side of ``execute_model``: start this step's KV loads, run the runner,
        take the GPU's time when there are tokens to compute. A step is traced (SchedStep) when
        it computes tokens or carries finished IDs or transfer results to the runner."""
        core = self.core
        transport = core.transport
        if transport is not None:
            core.call(transport.start_load_kv, so.kv_connector_metadata)
        executes = so.total_num_scheduled_tokens > 0
        step = None
        entry = self._batch_no.get(id(so))
        if entry is not None and entry[0] is so and (executes or so.finished_req_ids or (
                transport is not None and transport.has_results())):
            step = entry[1]
            self._batch_no[id(so)] = (so, step, True)
            core._record_step(so, step)
            self._progressed = True
        out, deferred = core.runner.execute(so, core._step_no)
        idle = core.gpu_idle()
        if step is None and not executes and idle:
            return _Batch(self, so, None, out, deferred, None)  # nothing to wait for
        batch = _Batch(self, so, step, out, deferred, core._on_gpu(out, executes))
        if transport is not None and step is not None:
            # an untraced batch had no results when it went to the worker and carries none;
            # one with no forward pass on an idle GPU is done as it is submitted
            if not executes and idle:
                batch.collect()
            else:
                batch.event.callbacks.append(batch.collect)
        return batch

    def _abort_requests(self, request_ids: list[str]) -> None:
        """``abort_requests``, one ABORT at a time (``finish_requests`` iterates a set of its
        IDs, whose order would depend on PYTHONHASHSEED): those ``_process_aborts_queue`` took,
        or the one ``_handle_client_request`` is handling."""
        taken = self._feed.taken
        if not taken:
            self.core._abort(*inputs.abort_context(self.inputs, request_ids))
            return
        self._feed.taken = []
        assert [rid for msg in taken for rid in msg.request_ids] == list(request_ids)
        for msg in taken:
            self.core._abort(msg, "abort(eager)")

    def _update_from_output(self, so: Any, mro: Any) -> Any:
        core = self.core
        entry = self._batch_no.pop(id(so), None)
        step = entry[1] if entry is not None and entry[0] is so and entry[2] else None
        if step is not None:
            self._progressed = True
            ev = core.world.sleep("engine.step:update_from_output", 0.0, core.c_core)
            _wait(ev)
        return core._update(so, mro, step)

    # -- one pass of the busy loop --------------------------------------------------------------

    def _run(self) -> None:
        """One pass of ``run_busy_loop``: vLLM's ``_process_input_queue``, then
        ``_process_engine_step`` without its ``time.sleep(0.001)``. A pass that follows one that
        did nothing, and finds no input, is where vLLM spins on ``step()``. With a traced batch
        queued the spin goes on, as vLLM's does: the step queues empty batches until the queue
        is full and then blocks on the oldest (0.33.0 core.py:725-769). With none, nothing
        would change until a wakeup (a request it cannot schedule, a transfer still running):
        the loop waits for one instead, and applies the eager ABORT copies that spin's next
        step would have applied (0.33.0 core.py:690)."""
        core = self.core
        feed = self.inputs
        process_input_queue = self.facade._process_input_queue
        feed.reset()
        process_input_queue()
        if not (self._last_progressed or feed.taken or feed.blocked or self.in_flight()):
            if core.aborts_queue and core._has_work():
                core._process_aborts_queue()
            getcurrent().parent.switch(inputs.IDLE)
            process_input_queue()
        self._progressed = False
        outputs, model_executed = self._step_fn()
        core._send(outputs)
        if self._post_step is not None:
            self._post_step(model_executed)
        self._last_progressed = self._progressed

    def _passes(self) -> None:
        """The busy loop's greenlet: one pass per switch into it (made once, not per pass;
        an exception ends it, and the next pass makes another)."""
        while True:
            self._run()
            getcurrent().parent.switch(_PASS_DONE)

    def run_pass(self) -> Generator[simpy.Event, Any, None]:
        """Run one pass (:meth:`_run`) in the loop's greenlet; its waits are the busy loop's
        (a GPU event, or the idle wait when vLLM blocks on its input queue)."""
        child = self._loop
        if child is None or child.dead:
            child = self._loop = greenlet(self._passes)
        idle = inputs.IDLE
        core = self.core
        event = self._switch(child)
        while event is not _PASS_DONE:
            if event is idle:
                yield from core._idle_wait()
            else:
                yield event
            event = self._switch(child)

    def _switch(self, child: greenlet) -> Any:
        """Run the step until it waits for an event (returned) or ends."""
        core = self.core
        try:
            return child.switch()
        except core._fatal:
            raise
        except Exception as exc:  # vLLM's step itself raised: EngineCoreProc dies of it
            if raised_by_racesim(exc):
                raise  # racesim's bookkeeping inside the step: a crash, not vLLM's verdict
            core.kv.sync()
            raised = vllm_raise(exc)
            raise core._fatal(raised.message, raised.where) from None
