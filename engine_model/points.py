"""The await-point catalogue of the vLLM V1 model: every point a scenario, a schedule or a
report may name."""

from __future__ import annotations

from racesim.sim.errors import InputError
from racesim.sim.points import AwaitPoint, PointCatalogue

__all__ = ["POINTS", "UnknownPointError"]


class UnknownPointError(InputError):
    """A policy named an await point outside the catalogue (``send_abort(ids, "typo")``)."""

POINTS = PointCatalogue([
    AwaitPoint("client.send",
               "before a client's request leaves it (HTTP handler scheduling)"),
    AwaitPoint("frontend.add_request:before_send",
               "AsyncLLM.add_request: OutputProcessor registered the request, ADD not yet sent"),
    AwaitPoint("frontend.abort:after_pop",
               "AsyncLLM.abort: the await on the ABORT send (buggy: after request_states was "
               "popped; fixed policies: before the pop) -- vLLM #15326's BUG point"),
    AwaitPoint("frontend.output_handler:between_chunks",
               "output handler: await asyncio.sleep(0) between output chunks",
               always_yields=True),
    AwaitPoint("frontend.output_handler:before_abort_send",
               "output handler: before sending ABORTs for stop-string finishes (#15326's second "
               "window); in a step with more than output_chunk_size outputs "
               "(VLLM_V1_OUTPUT_PROC_CHUNK_SIZE, 128) every chunk but the last sends them after "
               "the sleep(0) between chunks, so there the window yields"),
    AwaitPoint("ipc.input:transit", "one frontend -> engine socket hop (ADD/ABORT)",
               natural="ipc.latency"),
    AwaitPoint("ipc.output:transit", "one engine -> frontend socket hop (EngineCoreOutputs)",
               natural="ipc.latency"),
    AwaitPoint("engine.input:preprocess",
               "EngineCore input thread: preprocessing a message before it is queued",
               natural="engine.preprocess_time"),
    AwaitPoint("engine.step:execute", "the model forward pass of one step",
               natural="engine.step_time"),
    AwaitPoint("engine.step:update_from_output",
               "busy loop: a step's output is ready, before update_from_output applies it"),
    AwaitPoint("pd.proxy:after_prefill",
               "P/D proxy: between the prefill reply and the decode send"),
    AwaitPoint("pd.kv:read", "decode side reading the prefill side's KV blocks",
               natural="pd.transfer_time"),
    AwaitPoint("pd.kv:notify", "a NIXL notification in transit between decode and prefill "
               "(transfer-done notice, heartbeat, push registration, push WRITE done; "
               "Mooncake: D's pull request, P's answer)",
               natural="ipc.latency"),
    AwaitPoint("pd.kv:push", "NIXL push mode and Mooncake: the prefill side writing its "
               "blocks into the decode side's (registered, or named by its pull)",
               natural="pd.transfer_time"),
    AwaitPoint("pd.mooncake:bootstrap", "Mooncake on the vllm backend: the decode side's "
               "HTTP query to the prefill side's bootstrap server (0.33 "
               "mooncake_connector.py:2573-2582, once per prefill engine; the model has no "
               "bootstrap)",
               natural="2 * ipc.latency"),
    AwaitPoint("dp.coordinator:publish",
               "DP coordinator -> API servers: the engines' waiting/running counts the load "
               "balancer reads, published every 100 ms (XPUB socket hop)",
               natural="ipc.latency"),
], dynamic=("send:", "yield:", "exec:"))  # vLLM's own frontend (engine_vllm/frontend/points.py)
