"""The JSON documents of ``--json`` and the counterexample file format."""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from racesim.engine_model import RunResult
from racesim.engine_model.checker import check_invariant_names
from racesim.engine_model.points import POINTS
from racesim.runner.engines import ENGINES
from racesim.reports.verdict import verdict
from racesim.scenarios import Scenario, scenario_from_dict
from racesim.scenarios.limits import MAX_FILE_BYTES, MAX_SCHEDULE
from racesim.sim import Decision, InputError
from racesim.sim.points import delay_entry

if TYPE_CHECKING:
    from racesim.runner import RunSpec

__all__ = ["run_document", "run_provenance", "Counterexample", "write_counterexample",
           "read_counterexample",
           "COUNTEREXAMPLE_FORMAT", "safe_file_name", "violation_dicts",
           "racesim_version", "LEGACY_VLLM", "free_path", "release_of_run", "write_claimed",
           "replaceable"]

COUNTEREXAMPLE_FORMAT = "racesim-counterexample/1"
#: the profile of a counterexample file that names none: it was written by the model that the
#: 0.8 profile keeps.
LEGACY_VLLM = "0.8"


def safe_file_name(text: str) -> str:
    """A file name from scenario/policy/test names (a policy may be ``pkg.mod:Class``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def violation_dicts(result: RunResult) -> list[dict[str, Any]]:
    """Each violation with its reach (``live``, or ``latent`` and the latent points it needs)
    and its ``provenance``: vLLM's own code or a simulated part (racesim.reports.provenance)."""
    from racesim.reports.provenance import violation_provenance

    out = []
    for v in result.violations:
        reach = result.reach(v)
        d = {**v.as_dict(), "reach": reach.reach, "needs": list(reach.needs)}
        d["provenance"] = violation_provenance(result, d)
        out.append(d)
    return out


def run_provenance(result: RunResult) -> dict[str, Any]:
    """Which components of ``result``'s run were vLLM's code and which were simulated
    (:func:`racesim.reports.provenance.run_components`)."""
    from racesim.reports.provenance import run_components

    return run_components(result)


def run_document(spec: RunSpec, result: RunResult) -> dict[str, Any]:
    """``racesim run --json`` / ``racesim replay --json``: ``result``, a run of ``spec``."""
    return {
        "scenario": spec.scenario.name,
        "policy": spec.policy,
        "policy_options": spec.option_dict,
        "ids": spec.id_scheme,
        "vllm": result.vllm,
        "engine": result.engine,
        "vllm_release": spec.backend.release if spec.backend.has_tree
        else release_of_run(result.vllm, result.engine),
        **({"vllm_tree": spec.backend.tree_record()} if spec.backend.has_tree else {}),
        "seed": result.seed,
        "trace_hash": result.trace_hash,
        "events": result.events,
        "sim_time": result.sim_time,
        "schedule": [d.as_dict() for d in result.schedule],
        "violations": violation_dicts(result),
        "verdict": verdict(result.violated),
        "reach": result.reach().reach if result.violations else None,
        "unverified": result.unverified or None,
        "requests": [r.as_dict() for r in result.requests],
        "components": run_provenance(result),
    }


