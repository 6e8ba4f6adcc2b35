"""NixlConnector's lifecycle, scheduler side, for P/D disaggregation (VLLM_LIFECYCLE §4).

Prefill (P): a ``do_remote_decode`` request that finishes LENGTH_CAPPED keeps its blocks and its
``Scheduler.requests`` entry until the decode side's notice or the hold timeout
(``_reqs_need_send``, keyed by ID). Decode (D): a ``do_remote_prefill`` request allocates blocks,
waits in WAITING_FOR_REMOTE_KVS while the worker reads P's blocks, notifies P, then decodes.
"""

from __future__ import annotations

from collections.abc import Callable

from racesim.engine_model.kv_cache import KVCacheManager
from racesim.engine_model.messages import KVTransferParams
from racesim.engine_model.request import Request, RequestStatus
from racesim.sim.world import World

__all__ = ["ConnectorScheduler"]


class ConnectorScheduler:
    __slots__ = ("world", "component", "engine_index", "kv", "hold_timeout", "reqs_need_send",
                 "finished_recving", "done_sending", "_start_read")

    def __init__(self, world: World, component: str, engine_index: int, kv: KVCacheManager,
                 hold_timeout: float, start_read: Callable[[Request], None]) -> None:
        self.world = world
        self.component = component
        self.engine_index = engine_index
        self.kv = kv
        self.hold_timeout = hold_timeout
        self.reqs_need_send: dict[str, float] = {}      # P: ID -> expiry time
        self.finished_recving: dict[str, None] = {}     # D: IDs whose blocks arrived
        self.done_sending: dict[str, str] = {}          # P: IDs to release -> cause
        self._start_read = start_read

    # -- prefill side ---------------------------------------------------------------------------

    def request_finished(self, request: Request) -> tuple[bool, KVTransferParams | None]:
        if not request.do_remote_decode:
            return False, None
        if request.status != RequestStatus.FINISHED_LENGTH_CAPPED:
            return False, None  # aborted: _reqs_not_processed, free now
        blocks = self.kv.get_block_ids(request.request_id)
        if not blocks:
            return False, None
        expiry = self.world.now + self.hold_timeout
        self.reqs_need_send[request.request_id] = expiry
        self.world.record(self.component, "pd.hold", request.request_id, request.inc,
                          blocks=blocks, expiry=expiry)
        return True, KVTransferParams(do_remote_prefill=True, remote_engine=self.engine_index,
                                      remote_request_id=request.request_id,
                                      remote_block_ids=tuple(blocks), remote_inc=request.inc)

    def recognizes(self, request_id: str, request: Request | None) -> bool:
        """Whether a transfer-done notice names a request this side knows.

        NIXL's worker looks the ID up in ``_reqs_to_send`` and ``_reqs_to_process``; a notice
        for neither (say, its hold timed out) is logged as "Potentially invalid KV blocks for
        unrecognized request" and dropped, and the prefill engine lives on (VLLM_LIFECYCLE §4).
        """
        return request_id in self.reqs_need_send or (
            request is not None and request.do_remote_decode)

    def notice(self, request_id: str) -> None:
        """The decode side's "<id>:<n>" arrived (keyed by ID only)."""
        self.reqs_need_send.pop(request_id, None)
        self.done_sending[request_id] = "notify"

    def next_expiry(self) -> float | None:
        return min(self.reqs_need_send.values(), default=None)

    def get_finished(self) -> list[tuple[str, str]]:
        """IDs whose hold ends now: notified ones, then expired ones (with a warning in vLLM)."""
        now = self.world.now
        for rid, expiry in list(self.reqs_need_send.items()):
            if expiry <= now:
                del self.reqs_need_send[rid]
                self.done_sending[rid] = "timeout"
        done = list(self.done_sending.items())
        self.done_sending.clear()
        return done

    # -- decode side ----------------------------------------------------------------------------

    def start_recv(self, request: Request) -> None:
        self.world.record(self.component, "pd.recv_start", request.request_id, request.inc)
        self._start_read(request)

    def take_finished_recving(self, request: Request) -> bool:
        rid = request.request_id
        if rid not in self.finished_recving:
            return False
        del self.finished_recving[rid]
        request.remote_kv_ready = True
        request.status = RequestStatus.WAITING
        # The last prompt token is recomputed locally so that D samples the next token.
        request.num_computed_tokens = request.prompt_tokens - 1
        return True
