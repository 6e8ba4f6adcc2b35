"""The bug corpus: real vLLM lifecycle bugs, explored with no hint on the release each lived in
and on the release that fixed it, on the vllm backend (vLLM's own code), the model alongside.

An entry is a scenario under ``scenarios/corpus/`` with a ``[corpus]`` table and no
``[witness]`` or ``[delays]`` (:class:`racesim.scenarios.CorpusInfo`). For each entry and each
of its two releases this module runs :func:`racesim.explore.explore` on ``--engine vllm``
(the scenario on that release's profile, under the lifecycle vLLM has there unless the entry
names a policy) and reports whether the entry's invariant was violated, at which run and after
how many seconds. The release installed in this process runs here; another release runs in
its own virtual environment (``VENVS/<version>/bin/python -I -m racesim corpus ... --json``,
isolated, bounded and checked: :mod:`racesim.corpus.remote`), and
its results are merged. A release with no environment is skipped with the command that
installs it. Everything but the seconds is a function of the entries, budgets and seed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from racesim.corpus import remote
from racesim.corpus.remote import BadOutput, ReleaseFailed, parse_answer, run_release
from racesim.engine_model.versions import PROFILES
from racesim.runner.backend import refuse_model_runner
from racesim.runner.engines import SUPPORTED_VLLM, installed_vllm, why_not_run
from racesim.runner.engines import profile_of_release as engines_profile_of_release
from racesim.explore import ExploreResult, explore
from racesim.scenarios import Scenario, corpus_names, load_scenario
from racesim.sim import InputError

__all__ = ["CorpusOptions", "corpus_entries", "run_corpus", "profile_of_release",
           "release_python", "install_hint", "install_releases", "release_lifecycle", "ROLES",
           "entry_releases", "OPEN"]

#: the fixed release of an entry whose bug is open upstream (``fix_kind = "open"``)
OPEN = "open"

#: an entry is explored on its buggy release (is the bug found?) and on its fixed release
#: (is that release clean of the bug's symptom?)
ROLES = ("buggy", "fixed")

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class CorpusOptions:
    """What decides a corpus run's verdicts (and nothing else does, except the release)."""

    budget: int = 300
    model_budget: int = 300
    strategy: str = "random"
    seed: int = 0
    shrink_runs: int = 100
    workers: int | None = 1
    time_limit: float | None = None
    #: "live": delay only await points that are live or yield on the release (a bug users
    #: hit is live); "all" also delays latent ones (a find is then a latent hazard)
    reach: str = "live"

    def argv(self) -> list[str]:
        """The same options on a ``racesim corpus`` command line (for another release's venv)."""
        out = ["--budget", str(self.budget), "--model-budget", str(self.model_budget),
               "--strategy", self.strategy, "--seed", str(self.seed),
               "--shrink-runs", str(self.shrink_runs), "--reach", self.reach]
        if self.workers is not None:
            out += ["--workers", str(self.workers)]
        if self.time_limit is not None:
            out += ["--time-limit", str(self.time_limit)]
        return out


def corpus_entries(names: Iterable[str] = ()) -> list[Scenario]:
    """The corpus entries named (bundled names or paths), else every bundled one; a scenario
    without a ``[corpus]`` table is bad input."""
    out = []
    for name in list(names) or list(corpus_names()):
        scen = load_scenario(name)
        if scen.corpus is None:
            raise InputError(f"{name}: not a corpus entry (it has no [corpus] table)")
        out.append(scen)
    return out


def profile_of_release(release: str) -> str | None:
    """The version profile that follows ``release`` ("0.20" for "0.20.0"): the vllm
    backend's (racesim.runner.engines), else a model-only profile of the same line ("0.8" for
    "0.8.1"), else None (neither backend follows that release)."""
    found = engines_profile_of_release(release)
    if found is not None:
        # a profile follows one patch release: an earlier patch (0.9.0 against 0.9.2's
        # profile) may still hold the bug that patch fixed, so nothing follows it
        return None if _patch_key(release) < _patch_key(SUPPORTED_VLLM[found]) else found
    matching = [name for name in PROFILES if release == name or release.startswith(name + ".")]
    return max(matching, key=len, default=None)


def _patch_key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split(".") if p.isdigit())


