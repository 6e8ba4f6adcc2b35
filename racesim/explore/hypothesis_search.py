"""The ``hypothesis`` exploration strategy: schedules drawn and shrunk by hypothesis itself."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from racesim.runner.summary import RunSummary
from racesim.runner import RunSpec
from racesim.sim.strategies import StrategyConfig, delay_alphabet

__all__ = ["hypothesis_search", "schedule_strategy"]


def schedule_strategy(config: StrategyConfig, max_delays: int = 6):  # type: ignore[no-untyped-def]
    """Lists of (point, occurrence, delay) over the points a baseline run passed.

    Simpler, to hypothesis's shrinker, is fewer delays, earlier points and occurrences, and
    smaller delays (the alphabet is ordered 0, epsilon, one step, five steps).
    """
    from hypothesis import strategies as st

    alphabet = delay_alphabet(config.scale)
    points = config.points
    decision = st.sampled_from(points).flatmap(
        lambda p: st.tuples(st.just(p), st.integers(0, max(0, config.occurrences[p] - 1)),
                            st.sampled_from(alphabet)))
    return st.lists(decision, max_size=max_delays, unique_by=lambda d: (d[0], d[1]))


def hypothesis_search(spec: RunSpec, config: StrategyConfig, budget: int,
                      standing: frozenset[str], record: Callable[..., None],
                      over: Callable[[], bool],
                      progress: Callable[[int, int, int], None] | None,
                      home: Path | None = None,
                      ) -> list[tuple[str, int, float]] | None:
    """Let hypothesis look for a schedule that violates something beyond the baseline.

    Hypothesis keeps caches in a ``.hypothesis`` folder; it goes under ``home`` (the explore
    ``--out`` folder), never into the current folder. No example database is used: a result
    must not depend on earlier runs."""
    from hypothesis import HealthCheck, Phase, configuration, find, settings
    from hypothesis.errors import NoSuchExample

    state = {"runs": 0, "violating": 0}

    def violates(entries: list[tuple[str, int, float]]) -> bool:
        if over():
            return False
        r = spec.run(delays=entries, retain_trace=False, hash_trace=False)
        state["runs"] += 1  # run 0 is the baseline, recorded by the caller
        record(RunSummary(state["runs"], r.trace_hash, r.violated, r.schedule, r.widened))
        if r.violated:
            state["violating"] += 1
        if progress is not None:
            progress(state["runs"], budget, state["violating"])
        return bool(set(r.violated) - standing)

    before = getattr(configuration, "__hypothesis_home_directory", None)
    if home is not None:
        configuration.set_hypothesis_home_dir(home / ".hypothesis")
    try:
        return find(schedule_strategy(config), violates,
             settings=settings(max_examples=budget, database=None, deadline=None,
                               suppress_health_check=list(HealthCheck),
                               phases=[Phase.generate, Phase.shrink]),
             random=random.Random(spec.seed))
    except NoSuchExample:
        return None
    finally:
        configuration.set_hypothesis_home_dir(before)
