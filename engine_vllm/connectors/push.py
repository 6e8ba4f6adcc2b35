"""NIXL push mode on the vllm backend: vLLM 0.33's own push scheduler and push worker.

Each engine's ``Scheduler`` builds vLLM's own ``NixlPushConnectorScheduler`` (``kv_connector =
"NixlPushConnector"``; nixl/push_scheduler.py). The worker is vLLM's own
``NixlPushConnectorWorker`` on an instance that holds its request and writer state (its
``__init__`` registers KV memory with the nixl package), and runs its own code for:

- the engine thread: ``start_load_kv`` (push_worker.py:189-252: D's ``_recving_metadata``, the
  registrations and finished blocks queued for the writer, the lease bookkeeping) and
  ``get_transfer_results`` (push_worker.py:806-847 over base_worker.py:3191-3330: completion
  notices, done WRITE handles, expired leases, the eviction queue);
- the writer thread's loop ``_push_writer_loop`` (push_worker.py:256-314), one pass per wake,
  as a task of the World (the ``pd.push:writer`` await point): D's PUSH_REG sends
  (``_send_registration_to_p``, ``_do_send_reg_notif``), P's pairing
  (``_handle_push_reg_notif``, ``_pop_matching_registration``,
  ``_pop_matching_finished_blocks``, :418-448) and the WRITE's planning (``_do_start_push_kv``,
  ``_xfer_blocks_for_req``, ``_xfer_blocks``, ``_apply_prefix_caching`` with its block-count
  assert, base_worker.py:3787-3793). An exception in a pass is caught and logged by vLLM's own
  handler (:305-306), which ends that pass.

What is simulated is only what NIXL itself does (connectors/nixl_fakes.py, which ``racesim
repro`` copies into its scripts): memory registration and the
handshake's results (one TP rank, equal block sizes; ``_ensure_handshake`` answers "connected",
so its latency is not modelled), the notification channel (``send_notif`` /
``get_new_notifs`` over the World's ``pd.kv:notify`` channels) and the RDMA WRITE
(``make_prepped_xfer`` / ``transfer`` / ``check_xfer_state``: the WRITE takes ``[pd]
transfer_time`` at ``pd.kv:push``, then its notification ``"<D id>:1"`` reaches D). The writer's
1 ms self-poll (:308-313) is a wake on each arrival: a pass with nothing new changes nothing.
"""

from __future__ import annotations

import sys
from typing import Any

from racesim.engine_model.events.pd import (
    PdHeartbeat,
    PdNoticeUnknown,
    PdPushFailed,
    PdPushNotPosted,
    PdPushRegister,
    PdPushWrite,
)
from racesim.engine_model.messages import KVDoneNotice, KVHeartbeat, KVPushRegistration
from racesim.engine_vllm.connectors.nixl import _NIXL, NixlTransport
from racesim.engine_vllm.connectors.nixl_fakes import Agent, push_worker

__all__ = ["NixlPushTransport"]