@dataclass(frozen=True, slots=True)
class Counterexample:
    """A failing (scenario, policy, seed, schedule), replayable with no other file."""

    scenario: Scenario
    policy: str
    options: Mapping[str, str]
    seed: int
    schedule: tuple[Decision, ...]
    skip: tuple[str, ...]
    violations: tuple[dict[str, Any], ...]
    trace_hash: str
    shrunk_from: int | None = None
    found_by: Mapping[str, Any] = field(default_factory=dict)
    #: live or latent (None: not judged, as in files written before profiles).
    reach: str | None = None
    #: the racesim version that wrote the file ("" in files written before it was recorded).
    racesim_version: str = ""
    #: the backend that found it: "model", or "vllm" (files without the key: the model).
    engine: str = "model"
    #: the vLLM release it ran on: the installed one on the vllm backend, the release the
    #: profile follows on the model ("" until written: then it is filled in).
    vllm_release: str = ""
    #: the request-ID scheme it ran with: "given", "release" or "own" (the policy's); "legacy"
    #: in a file written before the axis existed (the policy's own assign_request_id)
    ids: str = "legacy"
    #: the vLLM tree it ran on, when not the installed release: ``kind`` ("src" or "patch"),
    #: ``path``, ``sha256`` (the diff's, or the tree's .py files'), ``base`` and ``release``
    #: (Backend.as_dict); replay runs on it again and checks the hash. None: the release.
    vllm_tree: Mapping[str, Any] | None = None
    #: whose frontend ran on the vllm backend: "vllm" (the release's own AsyncLLM) or "model"
    #: (``RunResult.frontend``); "" on the model and in files written before it was recorded.
    #: Replay runs a "model" file on the model's frontend again (unless RACESIM_VLLM_FRONTEND
    #: says otherwise).
    frontend: str = ""
    #: "model" when the vllm backend stepped racesim's model of the runner
    #: (``RACESIM_VLLM_RUNNER=model``, ``RunResult.runner``); "" otherwise. Replay runs such a
    #: file on the model's runner again.
    runner: str = ""

    @property
    def vllm(self) -> str:
        return self.scenario.vllm

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": COUNTEREXAMPLE_FORMAT,
            "racesim_version": self.racesim_version or racesim_version(),
            "vllm": self.vllm,
            "engine": self.engine,
            "vllm_release": self.vllm_release or release_of_run(self.vllm, self.engine),
            "reach": self.reach,
            # the profile is written into the scenario too, so the file replays on it
            "scenario": self.scenario.with_vllm(self.vllm).to_dict(),
            "policy": self.policy,
            "policy_options": dict(self.options),
            "ids": self.ids,
            "seed": self.seed,
            "schedule": [d.as_dict() for d in self.schedule],
            "skip": list(self.skip),
            "violations": list(self.violations),
            "trace_hash": self.trace_hash,
            "shrunk_from": self.shrunk_from,
            "found_by": dict(self.found_by),
            # the vLLM code that ran (None on the model): stock and patched trees differ here
            "vllm_fingerprint": _fingerprint(self.engine),
            **({"vllm_tree": dict(self.vllm_tree)} if self.vllm_tree else {}),
            **({"frontend": self.frontend} if self.frontend else {}),
            **({"runner": self.runner} if self.runner else {}),
        }


def write_counterexample(path: Path, cx: Counterexample) -> Path:
    """Write atomically (a temp file, then rename): a crash never leaves half a file. A symlink
    is written through, a folder or device refused (``racesim.reports._io.write_text``)."""
    from racesim.reports._io import write_text

    return write_text(path, json.dumps(cx.as_dict(), indent=2, ensure_ascii=False) + "\n")


def free_path(path: Path, ours: Callable[[Any], bool]) -> Path:
    """``path``, or ``stem-2.json``, ``stem-3.json``...: never a file someone else wrote.

    An existing file may be replaced only when ``ours(its JSON)`` says the same command wrote it
    from the same input, so replacing it loses nothing. ``<stem>.unshrunk.json``, the stand-in
    an exploration writes before it shrinks, counts as part of its candidate."""
    def free(candidate: Path) -> bool:
        return all(_replaceable(f, ours)
                   for f in (candidate, candidate.with_name(candidate.stem + ".unshrunk.json")))

    candidate, n = path, 1
    while not free(candidate):
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate


def write_claimed(path: Path, cx: Counterexample, ours: Callable[[Any], bool], *,
                  first: Path, stand_in: bool = False) -> Path:
    """Write ``cx`` under the name ``path`` (its ``.unshrunk.json`` stand-in with ``stand_in``)
    if that name is still free or holds a file ``ours`` accepts; if another process took it
    since it was chosen, under the next free name from ``first`` (``free_path``'s start). The
    file is created exclusively, so two explorations writing into one folder at once never
    overwrite each other. Returns the name it went under (``path`` or a ``-N`` one)."""
    from racesim.reports._io import write_new

    text = json.dumps(cx.as_dict(), indent=2, ensure_ascii=False) + "\n"
    while True:
        target = path.with_name(path.stem + ".unshrunk.json") if stand_in else path
        if write_new(target, text, lambda p: _replaceable(p, ours)):
            return path
        path = free_path(first, ours)


