"""Run one scenario under one policy: the library call behind ``racesim run`` and ``replay``."""

from __future__ import annotations

import inspect
import os
import sys
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from racesim.engine_model import POLICIES, RunResult, load_policy, run_workload
from racesim.engine_model.checker import check_invariant_names
from racesim.engine_model.invariants import RUNNER_INVARIANTS
from racesim.engine_model.points import POINTS, UnknownPointError
from racesim.engine_model.policies import LifecyclePolicy, id_scheme, policy_spec, with_ids
from racesim.runner.backend import MODEL, Backend, as_backend, from_record, resolve_backend
from racesim.runner.engines import SUPPORTED_VLLM, installed_vllm, why_not_run
from racesim.reports.commands import replay_command, run_command
from racesim.scenarios import Scenario
from racesim.sim import Decider, Decision, DelayPlan, InputError, parse_point_key
from racesim.sim.points import delay_entry
from racesim.sim.strategies import Replay

__all__ = ["RunSpec", "run_scenario", "vllm_frontend", "Backend", "resolve_backend", "MODEL",
           "as_backend",
           "from_record", "parse_delay_option", "replay_command", "run_command",
           "PlanEntry", "PolicyError", "policy_title", "import_from_cwd"]

PlanEntry = tuple[str, int | None, float]


def parse_delay_option(text: str) -> PlanEntry:
    """``POINT=SECONDS`` or ``POINT#K=SECONDS`` from the command line."""
    key, sep, value = text.partition("=")
    if not sep:
        raise InputError(f"--delay {text!r}: expected POINT=SECONDS or POINT#K=SECONDS")
    point, k = parse_point_key(key.strip(), POINTS, f"--delay {text!r}")
    try:
        seconds: object = float(value)
    except ValueError:
        seconds = value
    return delay_entry(point, k, seconds, POINTS, f"--delay {text!r}")


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What a run is of, apart from its delays: a scenario, a policy and its options, a seed,
    the invariants left unchecked, the :class:`Backend` and the request-ID scheme (``ids``:
    "given", "release", or None for the policy's default; see ``engine_model.policies``).
    Explore, shrink, matrix, diff and the hypothesis search pass one around (it pickles, for
    worker processes); :meth:`run` runs it with a delay source. A backend given as a string
    ("model"/"vllm") is resolved to the installed release's :class:`Backend`."""

    scenario: Scenario
    policy: str
    options: tuple[tuple[str, str], ...] = ()
    seed: int = 0
    skip: tuple[str, ...] = ()
    backend: Backend = MODEL
    ids: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.backend, Backend):
            object.__setattr__(self, "backend", as_backend(self.backend))

    @classmethod
    def of(cls, scenario: Scenario, policy: str, *, options: Mapping[str, str] | None = None,
           seed: int = 0, skip: Iterable[str] = (), engine: str | Backend = "model",
           ids: str | None = None) -> RunSpec:
        """A spec with its options sorted and its skipped invariants checked and sorted."""
        return cls(scenario, policy, tuple(sorted((options or {}).items())), seed,
                   tuple(sorted(check_invariant_names(tuple(skip)))), as_backend(engine), ids)

    @property
    def engine(self) -> str:
        """``"model"`` or ``"vllm"``: the backend's kind."""
        return self.backend.engine

    @property
    def id_scheme(self) -> str:
        """The ID scheme the run uses: "given", "release" or "own" (the policy's)."""
        import_from_cwd(self.policy)
        return id_scheme(policy_spec(self.policy), self.ids)

    @property
    def option_dict(self) -> dict[str, str]:
        return dict(self.options)

    def with_scenario(self, scenario: Scenario) -> RunSpec:
        return replace(self, scenario=scenario)

    def run(self, *, witness: bool = False, delays: Iterable[PlanEntry] = (),
            schedule: Sequence[Decision] | None = None, decider: Decider | None = None,
            retain_trace: bool = True, hash_trace: bool = True) -> RunResult:
        """One run of the spec (see :func:`run_scenario` for the delay sources)."""
        return run_scenario(self.scenario, self.policy, options=self.option_dict,
                            seed=self.seed, witness=witness, delays=delays, schedule=schedule,
                            decider=decider, skip=self.skip, retain_trace=retain_trace,
                            hash_trace=hash_trace, engine=self.backend, ids=self.ids)