def release_python(venvs: Path | None, release: str) -> Path | None:
    """The interpreter of ``release``'s own virtual environment under ``venvs`` (the layout of
    :mod:`racesim.corpus.releases`: ``venvs/<release>/bin/python``), if there."""
    if venvs is None:
        return None
    python = venvs / release / "bin" / "python"
    return python if python.exists() else None


def install_hint(release: str) -> str:
    """The one line that says how to get ``release``, or that no venv would help: a release
    the vllm backend has no adapter for (0.8.1, 0.9.0) cannot be installed for it."""
    if release not in SUPPORTED_VLLM.values():
        return (f"the vllm backend has no adapter for vLLM {release} (it runs "
                f"{', '.join(SUPPORTED_VLLM.values())}); only the model ran")
    return (f"vLLM {release} is not installed here: racesim corpus --install DIR installs it "
            f"(one venv per release, DIR/{release}), then racesim corpus --venvs DIR")


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))


def release_lifecycle(profile: str) -> tuple[str, dict[str, str]]:
    """The lifecycle vLLM has on a release's profile (conform's default): request IDs used as
    given before 0.14.0 (0.10 and 0.11 have v1/engine/processor.Processor, no internal IDs),
    unique internal IDs from 0.14.0 (#27987, InputProcessor.assign_request_id)."""
    from racesim.conform import lifecycle

    return lifecycle(profile)


def _lifecycle(scen: Scenario, release: str, profile: str) -> tuple[str, dict[str, str]]:
    info = scen.corpus
    if info is not None and info.policy:
        return info.policy, {}
    return release_lifecycle(profile)


def _found_summary(res: ExploreResult, target: str) -> dict[str, Any]:
    cx = res.counterexample
    violations: list[dict[str, Any]] = []
    if cx is not None:
        violations = [{k: v.get(k) for k in ("invariant", "detail", "vllm_where", "reach",
                                             "provenance")
                       if v.get(k) is not None} for v in cx.violations]
    return {"runs": res.runs, "violating_runs": res.violating_runs,
            "first_find_run": res.target_run,
            "first_find_s": None if res.target_s is None else round(res.target_s, 3),
            "elapsed_s": round(res.elapsed_s, 3), "invariants": list(res.invariants),
            "found": res.target_run is not None,
            "counterexample": res.counterexample_path if target in res.invariants else None,
            "violations": violations,
            # what the search reached (coverage) and the result in honest words
            "reached": res.reached, "finding": res.finding(),
            "error": res.error}


def _explore_one(scen: Scenario, release: str, role: str, engine: str, opts: CorpusOptions,
                 out_dir: Path | None) -> dict[str, Any]:
    """One exploration of one entry on one release and backend: found / not found."""
    info = scen.corpus
    assert info is not None
    profile = profile_of_release(release)
    if profile is None:
        known = ", ".join(PROFILES)
        return {"status": "skipped", "reason": f"no racesim profile follows vLLM {release} "
                f"(profiles: {known})"}
    s = scen.with_vllm(profile)
    why = why_not_run(s.workload, engine)
    if why is not None:
        return {"status": "skipped", "reason": why}
    policy, options = _lifecycle(scen, release, profile)
    budget = opts.budget if engine == "vllm" else opts.model_budget
    # each backend judges the symptom it can show (vLLM's own runner, the model's)
    target, symptom = info.target(engine)
    res = explore(s, policy, options=options, strategy=opts.strategy, budget=budget,
                  time_limit=opts.time_limit, seed=opts.seed, workers=opts.workers,
                  reach=opts.reach,
                  out_dir=out_dir if role == "buggy" else None, engine=engine,
                  target=target, symptom=symptom or None,
                  stop_at_target=role == "buggy",
                  # shrinking keeps the invariant, not the symptom: a symptom's find stays as found
                  shrink_runs=opts.shrink_runs if role == "buggy" and not symptom else 0)
    out = {"profile": profile, "policy": policy, "policy_options": options,
           "target": target, **_found_summary(res, target)}
    if res.interrupted:
        out["status"] = "interrupted"
    elif role == "buggy":
        out["status"] = "found" if out["found"] else "not found"
    else:
        out["status"] = "not clean" if out["found"] else "clean"
    return out


