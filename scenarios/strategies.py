"""Hypothesis strategies for racesim: generated scenarios and delay schedules.

``scenarios()`` draws small, valid workloads whose request IDs come from a tiny pool, so the
same ID is reused (and raced) often; ``schedules(scenario)`` draws delays for the await points
that scenario actually passes. Together they let a property test say "for every workload and
every interleaving, policy P keeps invariant I"::

    from hypothesis import given, strategies as st
    from racesim.scenarios.strategies import scenarios, schedules

    @given(st.data())
    def test_internal_id_is_safe(data):
        scenario = data.draw(scenarios())
        schedule = data.draw(schedules(scenario, policy="internal-id"))
        ...

Both validate their arguments when called (not when first drawn from), raising
``hypothesis.errors.InvalidArgument`` as hypothesis's own strategies do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from functools import lru_cache
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from racesim.engine_model.config import TOPOLOGIES
from racesim.engine_model.points import POINTS
from racesim.engine_model.policies import load_policy
from racesim.engine_model.system import run_workload
from racesim.engine_model.versions import PROFILES
from racesim.scenarios.loader import Scenario, scenario_from_dict
from racesim.sim.errors import InputError
from racesim.sim.points import Decision, DelayPlan
from racesim.sim.strategies import delay_alphabet

__all__ = ["scenarios", "schedules"]

#: Seconds per engine step in generated scenarios; every generated time is a multiple of half
#: of it, so that events at equal times (the interesting ties) are common.
_STEP = 0.01
_TICK = _STEP / 2
_MAX_FRONTENDS = 4


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise InvalidArgument(message)


def _check_optional_bool(name: str, value: object) -> None:
    _check(value is None or isinstance(value, bool),
           f"{name}={value!r} must be None (any) or a bool")


def _check_bool(name: str, value: object) -> None:
    _check(isinstance(value, bool), f"{name}={value!r} must be a bool")


def _check_int(name: str, value: object, low: int, high: int | None = None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low \
        and (high is None or value <= high)
    bound = f">= {low}" if high is None else f"in {low}..{high}"
    _check(ok, f"{name}={value!r} must be an integer {bound}")


def _ticks(n: int) -> float:
    return round(n * _TICK, 6)


@st.composite
def _request(draw: Callable[..., Any], *, id_pool: tuple[str, ...], frontends: int,
             max_start_ticks: int, allow_aborts: bool, allow_disconnects: bool,
             allow_stop_strings: bool, allow_eos: bool, allow_n: bool,
             n_applies: bool, allow_shared_prompts: bool) -> dict[str, Any]:
    """One ``[[request]]`` table. Every optional behaviour is drawn as "absent" first, so it
    shrinks away; numbers shrink towards small and early."""
    at = _ticks(draw(st.integers(0, max_start_ticks)))
    max_tokens = draw(st.integers(1, 12))
    req: dict[str, Any] = {
        "id": draw(st.sampled_from(id_pool)),
        "at": at,
        "prompt_tokens": draw(st.integers(1, 32)),
        "max_tokens": max_tokens,
    }
    if frontends > 1:
        req["frontend"] = draw(st.integers(0, frontends - 1))
    # Drawn even where it cannot apply (P/D), so that P/D never has the shorter choice
    # sequence: hypothesis would take that for "simpler" and shrink towards P/D.
    if allow_n and draw(st.booleans()) and n_applies:
        req["n"] = 2
    if allow_shared_prompts and draw(st.booleans()):
        req["prompt"] = "shared"  # every request drawing it has the same text: prefix hits
    ending = ["none"]
    ending += ["abort"] if allow_aborts else []
    ending += ["disconnect"] if allow_disconnects else []
    ending += ["stop_string"] if allow_stop_strings else []
    ending += ["eos"] if allow_eos else []
    how = draw(st.sampled_from(ending))
    if how == "abort":
        req["abort_at"] = round(at + _ticks(draw(st.integers(0, 30))), 6)
    elif how == "disconnect":
        req["disconnect_after_tokens"] = draw(st.integers(1, max_tokens))
    elif how == "stop_string":
        req["stop_string_at"] = draw(st.integers(1, max_tokens))
    elif how == "eos":
        req["eos_at"] = draw(st.integers(1, max_tokens))
    return req


def scenarios(*, topology: str | None = None, frontends: int | None = None,
              async_scheduling: bool | None = None, min_requests: int = 1,
              max_requests: int = 6, id_pool: Sequence[str] = ("X", "Y"),
              allow_aborts: bool = True, allow_disconnects: bool = True,
              allow_stop_strings: bool = True, allow_eos: bool = True, allow_n: bool = True,
              allow_shared_prompts: bool = True, max_start: float = 0.2,
              vllm: str | None = None) -> st.SearchStrategy[Scenario]:
    """Valid, small :class:`~racesim.scenarios.loader.Scenario` objects (named ``"generated"``).

    Each has ``min_requests..max_requests`` scripted requests whose IDs are drawn from
    ``id_pool`` (two IDs by default, so reuse is the rule), starting within ``max_start``
    simulated seconds, with at most 12 output tokens each, so that a run takes milliseconds.
    A request may abort (``abort_at``), disconnect after k tokens, end by a stop string or by
    EOS, ask for ``n = 2`` samples, name one shared prompt (so that, with prefix caching, it
    hits the blocks of the others that name it), and use any of the API servers. The engine
    steps every 10 ms; the KV pool is large enough that no request waits for blocks.

    P/D scenarios never ask for ``n > 1``: the model's decode children all read the one
    prefill's blocks and the first child's transfer-done notice frees them, a P/D fan-out
    question (violated under every policy, with one request) rather than a request-ID race.

    ``None`` for ``topology`` (``"single"``/``"pd"``), ``frontends`` or ``async_scheduling``
    means "draw it" (1 or 2 API servers); a value fixes it (up to 4 API servers). Each
    ``allow_*`` flag, set to False, switches one request behaviour off. ``vllm`` names the
    vLLM profile the scenarios run on (None: the default profile).

    Shrinking: a simpler scenario has fewer requests, a single engine rather than P/D, one
    API server, synchronous scheduling, requests that simply run to ``max_tokens`` (no abort,
    disconnect, stop string, EOS, ``n > 1`` or shared prompt), the first ID of the pool, fewer
    tokens and earlier start times.
    """
    _check(topology is None or topology in TOPOLOGIES,
           f"topology={topology!r} must be None (any) or one of {', '.join(TOPOLOGIES)}")
    if frontends is not None:
        _check_int("frontends", frontends, 1, _MAX_FRONTENDS)
    _check_optional_bool("async_scheduling", async_scheduling)
    _check(vllm is None or vllm in PROFILES,
           f"vllm={vllm!r} must be None (the default profile) or one of {', '.join(PROFILES)}")
    _check_int("min_requests", min_requests, 1)
    _check_int("max_requests", max_requests, 1, 64)
    _check(min_requests <= max_requests,
           f"min_requests={min_requests!r} must be <= max_requests={max_requests!r}")
    _check(not isinstance(id_pool, (str, bytes)) and isinstance(id_pool, Sequence)
           and len(id_pool) > 0,
           f"id_pool={id_pool!r} must be a non-empty sequence of request IDs")
    _check(all(isinstance(i, str) and i for i in id_pool),
           f"id_pool={id_pool!r} must hold non-empty strings only")
    for name, flag in (("allow_aborts", allow_aborts), ("allow_disconnects", allow_disconnects),
                       ("allow_stop_strings", allow_stop_strings), ("allow_eos", allow_eos),
                       ("allow_n", allow_n), ("allow_shared_prompts", allow_shared_prompts)):
        _check_bool(name, flag)
    _check(isinstance(max_start, (int, float)) and not isinstance(max_start, bool)
           and math.isfinite(max_start) and max_start >= 0,
           f"max_start={max_start!r} must be a finite number of seconds >= 0")
    pool = tuple(dict.fromkeys(id_pool))
    max_start_ticks = int(max_start / _TICK + 1e-9)
    topologies = TOPOLOGIES if topology is None else (topology,)

    return _scenario(topologies=topologies, frontends=frontends,
                     async_scheduling=async_scheduling, min_requests=min_requests,
                     max_requests=max_requests, pool=pool, max_start_ticks=max_start_ticks,
                     allow_aborts=allow_aborts, allow_disconnects=allow_disconnects,
                     allow_stop_strings=allow_stop_strings, allow_eos=allow_eos, allow_n=allow_n,
                     allow_shared_prompts=allow_shared_prompts, vllm=vllm)


# Composites are module-level (not closures) so that hypothesis computes their labels once,
# not for every strategy object a test builds per example.
@st.composite
def _scenario(draw: Callable[..., Any], *, topologies: tuple[str, ...], frontends: int | None,
              async_scheduling: bool | None, min_requests: int, max_requests: int,
              pool: tuple[str, ...], max_start_ticks: int, allow_aborts: bool,
              allow_disconnects: bool, allow_stop_strings: bool, allow_eos: bool,
              allow_n: bool, allow_shared_prompts: bool, vllm: str | None) -> Scenario:
    topo = draw(st.sampled_from(topologies))
    n_fe = frontends if frontends is not None else draw(st.integers(1, 2))
    async_sched = async_scheduling if async_scheduling is not None else draw(st.booleans())
    request = _request(id_pool=pool, frontends=n_fe, max_start_ticks=max_start_ticks,
                       allow_aborts=allow_aborts, allow_disconnects=allow_disconnects,
                       allow_stop_strings=allow_stop_strings, allow_eos=allow_eos,
                       allow_n=allow_n, n_applies=topo != "pd",
                       allow_shared_prompts=allow_shared_prompts)
    requests = draw(st.lists(request, min_size=min_requests, max_size=max_requests))
    data: dict[str, Any] = {
        "name": "generated",
        "summary": "drawn by racesim.scenarios.strategies.scenarios()",
        "topology": topo,
        "frontends": n_fe,
        "horizon": 10.0,
        # A request needs at most n=2 x 3 blocks (44 tokens): none waits for the pool.
        "engine": {"num_blocks": max(64, 6 * max_requests), "block_size": 16,
                   "max_num_seqs": 16, "step_time": _STEP, "async_scheduling": async_sched,
                   **({} if vllm is None else {"vllm": vllm})},
        "ipc": {"latency": 0.0005},
        "request": requests,
    }
    try:
        return scenario_from_dict(data, "<generated>")
    except InputError as exc:  # pragma: no cover - a bug in this strategy, not the user's
        raise AssertionError(f"scenarios() drew an invalid scenario: {exc}") from exc


@lru_cache(maxsize=256)
def _baseline_occurrences(scenario: Scenario, policy: str,
                          seed: int) -> tuple[tuple[str, int], ...]:
    """How often each await point is passed in the unperturbed run, in catalogue order."""
    result = run_workload(scenario.workload, load_policy(policy), seed=seed,
                          plan=DelayPlan(environment=scenario.delays), retain_trace=False)
    counts = result.occurrences
    return tuple((p, counts[p]) for p in POINTS.names() if counts.get(p, 0) > 0)


def schedules(scenario: Scenario, *, max_delays: int = 4, policy: str = "buggy",
              seed: int = 0, points: Collection[str] | None = None,
              ) -> st.SearchStrategy[tuple[Decision, ...]]:
    """Schedules for ``scenario``: tuples of at most ``max_delays`` :class:`racesim.sim.Decision`.

    Each decision delays one occurrence ``(point, k)`` that an unperturbed run of
    ``scenario`` under ``policy`` (seed ``seed``) really passes, so every decision is
    consulted at least as long as the delays before it do not change the run too much. A delay
    is either drawn from exploration's alphabet {0, step/100, one step, five steps}
    (:func:`racesim.sim.strategies.delay_alphabet`; step = the scenario's ``engine.step_time``)
    or is any float in [0, five steps]. No two decisions
    share an occurrence; the tuple is sorted. ``points`` (await-point names) narrows the
    delays to those points. Pass it to ``racesim.run_scenario(..., schedule=...)`` or to the
    pytest fixture's ``delays=``.

    Shrinking: a simpler schedule has fewer delays, at earlier await points (catalogue order)
    and earlier occurrences, and smaller delays (the alphabet's first entries, then floats
    towards 0).
    """
    _check(isinstance(scenario, Scenario),
           f"scenario={scenario!r} must be a racesim.scenarios.Scenario "
           "(draw one from scenarios())")
    _check_int("max_delays", max_delays, 0)
    _check(isinstance(policy, str), f"policy={policy!r} must be a policy name")
    _check(isinstance(seed, int) and not isinstance(seed, bool), f"seed={seed!r} must be an int")
    try:
        load_policy(policy)
    except InputError as exc:
        raise InvalidArgument(f"policy={policy!r}: {exc}") from None
    if points is not None:
        _check(not isinstance(points, str) and all(isinstance(p, str) for p in points),
               f"points={points!r} must be a collection of await-point names")
        unknown = [p for p in points if p not in POINTS]
        _check(not unknown, f"points: unknown await point {unknown[:1]!r} (known: "
                            f"{', '.join(POINTS.names())})")
    occurrences = tuple((p, n) for p, n in _baseline_occurrences(scenario, policy, seed)
                        if points is None or p in points)
    if not occurrences or max_delays == 0:
        return st.just(())
    step = scenario.workload.engine.step_time
    delay = st.one_of(st.sampled_from(delay_alphabet(step)),
                      st.floats(0.0, 5 * step, allow_nan=False, allow_infinity=False))
    return st.lists(_decision(occurrences, delay), max_size=max_delays,
                    unique_by=_occurrence_of).map(_sorted_tuple)


@st.composite
def _decision(draw: Callable[..., Any], occurrences: tuple[tuple[str, int], ...],
              delay: st.SearchStrategy[float]) -> Decision:
    point, count = draw(st.sampled_from(occurrences))
    return Decision(point, draw(st.integers(0, count - 1)), draw(delay))


def _occurrence_of(d: Decision) -> tuple[str, int]:
    return d.point, d.occurrence


def _sorted_tuple(decisions: list[Decision]) -> tuple[Decision, ...]:
    return tuple(sorted(decisions))
