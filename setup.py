"""racesim's build: the simulation's hot modules are compiled with mypyc when that works.

Without a C compiler (or with ``RACESIM_PURE=1`` in the environment) racesim installs as pure
Python and runs the same model, slower. The manifest ``sim/_native.json`` lists the compiled
modules with the SHA-256 of the sources they were compiled from, and says whether the build
completed; ``sim/_native.py`` reads it at import time to decide which to load. Everything else
about the package is in ``pyproject.toml``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
#: The manifest, relative to the folder that holds sim/ (the repository, or site-packages/racesim).
MANIFEST = Path("sim", "_native.json")
#: mypyc's shared library, racesim.sim._compiled__mypyc: inside the sim package, so an install
#: adds no top-level name, and it sits beside the modules in both kinds of install.
GROUP = "racesim.sim._compiled"
#: Where the sources are staged for mypyc, which names a module after its path up to the last
#: folder without an __init__.py: racesim/sim/points.py compiles as racesim.sim.points.
STAGE = Path("build", "mypyc-src")
#: setup.py commands that build (or install) code: only these need mypyc. pip asks for metadata
#: first (egg_info, dist_info), and an sdist holds sources only.
_BUILDS = ("build", "bdist", "editable_wheel", "develop", "install")

#: The modules a run spends its time in (see ``racesim bench``), the strategies' deciders
#: included. Not compiled: the policies (third-party ones subclass LifecyclePolicy), System
#: (tests subclass it), configuration, loading, and everything outside a run.
COMPILED = (
    "racesim.sim.points",
    "racesim.sim.trace",
    "racesim.sim.world",
    "racesim.sim.strategies",
    "racesim.engine_model.events.client",
    "racesim.engine_model.events.frontend",
    "racesim.engine_model.events.engine",
    "racesim.engine_model.events.pd",
    "racesim.engine_model.events.dp",
    "racesim.engine_model.events.api",
    "racesim.engine_model.messages",
    "racesim.engine_model.request",
    "racesim.engine_model.kv_cache",
    "racesim.engine_model.kv_connector",
    "racesim.engine_model.sched_requests",
    "racesim.engine_model.scheduler",
    "racesim.engine_model.sched_output",
    "racesim.engine_model.runner",
    "racesim.engine_model.ipc",
    "racesim.engine_model.engine_shell",
    "racesim.engine_model.engine_pd",
    "racesim.engine_model.engine_core",
    "racesim.engine_model.engine_outputs",
    "racesim.engine_model.data_parallel",
    "racesim.engine_model.sessions",
    "racesim.engine_model.checker",
    "racesim.engine_model.monitors.truth",
    "racesim.engine_model.monitors.liveness",
    "racesim.engine_model.monitors.kv",
    "racesim.engine_model.monitors.client",
    "racesim.engine_model.monitors.metrics",
    "racesim.engine_model.monitors.engine",
    "racesim.engine_model.monitors.leaks",
    "racesim.engine_model.client",
    "racesim.engine_model.pd_proxy",
    "racesim.engine_model.frontend.outputs",
    "racesim.engine_model.frontend.request_state",
    "racesim.engine_model.frontend.output_processor",
    "racesim.engine_model.frontend.engine_io",
    "racesim.engine_model.frontend.async_llm",
)
#: The top-level folders the compiled modules live in (package-dir in pyproject.toml).
_FOLDERS = sorted({name.split(".")[1] for name in COMPILED})


def _source(module: str) -> str:
    """A module's source, relative to the repository: racesim.sim.points -> sim/points.py."""
    return module.removeprefix("racesim.").replace(".", "/") + ".py"


def _say(message: str) -> None:
    print(f"racesim build: {message}", file=sys.stderr)


def _pure_requested() -> bool:
    return os.environ.get("RACESIM_PURE", "") not in ("", "0")


def _sources() -> dict[str, dict[str, str]]:
    """Each compiled module's source and its SHA-256, read before mypyc reads them."""
    modules = {}
    for name in COMPILED:
        source = _source(name)
        digest = hashlib.sha256((ROOT / source).read_bytes()).hexdigest()
        modules[name] = {"source": source, "sha256": digest}
    return modules


_SOURCES = _sources()