class NixlPushTransport(NixlTransport):
    """One engine's NIXL push worker: vLLM's own code, NIXL's registration and RDMA simulated."""

    def __init__(self, core: Any, engine_id: str, lease: int, transfer_time: float,
                 fabric: Any) -> None:
        self.lease = lease
        super().__init__(core, engine_id, lease, transfer_time, fabric)
        #: racesim repro's call journal (engine_vllm/journal.py), when recording
        self.journal: Any = None
        self._writes: dict[int, tuple[list[int], list[int], str]] = {}
        self._pairing: tuple[str, str] | None = None  # (P id, D id) of the WRITE being planned
        self._held_inc: dict[str, int] = {}
        self._wake_pending = False
        self._writer_ev: Any = None
        self.world.env.process(self._writer())

    def _make_worker(self, lease: int) -> Any:
        """vLLM's ``NixlPushConnectorWorker`` with the state its request and writer code reads
        (:func:`nixl_fakes.push_worker`), its ``_do_start_push_kv`` observed."""
        cls = sys.modules[f"{_NIXL}.push_worker"].NixlPushConnectorWorker
        agent = Agent(self.send_registration, self.prepare_write, self.start_write)
        w = push_worker(cls, self.engine_id, self.core.config.block_size,
                        self.core.config.num_blocks + 1, lease, agent, self.wake_writer,
                        self._heartbeats)
        real_start = w._do_start_push_kv

        def _do_start_push_kv(request_id: str, local_block_ids: Any, reg: dict[str, Any]) -> None:
            self._pairing = (request_id, reg["request_id"])
            try:
                real_start(request_id, local_block_ids, reg)
            except AssertionError:
                # base_worker.py:3791 (D registered more blocks than P holds): vLLM's handler
                # in the writer loop logs it (push_worker.py:305-306); the pair is dropped
                d_blocks = list(reg["local_block_ids"][0])
                self.world.emit(self.component, request_id, self._held_inc.get(request_id, 0),
                                PdPushFailed(len(local_block_ids[0]), reg["request_id"],
                                             len(d_blocks), self.fabric.push_incs.get(
                                                 reg["request_id"], 0)))
                raise
            finally:
                self._pairing = None

        w._do_start_push_kv = _do_start_push_kv
        return w

    # -- the scheduler side, observed -----------------------------------------------------------

    def _wrap_request_finished(self) -> None:
        super()._wrap_request_finished()
        connector = self.core.sched.connector
        real = connector.request_finished_all_groups

        def request_finished_all_groups(request: Any, block_ids: Any) -> Any:
            self._held_inc[request.request_id] = self.core.inc_of(request)
            return real(request, block_ids)

        connector.request_finished_all_groups = request_finished_all_groups

    # -- the writer thread, as a task ----------------------------------------------------------

    def wake_writer(self) -> None:
        self._wake_pending = True
        ev = self._writer_ev
        if ev is not None and not ev.triggered:
            ev.succeed()

    def _writer(self) -> Any:
        world = self.world
        while True:
            if not self._wake_pending:
                self._writer_ev = world.env.event()
                yield self._writer_ev
                self._writer_ev = None
            self._wake_pending = False
            ev = world.sleep("pd.push:writer", 0.0, self.component)
            if ev is not None:
                yield ev
            if self.core.dead is not None:
                return
            if self.journal is not None:
                self.journal.record(self.core.name, "writer_pass")
            self.worker._push_writer_loop()  # one pass (_OnePass)
            if not self.worker._pending_completion_notifs.empty():
                self.core.wake()  # the engine thread drains them in get_transfer_results

    # -- NIXL: notifications and the WRITE ------------------------------------------------------

    def send_registration(self, agent_name: str, notif: bytes) -> None:
        """D's writer sends a PUSH_REG to P (``_do_send_reg_notif``)."""
        import msgspec

        prefix = sys.modules[f"{_NIXL}.metadata"].PUSH_REG_NOTIF_PREFIX
        reg = msgspec.msgpack.decode(notif[len(prefix):])
        rid = reg["request_id"]
        blocks = [int(b) for b in reg["local_block_ids"][0]]
        req = self.recv_objects.get(rid) or self.core.sched.requests.get(rid)
        inc = self.core.inc_of(req)
        self.fabric.push_incs[rid] = inc
        # the fault belongs to this registration's request: a later request under the same ID
        # registers again and must not inherit it
        if req is not None and self.core.read_fails(req):
            self.fabric.push_faults.add(rid)
        else:
            self.fabric.push_faults.discard(rid)
        engine = self.fabric.engine_ids.get(reg["remote_engine_id"], -1)
        self.world.emit(self.component, rid, inc, PdPushRegister(engine, blocks))
        msg = KVPushRegistration(rid, self.fabric.engine_ids.get(self.engine_id, -1),
                                 tuple(blocks), inc)
        self.fabric.push_bytes[msg] = notif
        channel = self.core.notify_channels.get(engine)  # NIXL's side channel to P
        if channel is not None:
            channel.send(msg, [rid])

    def prepare_write(self, handle: int, local: list[int], remote: list[int],
                      notif: bytes) -> None:
        self._writes[handle] = (local, remote, notif.decode())

    def start_write(self, handle: int) -> None:
        """``nixl_wrapper.transfer``: the WRITE starts, or (a scripted fault on D's request,
        ``kv_load_fails``) raises as NIXL does when it cannot post one; vLLM's own handler
        then logs ``transfer_setup_failed``, adds P's ID to ``_send_failures`` and releases
        the handle (push_worker.py:746-765); no notification is sent."""
        pairing = self._pairing
        assert pairing is not None
        p_id, d_id = pairing
        if d_id in self.fabric.push_faults:
            self._writes.pop(handle, None)
            self.world.emit(self.component, p_id, self._held_inc.get(p_id, 0),
                            PdPushNotPosted(d_id, self.fabric.push_incs.get(d_id, 0)))
            raise RuntimeError("NIXL_ERR_BACKEND: the WRITE could not be posted (scripted)")
        self.world.env.process(self._write(handle, *pairing))

    def _write(self, handle: int, p_id: str, d_id: str) -> Any:
        local, remote, notif = self._writes.pop(handle)
        ev = self.world.sleep("pd.kv:push", self.transfer_time, self.component)
        if ev is not None:
            yield ev
        if self.core.dead is not None:
            return
        inc = self.fabric.push_incs.get(d_id, 0)
        how = "exact" if p_id == d_id else "base"
        self.world.emit(self.component, p_id, self._held_inc.get(p_id, 0),
                        PdPushWrite(local, self.fabric.engine_ids.get("decode", 1), d_id, remote,
                                    inc, how))
        if handle in self.worker.nixl_wrapper.handles:
            self.worker.nixl_wrapper.handles[handle] = "DONE"
            if self.journal is not None:
                self.journal.record(self.core.name, "write_done", handle=handle)
        notice = KVDoneNotice(d_id, inc)  # the WRITE's notif_msg, delivered to D by NIXL
        for engine in sorted(self.core.push_channels):
            self.core.push_channels[engine].send(notice, [d_id], remote_inc=inc)
        self.core.wake()

    def deliver(self, notice: Any) -> None:
        """P: a PUSH_REG or heartbeat arrived in NIXL's notification queue."""
        if isinstance(notice, KVHeartbeat):
            self.world.emit(self.core.c_core, None, 0, PdHeartbeat(list(notice.request_ids)))
            self._arrive(("HB:" + ",".join(notice.request_ids)).encode())
        elif isinstance(notice, KVPushRegistration):
            notif = self.fabric.push_bytes.pop(notice, None)
            if notif is not None:
                self._arrive(notif)
        self.wake_writer()  # the spinning engine's next get_transfer_results wakes it

    def deliver_write_notice(self, notice: KVDoneNotice) -> None:
        """D: a WRITE's notification ``"<D id>:<P's TP size>"`` arrived (push_worker.py:681);
        the writer forwards it to the engine thread."""
        notif = f"{notice.request_id}:1".encode()
        if notice.request_id not in self.worker._recving_metadata:
            self.world.emit(self.core.c_core, notice.request_id, notice.remote_inc,
                            PdNoticeUnknown())  # push_worker.py:785-793 logs and drops it
        self._arrive(notif)
        self.wake_writer()

    def _arrive(self, notif: bytes) -> None:
        """A notification reaches the agent (what vLLM's writer reads next), journaled."""
        self.worker.nixl_wrapper.inbox.append(notif)
        if self.journal is not None:
            self.journal.record(self.core.name, "notif", data=self.journal.encode(notif))

    # -- the engine thread ----------------------------------------------------------------------

    def start_load_kv(self, meta: Any) -> None:
        requests = self.core.sched.requests
        for rid in meta.reqs_to_recv:
            if rid not in self.recv_objects and rid in requests:
                self.recv_objects[rid] = requests[rid]
        if self.journal is not None:
            self.journal.record(self.core.name, "start_load_kv", step=self.journal.step_of(meta))
        self.worker.start_load_kv(meta)

    def has_results(self) -> bool:
        w = self.worker
        if not w._pending_completion_notifs.empty() or not w._failed_recv_reqs.empty():
            return True
        if any(state != "PROC" for state in w.nixl_wrapper.handles.values()):
            return True
        expiry = self.next_expiry()
        return expiry is not None and expiry <= self.world.now

    def transfer_results(self, v: Any) -> Any:
        """vLLM's own ``get_transfer_results`` and ``get_block_ids_with_load_errors``, as
        kv_connector_model_runner_mixin.py:90-100 packs them; sets sorted (the scheduler
        iterates them)."""
        w = self.worker
        before = dict(w._reqs_to_send)
        if self.journal is not None:
            self.journal.record(self.core.name, "transfer_results")
        results = w.get_transfer_results()
        for rid in sorted(results.finished_sending):
            expired = rid in before and before[rid] <= self.world.now
            self.causes.setdefault(rid, "timeout" if expired else "pushed")
        invalid = w.get_block_ids_with_load_errors()
        if results.finished_sending or results.finished_recving:
            self.wake_writer()
        return v.KVConnectorOutput(
            finished_sending=dict.fromkeys(sorted(results.finished_sending)) or None,
            finished_recving=dict.fromkeys(sorted(results.finished_recving)) or None,
            failed_recving=dict.fromkeys(sorted(results.failed_recving)),
            invalid_block_ids=invalid)