def replaceable(path: Path, ours: Callable[[Any], bool]) -> bool:
    """No file at ``path``, or a regular one whose JSON ``ours`` accepts."""
    return _replaceable(path, ours)


def _replaceable(path: Path, ours: Callable[[Any], bool]) -> bool:
    if not (path.exists() or path.is_symlink()):
        return True
    if not path.is_file() or path.is_symlink():
        return False
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return ours(data)


#: every top-level key of a counterexample file (what ``Counterexample.as_dict`` writes, and
#: diff's ``vllm_tree`` for a --vllm-src/--vllm-patch run): any other key is refused, as a
#: scenario's are; a writer that adds a key adds it here (tests/test_replay_release.py checks
#: as_dict's keys)
COUNTEREXAMPLE_KEYS = frozenset({
    "format", "racesim_version", "vllm", "engine", "vllm_release", "reach", "scenario",
    "policy", "policy_options", "seed", "schedule", "skip", "violations", "trace_hash",
    "shrunk_from", "found_by", "ids", "vllm_fingerprint", "vllm_tree", "frontend",
    "runner"})


def _need(data: Mapping[str, Any], key: str, kinds: type | tuple[type, ...], src: str) -> Any:
    if key not in data:
        raise InputError(f"{src}: counterexample has no {key!r}")
    value = data[key]
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise InputError(f"{src}: {key!r} has the wrong type (got {value!r})")
    if not isinstance(value, kinds):
        raise InputError(f"{src}: {key!r} has the wrong type (got {value!r})")
    return value


def _schedule(items: list[Any], src: str) -> tuple[Decision, ...]:
    if len(items) > MAX_SCHEDULE:
        raise InputError(f"{src}: schedule has {len(items)} decisions, more than racesim's cap "
                         f"of {MAX_SCHEDULE} (docs/limits.md)")
    out = []
    for i, item in enumerate(items):
        where = f"{src}: schedule[{i}]"
        if not isinstance(item, dict) or set(item) != {"point", "occurrence", "delay"}:
            raise InputError(f"{where} must be {{point, occurrence, delay}} (got {item!r})")
        point, occ, delay = delay_entry(item["point"], item["occurrence"], item["delay"],
                                        POINTS, where, every=False)
        assert occ is not None
        out.append(Decision(point, occ, delay))
    return tuple(out)


