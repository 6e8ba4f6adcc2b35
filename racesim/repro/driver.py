"""The body of every script ``racesim repro`` writes: it replays a call journal on vLLM's classes.

This file is copied, as text, into the scripts (after connectors/nixl_fakes.py's text), so it
imports nothing of racesim and only vLLM and the standard library at run time. It builds what
the vllm backend builds (engine_vllm/_vllm.py: one ``Scheduler`` per engine from a
``VllmConfig`` of a tiny model config, no weights; a NIXL push worker from nixl_fakes), then
makes the journal's calls in order, setting the NIXL modules' clock to each call's time.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import tempfile
from typing import Any

_NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
_CLOCKED = ("base_scheduler", "pull_scheduler", "base_worker", "pull_worker", "push_scheduler",
            "push_worker")
_ENV = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1", "VLLM_LOGGING_LEVEL": "CRITICAL",
        "TRANSFORMERS_OFFLINE": "1", "VLLM_CONFIGURE_LOGGING": "0"}


class Replay:
    """The engines of one journal and the calls it makes."""

    def __init__(self, journal: dict[str, Any]) -> None:
        self.journal = journal
        self.clock: Any = None
        self.scheds: dict[str, Any] = {}
        self.workers: dict[str, Any] = {}
        self.outputs: dict[tuple[str, int], Any] = {}
        #: engine -> the worker's transfer results not yet taken by an update, oldest first
        self.results: dict[str, list[Any]] = {}
        self.writes: list[tuple[str, str, str]] = []  # (P engine, P request, D request)
        self.now = 0.0
        self.engine = ""

    # -- building ------------------------------------------------------------------------------

    def build(self) -> None:
        import importlib

        import vllm

        want = self.journal["release"]
        if vllm.__version__.split("+")[0] != want:
            sys.exit(f"this reproducer needs vLLM {want}; vLLM {vllm.__version__} is installed")
        platforms = importlib.import_module("vllm.platforms")
        if getattr(platforms, "_current_platform", None) is None:
            # before 0.33 a PyPI wheel ignores VLLM_TARGET_DEVICE=cpu: name the CPU platform
            # before vllm.config resolves one (as racesim's backend does, _api.py)
            from vllm.platforms.cpu import CpuPlatform

            platforms._current_platform = CpuPlatform()
        import torch
        from vllm.config import (
            CacheConfig,
            KVTransferConfig,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
        )
        from vllm.v1.core.kv_cache_utils import init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
        )
        from vllm.v1.structured_output import StructuredOutputManager

        from vllm.utils.hashing import sha256

        init_none_hash(sha256)  # block hashes from sha256, as the backend does
        model = tempfile.mkdtemp(prefix="repro-model-")
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump(self.journal["model_config"], f)
        for name, eng in self.journal["engines"].items():
            shape = eng["shape"]
            mc = ModelConfig(model=model, skip_tokenizer_init=True,
                             max_model_len=shape["max_model_len"])
            sc = SchedulerConfig(is_encoder_decoder=False, max_model_len=shape["max_model_len"],
                                 max_num_seqs=shape["max_num_seqs"],
                                 max_num_batched_tokens=shape["max_num_batched_tokens"],
                                 async_scheduling=shape["async_scheduling"])
            cc = CacheConfig(block_size=shape["block_size"],
                             enable_prefix_caching=shape["prefix_caching"])
            vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc)
            vc.scheduler_config.async_scheduling = shape["async_scheduling"]
            vc.cache_config.num_gpu_blocks = shape["num_blocks"] + 1
            if shape["kv_transfer"]:
                role, engine_id, lease, on_failure, connector = shape["kv_transfer"]
                vc.kv_transfer_config = KVTransferConfig(
                    kv_connector=connector, kv_role=role, engine_id=engine_id,
                    kv_load_failure_policy=on_failure,
                    kv_connector_extra_config={"kv_lease_duration": lease,
                                               **dict(shape.get("kv_extra") or ())})
            spec = FullAttentionSpec(block_size=shape["block_size"], num_kv_heads=1,
                                     head_size=1, dtype=torch.float32)
            kvc = KVCacheConfig(num_blocks=shape["num_blocks"] + 1, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
            cls = AsyncScheduler if shape["async_scheduling"] else Scheduler
            self.scheds[name] = cls(
                block_size=shape["block_size"], vllm_config=vc, kv_cache_config=kvc,
                structured_output_manager=StructuredOutputManager(vc), log_stats=False,
                include_finished_set=eng["include_finished_set"])
            if eng["connector"] is not None:
                self._push_worker(name, eng, shape)
        if self.workers:
            for module_name in _CLOCKED:
                module = importlib.import_module(f"{_NIXL}.{module_name}")
                if self.clock is None:
                    self.clock = SimTime(module.time)  # noqa: F821 (nixl_fakes, above)
                module.time = self.clock
            self.clock.now = lambda: self.now
            for sched in self.scheds.values():
                connector = getattr(sched, "connector", None)
                if connector is not None:  # base_scheduler.py:139, as the backend sets it
                    connector.connector_scheduler._last_heartbeat_time = -float("inf")

    def _push_worker(self, name: str, eng: dict[str, Any], shape: dict[str, Any]) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
            NixlPushConnectorWorker,
        )

        conn = eng["connector"]
        agent = Agent(lambda agent_name, msg: None,  # noqa: F821 (nixl_fakes, above)
                      lambda handle, local, remote, notif: None, lambda handle: None)
        w = push_worker(NixlPushConnectorWorker, conn["engine_id"],  # noqa: F821
                        shape["block_size"], shape["num_blocks"] + 1, conn["lease"], agent,
                        lambda: None, lambda meta: None)
        real = w._do_start_push_kv

        def _do_start_push_kv(request_id: str, blocks: Any, reg: dict[str, Any]) -> None:
            before = len(agent.handles)
            real(request_id, blocks, reg)
            if len(agent.handles) > before:
                self.writes.append((name, request_id, reg["request_id"]))

        w._do_start_push_kv = _do_start_push_kv
        self.workers[name] = w

    # -- the calls ------------------------------------------------------------------------------

    def request(self, r: dict[str, Any]) -> Any:
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher
        from vllm.v1.engine import EngineCoreRequest
        from vllm.v1.request import Request
        from vllm.utils.hashing import sha256

        sp = SamplingParams(max_tokens=r["max_tokens"], detokenize=False,
                            output_kind=RequestOutputKind.DELTA)
        sp.stop_token_ids = list(r["stop_token_ids"])
        if r["kv_transfer_params"] is not None:
            sp.extra_args = {"kv_transfer_params": r["kv_transfer_params"]}
        ecr = EngineCoreRequest(
            request_id=r["request_id"], prompt_token_ids=r["prompt_token_ids"],
            mm_features=None, sampling_params=sp, pooling_params=None,
            arrival_time=r["arrival_time"], lora_request=None, cache_salt=None,
            data_parallel_rank=None, client_index=r["client_index"], external_req_id=None,
            resumable=r["resumable"])
        shape = self.journal["engines"][self.engine]["shape"]
        req = Request.from_engine_core_request(
            ecr, get_request_block_hasher(shape["block_size"], sha256))
        req.abort_immediately = r["abort_immediately"]
        return req

    def run(self) -> None:
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        from vllm.v1.request import RequestStatus

        for i, e in enumerate(self.journal["entries"]):
            self.now, self.engine = e["t"], e["e"]
            sched, op = self.scheds[e["e"]], e["op"]
            w = self.workers.get(e["e"])
            if op == "add":
                sched.add_request(self.request(e["req"]))
            elif op == "schedule":
                self.outputs[(e["e"], e["step"])] = sched.schedule()
            elif op == "finish":
                ids = e["ids"]
                sched.finish_requests(ids[0] if len(ids) == 1 else ids,
                                      RequestStatus[e["status"]])
            elif op == "update":
                mro = ModelRunnerOutput(
                    req_ids=e["mro"]["req_ids"],
                    req_id_to_index={r: j for j, r in enumerate(e["mro"]["req_ids"])},
                    sampled_token_ids=e["mro"]["sampled_token_ids"])
                kvo = e["kvo"]
                if w is not None and kvo is not None:
                    # the results the worker gave when this batch's execution ended (a batch
                    # that carried none, e.g. nothing to compute, has none to take)
                    got = self.results[e["e"]].pop(0)
                    self.same(i, e, kvo, got)
                    mro.kv_connector_output = got
                elif kvo is not None:
                    mro.kv_connector_output = KVConnectorOutput(
                        finished_sending=set(kvo["finished_sending"] or ()) or None,
                        finished_recving=set(kvo["finished_recving"] or ()) or None,
                        failed_recving=set(kvo["failed_recving"] or ()),
                        invalid_block_ids=set(kvo["invalid_block_ids"]))
                sched.update_from_output(self.outputs[(e["e"], e["step"])], mro)
            elif op == "pause":
                from vllm.v1.core.sched.interface import PauseState

                sched.set_pause_state(PauseState[e["state"]])
            elif op == "reset":
                sched.reset_prefix_cache(*e["args"])
            elif op == "start_load_kv":
                w.start_load_kv(self.outputs[(e["e"], e["step"])].kv_connector_metadata)
            elif op == "transfer_results":
                got = w.get_transfer_results()
                self.results.setdefault(e["e"], []).append(KVConnectorOutput(
                    finished_sending=got.finished_sending or None,
                    finished_recving=got.finished_recving or None,
                    failed_recving=got.failed_recving,
                    invalid_block_ids=w.get_block_ids_with_load_errors()))
            elif op == "writer_pass":
                seen = len(self.writes)
                w._push_writer_loop()  # one pass
                for p_engine, p_id, d_id in self.writes[seen:]:
                    self.check_pairing(p_engine, p_id, d_id)
            elif op == "notif":
                w.nixl_wrapper.inbox.append(base64.b64decode(e["data"]))
            elif op == "write_done":
                if e["handle"] in w.nixl_wrapper.handles:
                    w.nixl_wrapper.handles[e["handle"]] = "DONE"

    @staticmethod
    def same(i: int, e: dict[str, Any], want: dict[str, Any] | None, got: Any) -> None:
        """The KVConnectorOutput vLLM's worker gave here is the one the backend's run had."""
        mine = {"finished_sending": sorted(got.finished_sending or ()) or None,
                "finished_recving": sorted(got.finished_recving or ()) or None,
                "failed_recving": sorted(got.failed_recving or ()),
                "invalid_block_ids": sorted(got.invalid_block_ids or ())}
        if want != mine:
            raise RuntimeError(f"replay diverged at journal entry {i} ({e['e']} "
                               f"update_from_output): recorded {want}, got {mine}")

    def check_pairing(self, p_engine: str, p_id: str, d_id: str) -> None:
        """P's writer paired its request ``p_id`` with D's registration ``d_id``: the two must
        be one client's request, so their prompts must be the same tokens."""
        p_req = self.scheds[p_engine].requests.get(p_id)
        d_req = next((s.requests[d_id] for n, s in self.scheds.items()
                      if n != p_engine and d_id in s.requests), None)
        if p_req is None or d_req is None:
            return
        if list(p_req.prompt_token_ids) != list(d_req.prompt_token_ids):
            raise AssertionError(
                f"crosstalk: P's push writer paired P request {p_id!r} with D request "
                f"{d_id!r} (nixl/push_worker.py:418-448, base-ID match) and WRITEs its KV into "
                f"D's blocks, but they are different clients' requests: P's prompt starts "
                f"{list(p_req.prompt_token_ids[:4])}, D's {list(d_req.prompt_token_ids[:4])}")


def main(journal: dict[str, Any]) -> int:
    for key, value in _ENV.items():
        os.environ.setdefault(key, value)
    replay = Replay(journal)
    replay.build()
    print(f"replaying {len(journal['entries'])} calls into vLLM {journal['release']}'s "
          f"classes; expected: {journal['expect']}", file=sys.stderr)
    replay.run()
    print("NOT REPRODUCED: every call returned", file=sys.stderr)
    return 0
