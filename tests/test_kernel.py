"""The deterministic kernel (sim/): seeds, random streams, delay plans, World, trace, channels."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from racesim.engine_model import EngineConfig, RequestSpec, Workload, load_policy, run_workload
from racesim.engine_model.events import ClientSend, SchedAdd
from racesim.engine_model.ipc import Channel
from racesim.sim import (
    Decision,
    DelayPlan,
    RngStreams,
    TraceRecorder,
    World,
    stable_seed,
    trace_hash_of,
)
from racesim.sim.strategies import Replay

# -- seeds and streams -----------------------------------------------------------------------------

_SEED_PROBE = """
from racesim.sim import RngStreams, stable_seed
print(stable_seed("run", 7, "request-id/frontend0"))
print(RngStreams(7).stream("request-id/frontend0").getrandbits(64))
print(hash("request-id/frontend0"))
"""


def _probe(hashseed: str) -> list[str]:
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    out = subprocess.run([sys.executable, "-c", _SEED_PROBE], env=env, check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def test_stable_seed_is_the_same_under_any_pythonhashseed() -> None:
    one, two = _probe("1"), _probe("2")
    assert one[2] != two[2], "the probe must really run under two different string hashes"
    assert one[:2] == two[:2]
    assert one[0] == str(stable_seed("run", 7, "request-id/frontend0"))


def test_stable_seed_tells_its_parts_apart() -> None:
    seeds = {stable_seed("a"), stable_seed("b"), stable_seed("a", 1), stable_seed(1, "a"),
             stable_seed("a", 2)}
    assert len(seeds) == 5
    assert all(0 <= s < 2**64 for s in seeds)


def test_drawing_from_one_stream_never_shifts_another() -> None:
    busy, quiet = RngStreams(42), RngStreams(42)
    for _ in range(1000):
        busy.stream("explore").random()
    assert [busy.stream("model").random() for _ in range(5)] == \
        [quiet.stream("model").random() for _ in range(5)]


def test_streams_are_named_and_seeded() -> None:
    rng = RngStreams(42)
    assert rng.stream("a") is rng.stream("a")
    assert rng.seed == 42
    a = [RngStreams(42).stream("a").random() for _ in range(2)]
    assert a[0] == a[1], "same seed, same name: the same stream"
    assert RngStreams(42).stream("b").random() != a[0]
    assert RngStreams(43).stream("a").random() != a[0]


# -- delay plans -----------------------------------------------------------------------------------

def test_delay_plan_precedence_from_override_down_to_natural() -> None:
    asked: list[tuple[str, int, float]] = []

    def decider(point: str, k: int, default: float) -> float:
        asked.append((point, k, default))
        return default + 1.0

    plan = DelayPlan(
        environment=[("p", None, 0.2), ("p", 1, 0.3), ("e", None, 0.4)],
        overrides=[("p", None, 0.5), ("p", 2, 0.7)],
        decider=decider)
    # (delay, default) per occurrence; the default is the environment's, else the natural one.
    assert plan.resolve("p", 2, 0.01) == (0.7, 0.2)   # per-occurrence override beats per-point
    assert plan.resolve("p", 0, 0.01) == (0.5, 0.2)   # per-point override beats the decider
    assert plan.resolve("p", 1, 0.01) == (0.5, 0.3)   # env per-occurrence beats env per-point
    assert plan.resolve("e", 0, 0.01) == (1.4, 0.4)   # decider beats the environment
    assert plan.resolve("n", 0, 0.01) == (1.01, 0.01)  # decider over the natural latency
    assert asked == [("e", 0, 0.4), ("n", 0, 0.01)], "overridden occurrences never ask"

    plain = DelayPlan(environment=[("e", None, 0.4)])
    assert plain.resolve("e", 0, 0.01) == (0.4, 0.4)  # environment beats natural
    assert plain.resolve("n", 3, 0.01) == (0.01, 0.01)  # natural when nobody decides


def test_schedule_records_only_decisions_that_differ_from_the_default() -> None:
    plan = DelayPlan(environment=[("env", None, 0.2)],
                     overrides=[("a", 1, 0.5), ("same", None, 0.0), ("env", 0, 0.2)],
                     decider=lambda point, k, default: 0.9 if point == "b" else default)
    world = World(0, plan)
    taken = [world.pause(point, 0.0, "test") for point in
             ("a", "a", "a", "same", "env", "env", "b", "c")]
    assert taken == [0.0, 0.5, 0.0, 0.0, 0.2, 0.2, 0.9, 0.0]
    assert world.schedule == (Decision("a", 1, 0.5), Decision("b", 0, 0.9))
    assert world.occurrences == {"a": 3, "same": 1, "env": 2, "b": 1, "c": 1}
    delays = [(e.detail.point, e.detail.occurrence, e.detail.delay)
              for e in world.trace if e.kind == "delay"]
    assert delays == [("a", 1, 0.5), ("b", 0, 0.9)]


def test_a_replayed_schedule_takes_the_same_decisions() -> None:
    first = World(0, DelayPlan(decider=lambda point, k, d: 0.1 * k))
    for _ in range(4):
        first.pause("p", 0.0, "test")
    again = World(0, DelayPlan(decider=Replay(first.schedule)))
    assert [again.pause("p", 0.0, "test") for _ in range(4)] == [0.1 * k for k in range(4)]
    assert again.schedule == first.schedule


# -- World.sleep -----------------------------------------------------------------------------------

def test_sleep_keeps_control_at_zero_delay_except_at_always_yield_points() -> None:
    world = World(0, DelayPlan(overrides=[("slow", None, 0.25)]),
                  always_yield=frozenset({"yielding"}))
    env = world.env
    log: list[tuple[str, float]] = []

    def coroutine() -> Any:
        log.append(("a: start", env.now))
        assert world.sleep("plain", 0.0, "a") is None
        log.append(("a: past plain point", env.now))
        ev = world.sleep("yielding", 0.0, "a")
        assert ev is not None
        yield ev
        log.append(("a: past yielding point", env.now))
        ev = world.sleep("slow", 0.0, "a")
        assert ev is not None
        yield ev
        log.append(("a: past slow point", env.now))

    def bystander() -> Any:
        log.append(("b: runs", env.now))
        yield env.timeout(0)

    env.process(coroutine())
    env.process(bystander())
    env.run()
    assert log == [("a: start", 0), ("a: past plain point", 0), ("b: runs", 0),
                   ("a: past yielding point", 0), ("a: past slow point", 0.25)]


# -- trace -----------------------------------------------------------------------------------------

def _record_story(recorder: TraceRecorder, clock: list[float]) -> None:
    recorder.emit("client0", "X", 0, ClientSend(1, 0, 1, 32, 5))
    clock[0] = 0.5
    recorder.emit("engine.scheduler", "X", 3, SchedAdd(0))
    # the older form: the record of a kind by name, its fields as a dict
    recorder.record("engine.kv", "kv.alloc", "X", 3, {"blocks": [0, 1], "table": [0, 1]})


def test_trace_hash_is_the_hash_of_the_events_and_needs_no_retained_events() -> None:
    clock = [0.0]
    kept = TraceRecorder(lambda: clock[0])
    _record_story(kept, clock)
    clock = [0.0]
    streamed = TraceRecorder(lambda: clock[0], retain=False)
    _record_story(streamed, clock)

    assert [(e.seq, e.time, e.kind) for e in kept.events] == \
        [(0, 0.0, "client.send"), (1, 0.5, "sched.add"), (2, 0.5, "kv.alloc")]
    assert kept.hexdigest() == trace_hash_of(kept.events)
    assert streamed.events == () and streamed.count == 3
    assert streamed.hexdigest() == kept.hexdigest()
    assert trace_hash_of(kept.events[:2]) != kept.hexdigest()


def test_a_run_hashes_the_same_with_or_without_retaining_its_trace() -> None:
    workload = Workload(engine=EngineConfig(step_time=0.01), requests=(
        RequestSpec("X", prompt_tokens=32, max_tokens=5, abort_at=0.02),
        RequestSpec("X", at=0.03, max_tokens=3)))
    kept = run_workload(workload, load_policy("buggy"))
    lean = run_workload(workload, load_policy("buggy"), retain_trace=False)
    assert kept.trace_hash == trace_hash_of(kept.trace)
    assert len(kept.trace) == kept.events > 0
    assert lean.trace == ()
    assert (lean.trace_hash, lean.events, lean.violations) == \
        (kept.trace_hash, kept.events, kept.violations)


# -- channels --------------------------------------------------------------------------------------

def test_channel_is_fifo_a_later_faster_message_never_overtakes() -> None:
    point = "ipc.input:transit"
    world = World(0, DelayPlan(overrides=[(point, 0, 0.05)]))
    env = world.env
    log: list[tuple[str, float]] = []
    channel = Channel(world, "ipc:frontend0->engine", point, 0.001,
                      lambda msg: log.append((msg, round(env.now, 9))))

    def sender() -> Any:
        channel.send("first", ["A"])          # occurrence 0: 50 ms in transit
        yield env.timeout(0.01)
        channel.send("second", ["B"])         # 1 ms would land at 0.011: held behind "first"
        yield env.timeout(0.09)
        channel.send("third", ["C"])          # the pipe is clear again

    env.process(sender())
    env.run()
    assert log == [("first", 0.05), ("second", 0.05), ("third", 0.101)]
    arrive = [round(e.detail.arrive, 9) for e in world.trace if e.kind == "ipc.send"]
    assert arrive == [0.05, 0.05, 0.101]


@pytest.mark.parametrize("delays", [(0.0, 0.0), (0.03, 0.0), (0.0, 0.03), (0.02, 0.01)])
def test_channel_order_is_send_order_whatever_the_delays(delays: tuple[float, float]) -> None:
    point = "ipc.output:transit"
    world = World(0, DelayPlan(overrides=[(point, k, d) for k, d in enumerate(delays)]))
    got: list[str] = []
    channel = Channel(world, "ch", point, 0.0005, got.append)
    channel.send("m0", ["A"])
    channel.send("m1", ["A"])
    world.env.run()
    assert got == ["m0", "m1"]
