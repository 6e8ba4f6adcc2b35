"""The fixture's searches: ``racesim.explore(...)`` and ``racesim.diff(...)``.

Both return a list of :class:`Finding` (an empty list is a clean result, so a test writes
``assert racesim.explore(...) == []``) and write each finding's counterexample file to
``--racesim-report`` (else ``racesim-out/`` in the current folder), so the replay command a
failing assertion prints works as printed, from any folder.

``engine=`` is "model" or "vllm"; ``vllm_src=``/``vllm_patch=`` (and ``vllm_base=``) run a vLLM
tree or patch. vLLM is imported once per process: ``explore`` on a tree imports it in the test
process (which must then not have imported another vLLM); ``diff`` runs each tree in a process
of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Finding", "explore", "diff"]


@dataclass(frozen=True)
class Finding:
    """A race the search found: its invariants, reach, counterexample file and the one
    command that replays it."""

    scenario: str
    policy: str
    invariants: tuple[str, ...]
    reach: str | None
    counterexample: str | None
    replay: str

    def __repr__(self) -> str:  # what a failing ``assert ... == []`` shows
        return (f"<{self.scenario} / {self.policy}: {', '.join(self.invariants)} "
                f"({self.reach or 'unjudged'}); replay: {self.replay}>")


def _backend(engine: str, vllm_src: str | None, vllm_patch: str | None,
             vllm_base: str | None) -> Any:
    from racesim.runner import resolve_backend

    if vllm_src is None and vllm_patch is None and vllm_base is None:
        return resolve_backend(engine)
    return resolve_backend("vllm" if engine == "model" else engine, src=vllm_src,
                           patch=vllm_patch, base=vllm_base)


def explore(scenario: Any, policy: str, out_dir: Path, seed: int, *, engine: str = "model",
            reach: str = "all", vllm_src: str | None = None, vllm_patch: str | None = None,
            vllm_base: str | None = None, budget: int = 100, strategy: str = "random",
            options: Mapping[str, str] | None = None, skip: Iterable[str] = (),
            vllm: str | None = None, shrink_runs: int = 200,
            ids: str | None = None) -> list[Finding]:
    from racesim.explore import explore as run_explore
    from racesim.plugin.arguments import load as _load, options as _options
    from racesim.runner import replay_command

    backend = _backend(engine, vllm_src, vllm_patch, vllm_base)
    scen, _name = _load(scenario)
    scen = scen.with_vllm(vllm or (backend.base if backend.has_tree else None))
    out_dir.mkdir(parents=True, exist_ok=True)
    res = run_explore(scen, policy, options=_options(options), strategy=strategy,
                      budget=budget, seed=seed, workers=1, skip=tuple(skip),
                      out_dir=out_dir.resolve(), reach=reach, engine=backend,
                      shrink_runs=shrink_runs, ids=ids)
    if not res.invariants or res.counterexample is None:
        return []
    path = res.counterexample_path
    return [Finding(scen.name, policy, tuple(res.invariants), res.counterexample.reach, path,
                    replay_command(path or "", policy, backend.engine,
                                   backend.cli_args() if backend.has_tree else ()))]


def diff(scenario: Any, policy: str, out_dir: Path, seed: int, *,
         vllm_src: str | None = None, vllm_patch: str | None = None,
         base_src: str | None = None, base_patch: str | None = None,
         vllm_base: str | None = None, reach: str = "all", budget: int = 100,
         strategy: str = "random", options: Mapping[str, str] | None = None,
         skip: Iterable[str] = (), shrink_runs: int = 100) -> list[Finding]:
    """What the candidate opens against the baseline: one Finding per opened invariant."""
    from racesim.diff import diff as run_diff
    from racesim.plugin.arguments import load as _load, options as _options
    from racesim.runner import resolve_backend

    candidate = resolve_backend("vllm", src=vllm_src, patch=vllm_patch, base=vllm_base)
    baseline = resolve_backend("vllm", src=base_src, patch=base_patch, base=vllm_base) \
        if base_src is not None or base_patch is not None else resolve_backend("vllm")
    scen, _name = _load(scenario)
    out_dir.mkdir(parents=True, exist_ok=True)
    res = run_diff([scen.with_vllm(candidate.base)], [policy], baseline=baseline,
                   candidate=candidate, budget=budget, seed=seed, strategy=strategy,
                   reach=reach, skip=tuple(skip), options=_options(options),
                   shrink_runs=shrink_runs, out_dir=out_dir.resolve())
    return [Finding(cell.scenario, cell.policy, (c.invariant,), c.reach, c.counterexample,
                    c.replay or "") for cell in res.cells for c in cell.opens]