def _read_regular(path: str) -> bytes:
    """The bytes of a regular file of at most ``MAX_FILE_BYTES``. Opened without blocking and
    checked on the open file, so a FIFO with no writer, ``/dev/zero`` or a file swapped in
    after a check is refused rather than read forever."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise InputError(f"{path}: no such counterexample file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a counterexample file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{path}: is a directory, not a counterexample file")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: not a regular file (a counterexample is a JSON file)")
        if st.st_size > MAX_FILE_BYTES:
            raise InputError(f"{path}: {st.st_size} bytes, more than racesim's cap of "
                             f"{MAX_FILE_BYTES} for a counterexample file (docs/limits.md)")
        try:
            raw = fh.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:  # it grew while being read
        raise InputError(f"{path}: more than racesim's cap of {MAX_FILE_BYTES} bytes for a "
                         f"counterexample file (docs/limits.md)")
    return raw


def read_counterexample(path: str) -> Counterexample:
    """Load and validate a counterexample file; any defect is one InputError line."""
    src = path
    raw = _read_regular(path)
    try:
        data = json.loads(raw.decode("utf-8"),
                          parse_constant=lambda c: math.nan)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # nested past the limit
        raise InputError(f"{src}: not a JSON counterexample file ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise InputError(f"{src}: not a counterexample (top level is not an object)")
    if data.get("format") != COUNTEREXAMPLE_FORMAT:
        raise InputError(f"{src}: unknown format {data.get('format')!r} "
                         f"(expected {COUNTEREXAMPLE_FORMAT!r})")
    unknown = sorted(str(k) for k in data if k not in COUNTEREXAMPLE_KEYS)
    if unknown:
        raise InputError(f"{src}: unknown top-level key {unknown[0]!r} in a counterexample "
                         f"(known: {', '.join(sorted(COUNTEREXAMPLE_KEYS))})")
    scenario_data = _need(data, "scenario", dict, src)
    scenario = scenario_from_dict(scenario_data, f"{src} (embedded scenario)")
    vllm = data.get("vllm", LEGACY_VLLM)
    if not isinstance(vllm, str):
        raise InputError(f"{src}: 'vllm' must be a version string (got {vllm!r})")
    if "vllm" in data or scenario.workload.engine.vllm is None:
        # the file's own profile decides (the writer puts the same one in the scenario); a
        # file written before version profiles came from the 0.8 profile's model
        scenario = scenario.with_vllm(vllm)
    release = data.get("vllm_release")
    if release is not None and not isinstance(release, str):
        raise InputError(f"{src}: 'vllm_release' must be a release string such as "
                         f"'0.33.0' (got {release!r})")
    if release and not (release == scenario.vllm or release.startswith(scenario.vllm + ".")):
        raise InputError(f"{src}: 'vllm_release' {release} does not follow the file's "
                         f"profile {scenario.vllm} (the file was edited, or is not racesim's)")
    policy = _need(data, "policy", str, src)
    options = _need(data, "policy_options", dict, src)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in options.items()):
        raise InputError(f"{src}: policy_options must map strings to strings")
    seed = _need(data, "seed", int, src)
    schedule = _schedule(_need(data, "schedule", list, src), src)
    skip = _need(data, "skip", list, src)
    if not all(isinstance(s, str) for s in skip):
        raise InputError(f"{src}: skip must be a list of invariant names")
    check_invariant_names(skip)
    trace_hash = _need(data, "trace_hash", str, src)
    violations = _need(data, "violations", list, src)
    shrunk = data.get("shrunk_from")
    found_by = data.get("found_by") or {}
    if not isinstance(found_by, dict):
        found_by = {}
    reach = data.get("reach")
    version = data.get("racesim_version")
    engine = data.get("engine", "model")
    if engine not in ENGINES:
        raise InputError(f"{src}: 'engine' must be one of {', '.join(ENGINES)} (got {engine!r})")
    ids = data.get("ids", "legacy")
    if ids not in ("given", "release", "own", "legacy"):
        raise InputError(f"{src}: 'ids' must be given, release or own (got {ids!r})")
    tree = data.get("vllm_tree")
    if tree is not None and not (isinstance(tree, dict) and tree.get("kind") in ("src", "patch")
                                 and isinstance(tree.get("path"), str)
                                 and isinstance(tree.get("sha256"), str)):
        raise InputError(f"{src}: 'vllm_tree' must be an object with kind (src or patch), "
                         f"path and sha256")
    frontend = data.get("frontend", "")
    if frontend not in ("", "model", "vllm"):
        raise InputError(f"{src}: 'frontend' must be model or vllm (got {frontend!r})")
    runner = data.get("runner", "")
    if runner not in ("", "model"):
        raise InputError(f"{src}: 'runner' must be model when given (got {runner!r})")
    return Counterexample(scenario, policy, options, seed, schedule, tuple(skip),
                          tuple(v for v in violations if isinstance(v, dict)), trace_hash,
                          shrunk if isinstance(shrunk, int) and not isinstance(shrunk, bool)
                          else None, found_by, reach if reach in ("live", "latent") else None,
                          version if isinstance(version, str) else "", engine,
                          release if isinstance(release, str) else "", ids, tree, frontend,
                          runner)


def _fingerprint(engine: str) -> str | None:
    from racesim.reports.provenance import vllm_fingerprint

    return vllm_fingerprint() if engine == "vllm" else None


def release_of_run(profile: str, engine: str) -> str:
    """The vLLM release a run on ``engine`` under ``profile`` follows: the installed one on the
    vllm backend (the check before the run made it that profile's), else the profile's."""
    from racesim.engine_model.versions import RELEASE_OF
    from racesim.runner.engines import installed_vllm

    if engine == "vllm":
        return installed_vllm() or RELEASE_OF.get(profile, "")
    return RELEASE_OF.get(profile, "")


def racesim_version() -> str:
    try:
        return metadata.version("racesim")
    except metadata.PackageNotFoundError:
        return "unknown"
