"""MooncakeConnector's pairing of prefill and decode by a router-supplied ``transfer_id``
(vLLM 0.33.0, ``distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py``).

The router sends both legs at once with one ``transfer_id`` in their ``kv_transfer_params``
(vLLM's own proxy: ``f"xfer-{uuid4}"``, docs/pd-connectors.md). Everything on the prefill
side (P) is keyed by it, not by a request ID:

- P's scheduler queues each request with ``do_remote_decode`` when it allocates
  (``update_state_after_alloc``, :1130-1136) and when it finishes LENGTH_CAPPED with blocks
  (``request_finished``, :1206-1219); any other finish (STOPPED, aborted) queues its
  ``transfer_id`` as "not processed" (:1206-1210). Each ``build_connector_meta`` hands the
  queue to P's sender loop, whose ``record_send_reqs`` (:2690-2716) keeps ``reqs_need_send``:
  transfer_id -> SendBlockMeta. An allocation creates an entry only if none exists; a finish
  sets the existing entry's owner, blocks and expiry and marks it ready
  (``reqs_need_send[transfer_id]``: a KeyError if the entry is gone); "not processed" pops the
  entry and asserts it was not ready. An exception ends that call of the coroutine, whose
  future nobody reads (``start_load_kv``, :2718-2729): the rest of its batch is never
  recorded, and a finished request it held keeps its blocks with no expiry at all.
- D allocates, then asks P's sender for the transfer_id's KV (``req_blocks``, :2892-2900).
  P takes the entry under that key, creating an empty one if there is none, and waits for it
  to be ready for ``VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT`` (480 s, :1646-1690). Once ready, if
  its key is still in the table, P writes the entry's blocks into D's (:1693-1710, 1738-1752);
  then ``sent += 1`` and, at the first completed write, pops whatever the table holds under the
  key and reports the entry's owner finished sending (:1762-1770). A second waiter on the same
  entry is written the same blocks.
- An owned, ready entry not being sent expires 480 s after its finish was recorded
  (``fetch_finished_sending_reqs``, :2326-2353): no heartbeats, no lease.

So a transfer_id shared by two requests in flight pairs them by whatever the table holds at the
moment, which racesim's scenarios pd-mooncake and pd-mooncake-collision exercise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Any

import simpy

from racesim.engine_model.events.pd import PdHold, PdHoldLost, PdPushWrite
from racesim.engine_model.messages import KVPullRequest, KVPullResult
from racesim.sim.world import World

__all__ = ["MooncakeSender", "SendEntry"]


class SendEntry:
    """One SendBlockMeta (:682-692): who owns it, its blocks, and the D requests waiting."""

    __slots__ = ("transfer_id", "owner", "inc", "blocks", "ready", "expiry", "sending", "sent")

    def __init__(self, transfer_id: str, owner: str, inc: int, ready: simpy.Event) -> None:
        self.transfer_id = transfer_id
        self.owner = owner          # p_req_id; "" when D's pull created the entry
        self.inc = inc              # ground truth: the owner's incarnation
        self.blocks: tuple[int, ...] = ()
        self.ready = ready
        self.expiry = math.inf
        self.sending = 0
        self.sent = 0


class MooncakeSender:
    """P's sender loop: ``reqs_need_send`` keyed by transfer_id, fed a batch per schedule."""

    __slots__ = ("world", "component", "timeout", "transfer_time", "table", "finished",
                 "_batch", "_not_processed", "_is_dead", "_reply", "_wake")

    def __init__(self, world: World, component: str, timeout: float, transfer_time: float,
                 is_dead: Callable[[], bool], reply: Callable[[KVPullRequest, bool], None],
                 wake: Callable[[], None]) -> None:
        self.world = world
        self.component = component
        self.timeout = timeout          # VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (envs.py:1904)
        self.transfer_time = transfer_time
        self.table: dict[str, SendEntry] = {}
        #: P request IDs done sending (or expired) since the scheduler last asked -> cause
        self.finished: dict[str, str] = {}
        #: this schedule's reqs_to_send: P's ID -> (transfer_id, blocks or None, incarnation)
        self._batch: dict[str, tuple[str, tuple[int, ...] | None, int]] = {}
        self._not_processed: dict[str, None] = {}
        self._is_dead = is_dead
        self._reply = reply
        self._wake = wake

    # -- the scheduler side (mooncake_connector.py:1104-1219) -----------------------------------

    def after_alloc(self, request_id: str, transfer_id: str, inc: int) -> None:
        if transfer_id:  # "Missing transfer_id ... from router!" is only a warning (:1132)
            self._batch.setdefault(request_id, (transfer_id, None, inc))

    def finished_held(self, request_id: str, transfer_id: str, blocks: tuple[int, ...],
                      inc: int) -> None:
        self._batch[request_id] = (transfer_id, blocks, inc)

    def not_processed(self, transfer_id: str) -> None:
        self._not_processed[transfer_id] = None

    # -- the sender loop ------------------------------------------------------------------------

    def flush(self) -> None:
        """``record_send_reqs`` on this schedule's batch (:2690-2716). vLLM iterates
        ``reqs_not_processed``, a set, in hash order; the model takes insertion order. A finish
        is held (``pd.hold``) if its entry still names it when the batch is recorded; a later
        finish under the same transfer_id in the batch overwrites the entry, and the earlier
        one's blocks stay held with no expiry (``pd.hold_lost``)."""
        batch, self._batch = self._batch, {}
        gone, self._not_processed = self._not_processed, {}
        if not batch and not gone:
            return
        world, table = self.world, self.table
        now = world.now
        items = list(batch.items())
        done: list[tuple[str, str, tuple[int, ...], int]] = []
        for k, (rid, (tid, blocks, inc)) in enumerate(items):
            if blocks is None:
                if tid not in table:
                    table[tid] = SendEntry(tid, rid, inc, world.env.event())
                continue
            entry = table.get(tid)
            if entry is None:
                self._recorded(done, f"KeyError: {tid!r}")
                self._lost(items[k:], f"KeyError: {tid!r}")
                return
            entry.owner, entry.inc, entry.blocks = rid, inc, blocks
            entry.expiry = now + self.timeout
            done.append((rid, tid, blocks, inc))
            if not entry.ready.triggered:
                entry.ready.succeed()
        self._recorded(done, "")
        for tid in gone:
            popped = table.pop(tid, None)
            if popped is None:
                self._lost([], f"KeyError: {tid!r}")
                return
            if popped.ready.triggered:
                # assert not send_meta.ready.is_set(): the entry, another request's finished
                # blocks, is already out of the table, so its owner never hears of it again.
                self._lost([(popped.owner, (tid, popped.blocks, popped.inc))],
                           "AssertionError: ready")
                return

    def _recorded(self, done: list[tuple[str, str, tuple[int, ...], int]], error: str) -> None:
        """``pd.hold`` for each recorded finish its entry still names; ``pd.hold_lost`` for one
        a later finish of the batch overwrote."""
        for rid, tid, blocks, inc in done:
            entry = self.table.get(tid)
            if entry is not None and entry.owner == rid and entry.inc == inc:
                self.world.emit(self.component, rid, inc, PdHold(list(blocks), entry.expiry))
            else:
                owner = entry.owner if entry is not None else ""
                self.world.emit(self.component, rid, inc,
                                PdHoldLost(tid, f"overwritten by {owner!r}" if owner else error))

    def _lost(self, rest: list[tuple[str, tuple[str, tuple[int, ...] | None, int]]],
              error: str) -> None:
        """The coroutine raised: every finished request not yet recorded keeps its blocks
        with no expiry (its future is never read, so nothing is logged)."""
        for rid, (tid, blocks, inc) in rest:
            if blocks is not None:
                self.world.emit(self.component, rid, inc, PdHoldLost(tid, error))

    def pull(self, msg: KVPullRequest) -> None:
        """D's request for ``msg.transfer_id`` arrived (``send_kv_to_decode``, :1646-1656)."""
        entry = self.table.get(msg.transfer_id)
        if entry is None:
            entry = SendEntry(msg.transfer_id, "", 0, self.world.env.event())
            self.table[msg.transfer_id] = entry
        self.world.env.process(self._serve(msg, entry))

    def _serve(self, msg: KVPullRequest, entry: SendEntry) -> Generator[simpy.Event, Any, None]:
        world = self.world
        if not entry.ready.triggered:
            timer = world.env.timeout(self.timeout)
            yield entry.ready | timer
            if not entry.ready.triggered:
                # "Timeout waiting for P side ready" (:1675-1690): err_reqs for D
                self._reply(msg, False)
                return
        elif not entry.ready.processed:
            yield entry.ready
        if self._is_dead():
            return
        if entry.transfer_id not in self.table:
            # "expired before sending": left out of the FINISH, which D counts as failed
            self._reply(msg, False)
            return
        entry.sending += 1
        blocks = entry.blocks
        if len(blocks) < len(msg.blocks):
            # "P num blocks less than D" (:1893-1914): err for D, nothing counted as sent
            entry.sending -= 1
            self._reply(msg, False)
            return
        ev = world.sleep("pd.kv:push", self.transfer_time, self.component)
        if ev is not None:
            yield ev
        if self._is_dead():
            return
        # A partial prefix hit on D: only P's last len(D's) blocks are written (:1905-1907).
        written = blocks[len(blocks) - len(msg.blocks):]
        world.emit(self.component, entry.owner, entry.inc,
                   PdPushWrite(list(written), msg.engine, msg.request_id, list(msg.blocks),
                               msg.inc, "transfer_id"))
        entry.sending -= 1
        entry.sent += 1
        # need_send is 1 with one TP rank on each side (resolve_need_send, :1782-1792)
        if entry.sent == 1 and self.table.pop(entry.transfer_id, None) is not None:
            self.finished[entry.owner] = "pushed"
            self._wake()
        self._reply(msg, True)

    def expire(self) -> None:
        """``fetch_finished_sending_reqs`` (:2326-2353): owned entries past their expiry and
        not being sent are freed."""
        now = self.world.now
        for tid, entry in list(self.table.items()):
            if entry.owner and entry.expiry <= now and entry.sending == 0:
                del self.table[tid]
                self.finished[entry.owner] = "timeout"

    def next_expiry(self) -> float | None:
        times = [e.expiry for e in self.table.values() if e.owner and e.expiry < math.inf]
        return min(times, default=None)

    def take_finished(self) -> list[tuple[str, str]]:
        done = list(self.finished.items())
        self.finished.clear()
        return done


def pull_result(msg: KVPullRequest, ok: bool) -> KVPullResult:
    return KVPullResult(msg.request_id, ok, msg.inc)
