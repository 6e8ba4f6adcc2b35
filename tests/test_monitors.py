"""The checker as a dispatcher over monitors: which kinds it subscribes to, that an unread kind
never reaches it, and that two monitors reading one event report in a fixed order."""

from __future__ import annotations

from racesim.engine_model.checker import Checker
from racesim.engine_model.events import FeAdd, PdHeartbeat, PdRead
from racesim.sim.world import World

#: Every kind some monitor reads; the recorder builds no other event in an exploration run.
READ = {
    "fe.add", "fe.pop", "fe.stats", "fe.abort_issue", "ipc.send", "sched.add", "sched.finish",
    "sched.abort_miss", "sched.step", "sched.update", "kv.alloc", "kv.free", "pd.hold",
    "pd.notice", "pd.release", "pd.read", "pd.push_write", "client.send", "client.output",
    "client.done", "engine.fatal", "dp.abort_unrouted", "engine.reject", "engine.resume",
    "client.abort", "client.cancel", "client.disconnect", "fe.abort_noop", "api.cancel",
    # kv-destination's read start and failure (engine_model/monitors/pd.py)
    "pd.recv_start", "pd.read_failed",
    # runner-books and input-integrity over vLLM's own model runner (engine_model/monitors/runner.py)
    "runner.books", "runner.input",
}


def _world() -> World:
    return World(0, retain_trace=False, hash_trace=False)


def test_the_checker_subscribes_to_exactly_the_kinds_its_monitors_read() -> None:
    world = _world()
    assert Checker(world).kinds() == READ
    assert not world.trace.reads("pd.kv:read") and world.trace.reads("sched.step")


def test_an_unread_kind_never_reaches_the_monitors() -> None:
    world = _world()
    checker = Checker(world)
    world.emit("E0.core", None, 0, PdHeartbeat(["X"]))  # a kind no monitor reads
    assert checker.finish() == ()


def test_one_event_read_by_two_monitors_reports_in_monitor_order() -> None:
    # A decode incarnation reads blocks the prefill it names does not own, and the prefill
    # belongs to another client: kv-ownership (KV monitor) comes before no-crosstalk (client).
    world = _world()
    checker = Checker(world)
    world.emit("api0", "X", 1, FeAdd(uid=1, external="X", index=0))
    world.emit("api0", "X", 2, FeAdd(uid=2, external="X", index=0))
    world.emit("E1.connector", "X", 1, PdRead(remote_engine=0, remote_request="X",
                                              remote_blocks=[0], remote_inc=2))
    assert [v.invariant for v in checker.violations] == ["kv-ownership", "no-crosstalk"]
    assert [v.event for v in checker.violations] == [2, 2]
