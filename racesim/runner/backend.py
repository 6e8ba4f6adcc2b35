"""The backend a run uses, as one value chosen once at the edge: the model, or vLLM.

A :class:`Backend` is resolved and checked where the user names it (the command line, or the
library call of ``run_scenario``/``explore`` given ``engine="vllm"``), then passed through:
explore, matrix, conform, corpus, replay, diff and the pytest plugin never re-decide it. It is
frozen and pickles, so a worker process runs what its parent resolved.

vLLM runs as one of three things:

- the installed release (``racesim run --engine vllm``);
- ``src``: the Python code of a vLLM checkout, or any folder holding a ``vllm`` package
  (``--vllm-src DIR``), over the installed release's compiled parts (``vllm_tree.py``);
- ``patch``: the installed release with a unified diff applied to a shadow tree of it
  (``--vllm-patch FILE``, ``patching.py``); the installed release is never written to.

A tree's version need not be a supported release: a dev, rc or local version
(``0.34.0.dev42+g1234abc``) runs as the nearest supported generation at or below it, with one
warning line naming it; ``base`` (``--vllm-base``) overrides.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from racesim.engine_vllm._api import release_key
from racesim.runner import engines
from racesim.runner.engines import ENGINES, SUPPORTED_VLLM
from racesim.sim.errors import InputError

__all__ = ["Backend", "MODEL", "resolve_backend", "as_backend", "nearest_profile", "from_record",
           "warn_stderr", "refuse_model_runner"]

Warn = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Backend:
    """What runs a scenario: ``engine`` "model", or "vllm" with the vLLM that runs.

    On "vllm": ``release`` is the version of the vLLM that runs (the tree's own for ``src``);
    ``base`` the supported profile it runs as (the release's major.minor, the generation a
    dev/rc/local version maps to, or ``--vllm-base``); ``src`` the folder holding the ``vllm``
    package that runs, or None; ``patch`` the unified diff applied to the installed release, or
    None; ``sha256`` the diff file's sha256, or the hash of the ``src`` tree's ``.py`` files
    (what a counterexample records, and replay checks); ``installed`` the installed release,
    whose compiled parts (and, with ``patch``, whose Python code) run. None on the model.
    ``frontend`` is the frontend the user asked for (``RACESIM_VLLM_FRONTEND``, read here once):
    None, vLLM's own AsyncLLM wherever it runs and the model's elsewhere; "model"; or
    "asyncllm", vLLM's own or exit 2 (``engine_vllm/frontend/select.py``). ``runner`` is the
    model runner asked for (``RACESIM_VLLM_RUNNER``, read here once): None, vLLM's own where it
    runs; or "model", racesim's model of it (``engine_vllm/runner/kind.py``)."""

    engine: str = "model"
    release: str | None = None
    base: str | None = None
    src: str | None = None
    patch: str | None = None
    sha256: str | None = None
    installed: str | None = None
    frontend: str | None = None
    runner: str | None = None

    @property
    def is_vllm(self) -> bool:
        return self.engine == "vllm"

    @property
    def has_tree(self) -> bool:
        """vLLM runs from a folder other than the installed release's (a checkout or a
        patched shadow tree)."""
        return self.src is not None or self.patch is not None

    @property
    def tree_kind(self) -> str | None:
        return "src" if self.src is not None else "patch" if self.patch is not None else None

    @property
    def file_tag(self) -> str:
        """A file-name word: ``model``, ``vllm``, ``vllm-patch-1a2b3c4d``, ``vllm-src-...``."""
        if not self.has_tree:
            return self.engine
        return f"vllm-{self.tree_kind}-{(self.sha256 or '')[:8]}"

    def tree(self) -> Path | None:
        """The folder ``import vllm`` resolves under (it holds ``vllm/``), or None for the
        installed release. A patch's shadow tree is built (once, cached) on first use."""
        if self.src is not None:
            return Path(self.src)
        if self.patch is not None:
            from racesim.runner.patching import patched_tree

            return patched_tree(Path(self.patch), self.installed or "")
        return None

    @property
    def label(self) -> str:
        """``model``, ``vLLM 0.33.0``, ``vLLM 0.33.0 + patch fix.diff (sha256 1a2b3c4d)``."""
        if not self.is_vllm:
            return "model"
        if self.patch is not None:
            return f"vLLM {self.installed} + patch {Path(self.patch).name} " \
                   f"(sha256 {(self.sha256 or '')[:12]})"
        if self.src is not None:
            return f"vLLM {self.release} from {self.src} (as {self.base}, tree sha256 " \
                   f"{(self.sha256 or '')[:12]})"
        return f"vLLM {self.release}"

    def check(self, profile: str) -> None:
        """Refuse, in one line, a backend that cannot run a scenario of vLLM profile
        ``profile`` (the model runs any)."""
        if self.is_vllm:
            engines.check_greenlet()
        if not self.has_tree:
            engines.check_engine(self.engine, profile)
            return
        if profile != self.base:
            raise InputError(f"{self.label} runs as profile {self.base}, but the scenario is "
                             f"on profile {profile}; run --vllm {self.base}")

    def activate(self) -> None:
        """Make ``import vllm`` in this process the vLLM this backend runs (a no-op on the
        model and on the installed release when nothing else was imported)."""
        if not self.is_vllm:
            return
        from racesim.runner.vllm_tree import activate

        activate(self.tree(), self.base if self.has_tree else None)

    def as_dict(self) -> dict[str, Any]:
        """JSON fields (counterexample files, documents); the model's is ``{"engine": ...}``."""
        if not self.is_vllm:
            return {"engine": self.engine}
        return {"engine": self.engine, "release": self.release, "base": self.base,
                "src": self.src, "patch": self.patch, "sha256": self.sha256,
                "installed": self.installed}

    def tree_record(self) -> dict[str, Any] | None:
        """What a counterexample file records of the tree (None: the installed release)."""
        if not self.has_tree:
            return None
        return {"kind": self.tree_kind, "path": self.src or self.patch, "sha256": self.sha256,
                "base": self.base, "release": self.release, "installed": self.installed}

    def cli_args(self) -> list[str]:
        """The options that choose this backend again on the command line."""
        if not self.is_vllm:
            return []
        words = ["--engine", "vllm"]
        if self.src is not None:
            words += ["--vllm-src", self.src]
        if self.patch is not None:
            words += ["--vllm-patch", self.patch]
        default = nearest_profile(self.release or "") if self.src is not None \
            else engines.profile_of_release(self.installed or "")
        if self.has_tree and self.base != default:
            words += ["--vllm-base", self.base or ""]
        return words


MODEL = Backend()


def warn_stderr(line: str) -> None:
    print(f"racesim: {line}", file=sys.stderr, flush=True)


def _profile_or_none(version: str) -> str | None:
    return engines.profile_of_release(version) if _plain(version) else None


def _plain(version: str) -> bool:
    """A final release (``0.33.0``), not a dev, rc or local build."""
    return bool(version) and all(part.isdigit() for part in version.split("."))


def nearest_profile(version: str) -> str | None:
    """The supported profile ``version`` runs as: its own major.minor when supported, else the
    newest supported one below it (a ``0.34.0.dev`` tree is 0.33's code plus changes), else
    None (older than every supported release)."""
    key = release_key(version)[:2]
    if not key:
        return None
    best: tuple[tuple[int, ...], str] | None = None
    for profile in SUPPORTED_VLLM:
        pk = release_key(profile)[:2]
        if pk <= key and (best is None or pk > best[0]):
            best = (pk, profile)
    return None if best is None else best[1]


def _base_option(base: str) -> str:
    """``--vllm-base VERSION`` as a supported profile (``0.20`` or ``0.20.0``), or exit 2."""
    profile = engines.profile_of_release(base) if base not in SUPPORTED_VLLM else base
    if profile is None:
        raise InputError(f"--vllm-base {base!r}: not a supported vLLM generation (supported: "
                         f"{', '.join(SUPPORTED_VLLM)})")
    return profile


def resolve_backend(engine: str | None = None, *, src: str | None = None,
                    patch: str | None = None, base: str | None = None,
                    warn: Warn | None = warn_stderr) -> Backend:
    """The backend named by ``--engine``, ``--vllm-src``, ``--vllm-patch`` and ``--vllm-base``,
    checked: a tree or a patch implies ``--engine vllm``. A patch is applied here (its shadow
    tree built and cached), so a hunk that does not apply fails before any run."""
    if engine is not None and engine not in ENGINES:
        raise InputError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    tree_opt = "--vllm-src" if src is not None else "--vllm-patch" if patch is not None else None
    if src is not None and patch is not None:
        raise InputError("--vllm-src and --vllm-patch: give one (a patch applies to the "
                         "installed release; patch your tree instead)")
    if engine == "model" and (tree_opt or base is not None):
        raise InputError(f"{tree_opt or '--vllm-base'} runs vLLM's own code: it needs "
                         f"--engine vllm, not --engine model")
    if tree_opt is None and base is not None:
        raise InputError("--vllm-base applies to a tree: give --vllm-src DIR or "
                         "--vllm-patch FILE with it")
    if tree_opt is None:
        if engine != "vllm":
            return MODEL
        release = engines.installed_vllm()
        return Backend("vllm", release, engines.profile_of_release(release or ""),
                       installed=release, frontend=_frontend(), runner=_runner())
    installed = engines.installed_vllm()
    if installed is None or engines.profile_of_release(installed) is None:
        raise InputError(f"{tree_opt} runs over the installed vLLM's compiled parts, but "
                         + ("vLLM is not installed" if installed is None
                            else f"the installed vLLM {installed} is not supported")
                         + f"; install one with {engines.INSTALL_COMMAND}")
    from racesim.runner import vllm_tree

    if patch is not None:
        from racesim.runner.patching import check_patch

        path, digest = check_patch(patch, installed)
        profile = engines.profile_of_release(installed)
        chosen = _base_option(base) if base is not None else profile
        return Backend("vllm", installed, chosen, None, str(path), digest, installed,
                       _frontend(), _runner())
    root = vllm_tree.check_src(src or "")
    version = vllm_tree.tree_version(root)
    if base is not None:
        chosen = _base_option(base)
    elif version is None:
        chosen = engines.profile_of_release(installed) or ""
        if warn is not None:
            warn(f"--vllm-src {src}: no version in its vllm/_version.py or vllm/version.py; "
                 f"running it as vLLM {chosen} (the installed release's generation); "
                 f"--vllm-base VERSION overrides")
    else:
        near = nearest_profile(version)
        if near is None:
            raise InputError(f"--vllm-src {src}: vLLM {version} is older than every supported "
                             f"release ({', '.join(SUPPORTED_VLLM)})")
        chosen = near
        exact = _plain(version) and engines.profile_of_release(version) == near
        if not exact and warn is not None:
            warn(f"--vllm-src {src}: vLLM {version} is not a supported release; running it "
                 f"as vLLM {near} (API generation and await-point widths of "
                 f"{SUPPORTED_VLLM[near]}); --vllm-base VERSION overrides")
    return Backend("vllm", version or installed, chosen, str(root), None,
                   vllm_tree.tree_hash(root), installed, _frontend(), _runner())


def as_backend(engine: str | Backend) -> Backend:
    """``run_scenario``'s public ``engine="model"``/``"vllm"`` as a backend (the installed
    release), or a resolved backend as it is."""
    if isinstance(engine, Backend):
        return engine
    if engine not in ENGINES:
        raise InputError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    return MODEL if engine == "model" else Backend("vllm", frontend=_frontend(),
                                                   runner=_runner())


def _frontend() -> str | None:
    """The frontend asked for in the environment (the one place racesim reads it)."""
    from racesim.engine_vllm.frontend.select import requested

    return requested()


def _runner() -> str | None:
    """The model runner asked for in the environment (the one place racesim reads it)."""
    from racesim.engine_vllm.runner.kind import requested

    return requested()


def refuse_model_runner(command: str, why: str) -> None:
    """One InputError line when ``RACESIM_VLLM_RUNNER=model`` is set for ``command``, which
    keeps vLLM's own runner (``why``)."""
    if _runner() == "model":
        raise InputError(f"RACESIM_VLLM_RUNNER=model: {command} {why}; unset it")


def from_record(tree: Mapping[str, Any], where: str) -> Backend:
    """The backend a counterexample file's ``vllm_tree`` names, checked: the tree or patch at
    its recorded path must still hash as recorded (exit 2 otherwise)."""
    kind, path, sha = tree["kind"], str(tree["path"]), str(tree["sha256"])
    option = "--vllm-src" if kind == "src" else "--vllm-patch"
    exists = Path(path).is_dir() if kind == "src" else Path(path).is_file()
    if not exists:
        raise InputError(f"{where}: recorded on {option} {path} (sha256 {sha[:12]}), which is "
                         f"not there; give {option} with that {'tree' if kind == 'src' else 'diff'}")
    base = tree.get("base") if isinstance(tree.get("base"), str) else None
    backend = resolve_backend("vllm", src=path if kind == "src" else None,
                              patch=path if kind == "patch" else None, base=base, warn=None)
    if backend.sha256 != sha:
        raise InputError(f"{where}: recorded on {option} {path} with sha256 {sha[:12]}, but it "
                         f"now hashes {(backend.sha256 or '')[:12]}: it changed since; give "
                         f"{option} with the recorded one")
    return backend