def _entry_doc(scen: Scenario) -> dict[str, Any]:
    info = scen.corpus
    assert info is not None
    return {"name": scen.name, "issue": info.issue, "fix_pr": info.fix_pr,
            "fix_kind": info.fix_kind, "fix_text": info.fix_text, "title": info.title,
            "invariant": info.invariant, "symptom": info.symptom or None,
            "vllm_invariant": info.target("vllm")[0],
            "vllm_symptom": info.target("vllm")[1] or None,
            "buggy_release": info.buggy_release,
            "fixed_release": info.fixed_release, "policy": info.policy or None,
            "description": info.description,
            "buggy": {"release": info.buggy_release},
            # an open bug has no fixed release to explore
            "fixed": {"release": OPEN, "status": OPEN} if info.fixed_release == OPEN
            else {"release": info.fixed_release}}


class _Interrupted(Exception):
    """Ctrl-C during an exploration: the cell is recorded; nothing more starts."""


def _run_here(entries: Sequence[Scenario], docs: list[dict[str, Any]], release: str,
              opts: CorpusOptions, out_dir: Path | None, progress: Progress | None) -> None:
    for scen, doc in zip(entries, docs, strict=True):
        for role in ROLES:
            if doc[role]["release"] != release:
                continue
            if progress is not None:
                progress(f"{scen.name} on vLLM {release} ({role})")
            cell = _explore_one(scen, release, role, "vllm", opts, out_dir)
            doc[role].update(cell)
            if cell.get("status") == "interrupted":
                raise _Interrupted
            doc[role]["model"] = model = _explore_one(scen, release, role, "model", opts, None)
            if model.get("status") == "interrupted":
                raise _Interrupted


def _explorations(docs: Sequence[dict[str, Any]], release: str) -> int:
    """How many explorations a release's process runs (each entry's role there, vllm and
    model): its --time-limit applies to each."""
    return 2 * sum(doc[role]["release"] == release for doc in docs for role in ROLES)


def _run_elsewhere(python: Path, entries: Sequence[Scenario], docs: list[dict[str, Any]],
                   release: str, opts: CorpusOptions, out_dir: Path | None,
                   progress: Progress | None) -> str | None:
    """Run the entries that need ``release`` in its own venv; merge; an error line or None.
    Raises BadOutput when that venv printed something that is not a corpus document."""
    names = [scen.source if not scen.source.startswith("<") else scen.name
             for scen, doc in zip(entries, docs, strict=True)
             if release in (doc["buggy"]["release"], doc["fixed"]["release"])]
    if progress is not None:
        progress(f"{len(names)} entries on vLLM {release} ({python})")
    args = ["corpus", *names, "--release", release, "--json", *opts.argv()]
    if out_dir is not None:
        args += ["--out", str(out_dir)]
    deadline = None if opts.time_limit is None else \
        opts.time_limit * _explorations(docs, release) + remote.STARTUP_S
    # the child looks in no venv folder: it runs its own release or skips it, never recurses
    env = {k: v for k, v in os.environ.items() if k != "RACESIM_VLLM_VENVS"}
    try:
        answer = parse_answer(run_release(python, args, deadline_s=deadline, env=env), ROLES)
    except BadOutput as exc:
        raise BadOutput(f"vLLM {release} ({python}): {exc}") from None
    except ReleaseFailed as exc:
        return f"vLLM {release}: {exc}"
    for doc in docs:
        theirs = answer.get(doc["name"])
        if theirs is None:
            continue
        for role in ROLES:
            if doc[role]["release"] == release:
                doc[role].update(theirs[role])
                doc[role]["release"] = release  # the child's word does not rename it
    return None


def entry_releases(entries: Sequence[Scenario]) -> list[str]:
    """Every release the entries name, oldest first."""
    return sorted({r for s in entries if s.corpus is not None
                   for r in (s.corpus.buggy_release, s.corpus.fixed_release) if r != OPEN},
                  key=_release_key)


