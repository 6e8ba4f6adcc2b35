"""The system publishes its layout as data, and every component a run records is in it."""

from __future__ import annotations

from racesim.engine_model import RequestSpec, Workload, load_policy, run_workload
from racesim.engine_model.config import EngineConfig
from racesim.engine_model.topology import ENGINE_PARTS, ChannelNode


def _run(topology: str, frontends: int = 1):  # type: ignore[no-untyped-def]
    workload = Workload(topology=topology, frontends=frontends,
                        engine=EngineConfig(step_time=0.01), requests=(
                            RequestSpec("X", prompt_tokens=32, max_tokens=3),
                            RequestSpec("X", at=0.01, max_tokens=2, frontend=frontends - 1)))
    return run_workload(workload, load_policy("buggy"))


def test_one_engine_and_its_frontends_and_sockets() -> None:
    result = _run("single", frontends=2)
    topo = result.topology
    assert [(e.name, e.index, e.role) for e in topo.engines] == [("engine", 0, "")]
    assert [(f.name, f.index, f.engine, f.role) for f in topo.frontends] == [
        ("frontend0", 0, 0, ""), ("frontend1", 1, 0, "")]
    assert ChannelNode("ipc:frontend1->engine", "ipc", "frontend1", "engine") in topo.channels
    assert topo.frontends[1].output_channel == "ipc:engine->frontend1"
    assert topo.clients == ("client0", "client1") and topo.proxies == ()
    sched = topo.component("engine.scheduler")
    assert sched is not None and (sched.kind, sched.group, sched.part) == (
        "engine", "engine", "scheduler")


def test_pd_roles_the_kv_socket_and_the_proxies() -> None:
    topo = _run("pd").topology
    assert [(e.name, e.role) for e in topo.engines] == [("prefill", "prefill"),
                                                        ("decode", "decode")]
    assert [(f.name, f.engine, f.role) for f in topo.frontends] == [
        ("P.frontend0", 0, "prefill"), ("D.frontend0", 1, "decode")]
    assert ChannelNode("nixl:decode->prefill", "nixl", "decode", "prefill") in topo.channels
    assert topo.proxies == ("proxy0", "proxy1")
    assert topo.engine_of("decode.connector") == "decode" and topo.engine_of("proxy0") == ""
    parts = [topo.component(topo.engines[1].part(p)) for p in ENGINE_PARTS]
    assert [(c.kind, c.group, c.role) for c in parts if c is not None] == [
        ("engine", "decode", "decode")] * len(ENGINE_PARTS)


def test_every_component_a_run_records_is_published() -> None:
    for topology in ("single", "pd"):
        result = _run(topology, frontends=2)
        unknown = {e.component for e in result.trace
                   if result.topology.component(e.component) is None}
        assert unknown == set(), topology
