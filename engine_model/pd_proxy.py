"""The P/D proxy that stands between a client and two engines (prefill, then decode), as each
of vLLM's example proxies does it; the client talks to it as to an API server (a ``Gateway``).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from racesim.engine_model.config import PDConfig
from racesim.engine_model.events.client import PdAbort, PdDecode, PdPrefill
from racesim.engine_model.frontend.async_llm import AsyncLLM
from racesim.engine_model.frontend.outputs import (
    CompletionOutput,
    RequestOutput,
    RequestOutputCollector,
)
from racesim.engine_model.messages import FinishReason, KVTransferParams
from racesim.sim.world import World

__all__ = ["Proxy"]

Proc = Generator[simpy.Event, Any, Any]


class Proxy:
    """A P/D proxy: prefill with max_tokens=1, then decode.

    ``[pd] connector`` picks the proxy vLLM ships for it: "nixl-pull" is toy_proxy_server.py
    (decode gets the transfer params P returned); "nixl-push" is the push-mode demo of the 0.33
    era, disagg_proxy_pushconnector_demo.py before transfer_id (it drains P's reply, then sends
    D params naming P's engine and the proxy's request ID, no blocks: D registers its own);
    "mooncake" is mooncake_connector_proxy.py (both legs at once, one transfer_id).
    ``[pd] proxy`` says how it aborts: "engine-client" calls each stage's ``AsyncLLM.abort``
    with the ID it sent (P by that external ID), "http" can only disconnect, which aborts the
    stage's request by its internal ID, and nothing before ``add_request`` returned.
    """

    def __init__(self, world: World, index: int, prefill: AsyncLLM, decode: AsyncLLM,
                 config: PDConfig) -> None:
        self.world = world
        self.name = f"proxy{index}"
        self.index = index
        self.prefill = prefill
        self.decode = decode
        self.config = config
        self._stage: AsyncLLM | None = None
        self._stage_id = ""
        #: the stage's request is known by the ID to abort it with (http: its internal ID)
        self._stage_known = False
        self._aborted = False
        self._http = config.proxy == "http"

    def add_request(self, request_id: str, *, client_uid: int, prompt_tokens: int,
                    max_tokens: int, n: int = 1, eos_at: int | None = None,
                    stop_string_at: int | None = None,
                    kv_transfer_params: KVTransferParams | None = None, prompt: str = "",
                    fault: str = "", dp_rank: int | None = None,
                    ) -> Generator[simpy.Event, Any, RequestOutputCollector | str]:
        collector = RequestOutputCollector(self.world.env, request_id)
        self.world.env.process(self._run(collector, request_id, client_uid, prompt_tokens,
                                         max_tokens, n, eos_at, stop_string_at, prompt, fault))
        return collector
        yield  # a generator, like AsyncLLM.add_request

    def _run(self, collector: RequestOutputCollector, request_id: str, client_uid: int,
             prompt_tokens: int, max_tokens: int, n: int, eos_at: int | None,
             stop_string_at: int | None, prompt: str, fault: str) -> Proc:
        world = self.world
        rid = request_id
        if self.config.proxy_ids == "uuid":
            rid = f"{world.rng.stream('proxy-uuid').getrandbits(128):032x}"
        if self.config.connector == "mooncake":
            yield from self._run_mooncake(collector, request_id, rid, client_uid, prompt_tokens,
                                          max_tokens, n, eos_at, stop_string_at, prompt, fault)
            return
        # [pd] endpoints: the ID each leg's API server hands AsyncLLM (api_server.py's prefixes)
        p_id, d_id = rid, rid
        if self.config.endpoints == "completions-chat":
            p_id, d_id = f"cmpl-{rid}-0", f"chatcmpl-{rid}"
        world.emit(self.name, rid, 0, PdPrefill(client_uid))
        self._stage, self._stage_id, self._stage_known = self.prefill, p_id, not self._http
        # P samples the same first token D will: EOS there (eos_at = 1) finishes P STOPPED
        # rather than LENGTH_CAPPED (v1/core/sched/utils.py:104-119 checks EOS first).
        got = yield from self.prefill.add_request(
            p_id, client_uid=client_uid, prompt_tokens=prompt_tokens, max_tokens=1, n=1,
            eos_at=eos_at, kv_transfer_params=KVTransferParams(do_remote_decode=True),
            prompt=prompt,
            fault="preprocess" if fault == "preprocess" else "")
        if isinstance(got, str):
            self._refused(collector, request_id, got)
            return
        if self._http:
            self._stage_id, self._stage_known = got.request_id, True
        while True:
            out = yield from got.get()
            if out.finished or out.error is not None:
                break
        params = out.kv_transfer_params
        push = self.config.connector == "nixl-push"
        if push and out.error is None and not self._aborted:
            # The push demo never reads P's reply: D's params name P's engine and the proxy's
            # own request ID; D allocates and registers its blocks itself.
            params = KVTransferParams(do_remote_prefill=True, remote_engine=0,
                                      remote_request_id=rid)
        if out.error is not None or self._aborted or params is None:
            collector.put(out)
            return
        ev = world.sleep("pd.proxy:after_prefill", 0.0, self.name)
        if ev is not None:
            yield ev
        if self._aborted:
            collector.put(RequestOutput(request_id, [], True))
            return
        world.emit(self.name, rid, 0, PdDecode(client_uid, params.remote_request_id))
        self._stage, self._stage_known = None, False
        d_params = KVTransferParams(do_remote_prefill=True, remote_engine=params.remote_engine,
                                    remote_request_id=params.remote_request_id,
                                    remote_block_ids=params.remote_block_ids,
                                    remote_inc=params.remote_inc)
        got = yield from self.decode.add_request(
            d_id, client_uid=client_uid, prompt_tokens=prompt_tokens, max_tokens=max_tokens, n=n,
            eos_at=eos_at, stop_string_at=stop_string_at, kv_transfer_params=d_params,
            prompt=prompt, fault="kv-load" if fault == "kv-load" else "")
        yield from self._stream_decode(collector, request_id, got)

    def _stream_decode(self, collector: RequestOutputCollector, request_id: str,
                       got: RequestOutputCollector | str) -> Proc:
        """The decode leg, once sent: stream its outputs to the client."""
        if isinstance(got, str):
            self._refused(collector, request_id, got)
            return
        self._stage, self._stage_id, self._stage_known = self.decode, got.request_id, True
        if self._aborted:
            yield from self.decode.abort(got.request_id, internal=True)
        while True:
            out = yield from got.get()
            collector.put(out)
            if out.finished or out.error is not None:
                return

    def _run_mooncake(self, collector: RequestOutputCollector, request_id: str, rid: str,
                      client_uid: int, prompt_tokens: int, max_tokens: int, n: int,
                      eos_at: int | None, stop_string_at: int | None, prompt: str,
                      fault: str) -> Proc:
        """vLLM's Mooncake proxy (examples/disaggregated/mooncake_connector/
        mooncake_connector_proxy.py, _handle_completions): P's leg is a task nobody awaits,
        D's leg goes at once, both with ``transfer_id = f"xfer-{request_id}"``; the proxy's
        request ID is a uuid4 there (``proxy_ids = "uuid"``), the client's own under
        ``proxy_ids = "client"`` (a router deriving it from the client's ID)."""
        world = self.world
        tid = f"xfer-{rid}"
        world.emit(self.name, rid, 0, PdPrefill(client_uid))
        world.env.process(self._mooncake_prefill(rid, tid, client_uid, prompt_tokens, eos_at,
                                                 prompt, fault))
        world.emit(self.name, rid, 0, PdDecode(client_uid, tid))
        d_params = KVTransferParams(do_remote_prefill=True, remote_engine=0, transfer_id=tid)
        got = yield from self.decode.add_request(
            rid, client_uid=client_uid, prompt_tokens=prompt_tokens, max_tokens=max_tokens, n=n,
            eos_at=eos_at, stop_string_at=stop_string_at, kv_transfer_params=d_params,
            prompt=prompt, fault="kv-load" if fault == "kv-load" else "")
        yield from self._stream_decode(collector, request_id, got)

    def _mooncake_prefill(self, rid: str, tid: str, client_uid: int, prompt_tokens: int,
                          eos_at: int | None, prompt: str, fault: str) -> Proc:
        """send_request_to_service: max_tokens = 1, the reply drained and dropped."""
        got = yield from self.prefill.add_request(
            rid, client_uid=client_uid, prompt_tokens=prompt_tokens, max_tokens=1, n=1,
            eos_at=eos_at,
            kv_transfer_params=KVTransferParams(do_remote_decode=True, transfer_id=tid),
            prompt=prompt, fault="preprocess" if fault == "preprocess" else "")
        if isinstance(got, str):
            return
        while True:
            out = yield from got.get()
            if out.finished or out.error is not None:
                return

    @staticmethod
    def _refused(collector: RequestOutputCollector, request_id: str, reason: str) -> None:
        error = "EngineDeadError" if reason == FinishReason.ERROR else None
        collector.put(RequestOutput(request_id, [CompletionOutput(0, [], reason)], True, None,
                                    error))

    def abort(self, request_id: str, internal: bool = False) -> Proc:
        """Abort whichever stage the request is in (the client's ID means nothing to P or D)."""
        self._aborted = True
        stage = self._stage
        if stage is None or not self._stage_known:
            # between stages: _run sees the flag; http, before add_request returned: the
            # handler's cancel aborts nothing (0.33 async_llm.py:578-584, q is None)
            return
        self.world.emit(self.name, self._stage_id, 0, PdAbort(stage.name))
        # engine-client: the prefill stage is aborted by the ID the proxy sent (external),
        # decode by its internal ID; http: each by its internal ID (a disconnect).
        yield from stage.abort(self._stage_id, internal=stage is self.decode or self._http)