def run_corpus(entries: Sequence[Scenario], *, opts: CorpusOptions, venvs: Path | None = None,
               only_release: str | None = None, out_dir: Path | None = None,
               progress: Progress | None = None) -> dict[str, Any]:
    """Explore every entry on its buggy and fixed releases; the ``racesim corpus --json``
    document. ``only_release`` restricts the work to one release (what a release's own venv
    is asked to do; it must be one the entries name). Ctrl-C stops it: what finished is kept,
    ``interrupted`` is true and nothing more starts. A venv that printed something other than
    a corpus document is skipped and named in ``bad_venvs`` (the command then exits 2)."""
    refuse_model_runner("racesim corpus", "reproduces vLLM's bugs on vLLM's own code, its "
                        "runner included (#29355 and #23440 are the runner's)")
    started = time.monotonic()
    here = installed_vllm()
    docs = [_entry_doc(s) for s in entries]
    releases = sorted({d[r]["release"] for d in docs for r in ROLES} - {OPEN},
                      key=_release_key)
    if only_release is not None:
        if only_release not in releases:
            raise InputError(f"--release {only_release}: no entry given uses it (they use "
                             f"{', '.join(releases)})")
        releases = [only_release]
    skipped: list[str] = []
    bad: list[str] = []
    interrupted = False
    try:
        for release in releases:
            if release == here:
                _run_here(entries, docs, release, opts, out_dir, progress)
                continue
            python = release_python(venvs, release)
            problem = install_hint(release)
            if python is not None:
                try:
                    problem = _run_elsewhere(python, entries, docs, release, opts, out_dir,
                                             progress) or ""
                except BadOutput as exc:
                    problem = str(exc)
                    bad.append(problem)
            if problem:
                skipped.append(problem)
                _model_only(entries, docs, release, opts, problem)
    except (KeyboardInterrupt, _Interrupted):
        interrupted = True
    for doc in docs:  # a release left out by only_release, or not reached before Ctrl-C
        for role in ROLES:
            doc[role].setdefault("status", "not run")
    found = [d for d in docs if d["buggy"]["status"] in ("found", "not found")]
    fixed = [d for d in docs if d["fixed"]["status"] in ("clean", "not clean")]
    return {"installed": here, "releases": releases,
            "options": {"budget": opts.budget, "model_budget": opts.model_budget,
                        "strategy": opts.strategy, "seed": opts.seed,
                        "shrink_runs": opts.shrink_runs, "reach": opts.reach},
            "entries": docs,
            "found": sum(d["buggy"]["status"] == "found" for d in found),
            "tried": len(found),
            "fixed_clean": sum(d["fixed"]["status"] == "clean" for d in fixed),
            "fixed_tried": len(fixed),
            "skipped": list(dict.fromkeys(skipped)),
            "bad_venvs": bad,
            "interrupted": interrupted,
            "elapsed_s": round(time.monotonic() - started, 3)}


def _model_only(entries: Sequence[Scenario], docs: list[dict[str, Any]], release: str,
                opts: CorpusOptions, problem: str) -> None:
    """A release that did not run on vLLM: the model still runs on its profile (it needs no
    vLLM)."""
    for scen, doc in zip(entries, docs, strict=True):
        for role in ROLES:
            if doc[role]["release"] == release and "status" not in doc[role]:
                model = _explore_one(scen, release, role, "model", opts, None)
                doc[role].update({"status": "skipped", "reason": problem, "model": model})
                if model.get("status") == "interrupted":
                    raise _Interrupted


def _installed_in(folder: Path, release: str) -> bool:
    """Whether ``folder/<release>`` is a finished venv: vLLM of that release and racesim both
    installed (a venv left by a failed or interrupted install has neither or one)."""
    from racesim.corpus import releases

    if releases.venv_release(folder, release) != release:
        return False
    site = (folder / release / "lib").glob("python3*/site-packages")
    return any(any(sp.glob("racesim-*.dist-info")) or (sp / "racesim").is_dir()
               for sp in site)


def install_releases(entries: Sequence[Scenario], folder: Path) -> list[str]:
    """Install each release the entries need and this process lacks into ``folder/<version>``
    (a venv with that vLLM, CPU only, and this racesim: :func:`racesim.corpus.releases.install`);
    what was done, one line each. A release no adapter supports is left out with a line."""
    from racesim.corpus import releases

    here = installed_vllm()
    needed = [r for r in entry_releases(entries) if r != here]
    lines = []
    for release in needed:
        if release not in releases.SUPPORTED:
            lines.append(f"vLLM {release}: not installed (the vllm backend has no adapter "
                         f"for it; supported: {', '.join(releases.SUPPORTED)})")
            continue
        if _installed_in(folder, release):
            lines.append(f"vLLM {release}: already in {folder / release}")
            continue
        # the install script is idempotent: a half-made venv (a failed or stopped install)
        # is finished rather than taken for installed
        releases.install(folder, release, quiet=True)
        lines.append(f"vLLM {release}: installed in {folder / release}")
    return lines