def _build_key() -> str:
    """What a compile depends on, hashed: every source mypyc reads (the compiled packages'
    folders whole, as _stage copies them: it type-checks what the modules import), its
    settings in pyproject.toml, the module list, mypy's version and the interpreter's ABI."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        mypy = version("mypy")
    except PackageNotFoundError:
        mypy = "none"
    h = hashlib.sha256()
    for part in (mypy, sys.implementation.cache_tag, sysconfig.get_config_var("EXT_SUFFIX"),
                 *COMPILED):
        h.update(f"{part}\n".encode())
    files = [ROOT / "pyproject.toml",
             *sorted(p for folder in _FOLDERS for p in (ROOT / folder).rglob("*.py")
                     if "__pycache__" not in p.parts)]
    for path in files:
        h.update(f"{path.relative_to(ROOT).as_posix()}\n".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _compiled_file(stem: Path) -> bool:
    return any(stem.with_name(stem.name + suffix).exists() for suffix in EXTENSION_SUFFIXES)


def _up_to_date(root: Path) -> bool:
    """Whether the in-place build in ``root`` is complete and was compiled from what a new
    compile would read, with every compiled file still there: then recompiling would only
    produce the same files again (minutes of mypyc and C compiler for nothing)."""
    try:
        data = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or data.get("complete") is not True \
            or data.get("build_key") != _build_key():
        return False
    stems = [str(data.get("shared", "")), *(_source(name)[:-3] for name in COMPILED)]
    return all(stem and _compiled_file(root / stem) for stem in stems)


def _reuses_in_place_build(args: list[str]) -> bool:
    """Only an editable install builds in place, where a previous build's files are; a wheel
    (pip install .) is built in a fresh folder and needs its compiled files made."""
    return any(arg.startswith(("editable_wheel", "develop")) for arg in args)


def _write_manifest(dirs: list[Path], complete: bool) -> None:
    """``sim/_native.json`` in each of ``dirs`` (the folders holding sim/; written whole or not
    at all): until it says the build completed, sim/_native.py loads every module from source."""
    shared = Path(_source(f"{GROUP}__mypyc")).with_suffix("").as_posix()
    text = json.dumps({"compiler": "mypyc", "complete": complete, "shared": shared,
                       "build_key": _build_key(), "modules": _SOURCES},
                      indent=1, sort_keys=True) + "\n"
    for d in dirs:
        if (d / "sim").is_dir():
            tmp = d / MANIFEST.with_suffix(".json.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, d / MANIFEST)


def _stage() -> list[str]:
    """Copies of the compiled packages under STAGE/racesim/, so that mypyc names each module
    as it is installed (racesim.sim.points, not after the bare folder); the paths of COMPILED
    there, relative to STAGE.

    Copies, not symlinks: mypy names modules by the path it is given, and a copy also works
    where symlinks do not. Whole folders, since mypy type-checks what the modules import. The
    staged racesim/__init__.py is empty: compiled code never imports the app layer.
    """
    stage = ROOT / STAGE
    shutil.rmtree(stage, ignore_errors=True)
    package = stage / "racesim"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    shutil.copy2(ROOT / "pyproject.toml", stage)  # mypy's settings ([tool.mypy] strict)
    for folder in _FOLDERS:
        shutil.copytree(ROOT / folder, package / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.json"))
    return [(Path("racesim") / _source(name)).as_posix() for name in COMPILED]


def _mypycify() -> list[Any]:
    """mypyc's extensions, compiled from the staged copies. mypyc runs inside the stage, so
    each module is found by its installed name first, and tracebacks name the source as
    racesim/sim/points.py, which resolves against site-packages. Its C files go to build/."""
    from mypyc.build import mypycify

    sources = _stage()
    here = os.getcwd()
    os.chdir(ROOT / STAGE)
    try:
        return list(mypycify(sources, opt_level="3", group_name=GROUP,
                             target_dir=str(ROOT / "build")))
    finally:
        os.chdir(here)


class OptionalBuildExt(build_ext):
    """Compile if possible; a failure leaves a pure-Python install, never a failed one."""

    def run(self) -> None:
        targets = [Path(self.build_lib, "racesim")]
        if self.inplace or getattr(self, "editable_mode", False):
            targets.append(ROOT)
        # Until this build completes, compiled files left by an earlier one stay unused.
        _write_manifest(targets, complete=False)
        try:
            super().run()
        except Exception as exc:  # a missing compiler, a failed compile, ...
            _say(f"could not compile ({exc}); installing pure Python")
            return
        _write_manifest(targets, complete=True)
        _say(f"compiled {len(COMPILED)} modules with mypyc")


def _ext_modules() -> list[Any]:
    if not any(arg.startswith(_BUILDS) for arg in sys.argv[1:]):
        return []  # metadata only, or an sdist: no code is built, mypyc is not needed
    if _pure_requested():
        reason = "RACESIM_PURE is set"
    elif _reuses_in_place_build(sys.argv[1:]) and _up_to_date(ROOT):
        _say("the compiled modules are up to date (no source changed since the last build); "
             "not compiling again")
        return []
    else:
        try:
            return _mypycify()
        except (Exception, SystemExit) as exc:  # no mypyc, or its type check failed
            reason = f"mypyc is unavailable or failed ({exc!r})"
    _say(f"{reason}; installing pure Python")
    if (ROOT / MANIFEST).exists():  # an earlier in-place build: its compiled files stay unused
        _write_manifest([ROOT], complete=False)
    return []


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