def run_scenario(scenario: Scenario, policy: str, *, options: Mapping[str, str] | None = None,
                 seed: int = 0, witness: bool = False, delays: Iterable[PlanEntry] = (),
                 schedule: Sequence[Decision] | None = None, decider: Decider | None = None,
                 skip: Iterable[str] = (), retain_trace: bool = True,
                 hash_trace: bool = True, engine: str | Backend = "model",
                 ids: str | None = None) -> RunResult:
    """One deterministic run. Its delays come from the scenario's ``[delays]``, then ``witness``
    and ``delays`` (which win), then one decider: ``decider`` (exploration) or ``schedule``
    (a recorded run, replayed exactly by :class:`~racesim.sim.strategies.Replay`).

    ``engine`` picks the backend: ``"model"`` (racesim's model), ``"vllm"`` (vLLM's own
    engine-side classes of the installed release, :mod:`racesim.engine_vllm`), or a
    :class:`Backend` resolved by :func:`resolve_backend` (a vLLM tree or patch); the same
    schedule means the same delays at the same await points on all of them. ``ids`` is the
    request-ID scheme: "given" (the client's IDs), "release" (what the profile's release
    assigns: internal IDs from 0.14) or None (the policy's default, ``LifecyclePolicy.ids``)."""
    skip_set = check_invariant_names(tuple(skip))
    backend = as_backend(engine)
    backend.check(scenario.vllm)
    overrides: list[PlanEntry] = []
    if witness:
        if not (scenario.witness or scenario.has_witness):
            raise InputError(f"--witness: scenario {scenario.name!r} has no [witness] table")
        overrides.extend(scenario.witness)
    overrides.extend(delays)
    if schedule is not None:
        if decider is not None:
            raise ValueError("a replayed schedule is the run's decider: give schedule or decider")
        decider = Replay(schedule)
    plan = DelayPlan(environment=scenario.delays, overrides=overrides, decider=decider)
    import_from_cwd(policy)
    try:
        loaded = load_policy(policy, options)
        scheme = id_scheme(type(loaded), ids)
        hooks = with_ids(loaded, scheme, scenario.vllm)
        if not backend.is_vllm:
            return run_workload(scenario.workload, hooks, seed=seed, plan=plan, skip=skip_set,
                                retain_trace=retain_trace, hash_trace=hash_trace)
        from racesim.engine_vllm import run_workload as run

        if (why := why_not_run(scenario.workload, "vllm")) is not None:
            raise InputError(f"{scenario.name}: {why}")
        if backend.runner == "model" and scenario.workload.engine.num_speculative_tokens:
            raise InputError(f"{scenario.name}: RACESIM_VLLM_RUNNER=model: the model's runner "
                             f"has no speculative decoding (engine.num_speculative_tokens); "
                             f"unset it to run vLLM's own runner")
        backend.activate()  # a tree's vLLM, imported in this process before the run
        release = SUPPORTED_VLLM.get(backend.base or "") if backend.has_tree \
            else installed_vllm()
        points = [p for p, _k, _d in (*scenario.delays, *overrides)] \
            + [d.point for d in schedule or ()]
        frontend, note = vllm_frontend(scenario.workload, loaded.name if policy in POLICIES
                                       else policy, options, release, backend.frontend,
                                       own_ids=scheme == id_scheme(type(loaded), None),
                                       points=points)
        result = run(scenario.workload, hooks, seed=seed, plan=plan, skip=skip_set,
                     retain_trace=retain_trace, hash_trace=hash_trace, frontend=frontend,
                     **({"runner": backend.runner} if backend.runner else {}))
        if backend.runner == "model":  # the model's runner keeps no books of vLLM's to check
            result = replace(result, runner="model", evaluated=tuple(
                n for n in result.evaluated if n not in RUNNER_INVARIANTS))
        return replace(result, frontend="vllm" if frontend == "asyncllm" else "model",
                       frontend_note=note or "")
    except UnknownPointError as exc:  # a user policy's misspelled point: name the policy
        if policy in POLICIES:
            raise
        raise PolicyError.of(policy, exc) from None
    except InputError:
        raise
    except Exception as exc:
        if policy in POLICIES:  # a built-in policy failing is racesim's bug: keep the traceback
            raise
        raise PolicyError.of(policy, exc) from None


class PolicyError(InputError):
    """A user's policy raised: one line naming the policy, its method and file:line."""

    @classmethod
    def of(cls, policy: str, exc: BaseException) -> PolicyError:
        try:
            own = os.path.realpath(inspect.getfile(policy_spec(policy)))
        except (TypeError, OSError, InputError):
            own = ""
        chain: list[BaseException] = []
        e: BaseException | None = exc
        while e is not None and e not in chain:  # simpy re-raises a copy: the cause is ours
            chain.append(e)
            e = e.__cause__ or e.__context__
        where = None
        for e in chain:  # the innermost frame in the policy's own file, else the innermost
            frames = traceback.extract_tb(e.__traceback__)
            mine = [f for f in frames if os.path.realpath(f.filename) == own]
            where = mine[-1] if mine else where or (frames[-1] if frames else None)
        at = f" in {where.name}() at {where.filename}:{where.lineno}" if where else ""
        text = str(exc).splitlines()[0] if str(exc) else ""
        text = text if len(text) <= 200 else text[:199] + "…"
        return cls(f"policy {policy!r} raised {type(exc).__name__}{at}"
                   + (f": {text!r}" if text else ""))


def vllm_frontend(workload: Any, policy: str, options: Mapping[str, str] | None,
                  release: str | None, wanted: str | None, *, own_ids: bool = True,
                  points: Iterable[str] = ()) -> tuple[str, str | None]:
    """The frontend a run on the vllm backend uses (``engine_vllm.frontend.select.choose``:
    ``"asyncllm"``, or ``"model"`` with the reason), checked: one InputError line when the
    backend cannot run this scenario and policy with it (conform checks its cells the same way
    before any run)."""
    from racesim.engine_vllm import unsupported_reason
    from racesim.engine_vllm.frontend.select import choose

    frontend, note = choose(wanted, workload, policy, release, options=options,
                            own_ids=own_ids, points=points)
    why = unsupported_reason(workload, policy, options, release, frontend)
    if why is not None:
        raise InputError(why)
    return frontend, note


def import_from_cwd(policy: str) -> None:
    """Let ``-p mymod:MyPolicy`` find ``mymod.py`` in the current folder, as ``python -m`` does.

    Only for a ``module:Class`` spec; the folder goes last, so it never shadows an installed
    module (``sim``, ``hypothesis``...)."""
    if ":" in policy and policy not in POLICIES:
        cwd = os.getcwd()
        if cwd not in sys.path and "" not in sys.path:
            sys.path.append(cwd)


def policy_title(policy: str) -> str:
    """``buggy`` or ``mymod:Mine (mine)``, then the policy's summary: for run headers."""
    try:
        import_from_cwd(policy)
        cls: type[LifecyclePolicy] = policy_spec(policy)
    except InputError:
        return policy
    name = policy if cls.name == policy else f"{policy} ({cls.name})"
    return f"{name}: {cls.summary}" if cls.summary else name
