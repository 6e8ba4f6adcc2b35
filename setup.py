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
import sys
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
MANIFEST = Path("sim", "_native.json")
GROUP = "racesim_native"  # mypyc's shared library: racesim_native__mypyc.<suffix>
#: setup.py commands that build (or install) code: only these need mypyc. pip asks for metadata
#: first (egg_info, dist_info), and an sdist holds sources only.
_BUILDS = ("build", "bdist", "editable_wheel", "develop", "install")

#: The modules a run spends its time in (see ``racesim bench``), the strategies' deciders
#: included. Not compiled: the policies (third-party ones subclass LifecyclePolicy), System
#: (tests subclass it), configuration, loading, and everything outside a run.
COMPILED = (
    "sim/points.py",
    "sim/trace.py",
    "sim/world.py",
    "sim/strategies.py",
    "engine_model/messages.py",
    "engine_model/request.py",
    "engine_model/kv_cache.py",
    "engine_model/kv_connector.py",
    "engine_model/scheduler.py",
    "engine_model/runner.py",
    "engine_model/ipc.py",
    "engine_model/engine_core.py",
    "engine_model/checker.py",
    "engine_model/client.py",
    "engine_model/frontend/outputs.py",
    "engine_model/frontend/output_processor.py",
    "engine_model/frontend/async_llm.py",
)


def _say(message: str) -> None:
    print(f"racesim build: {message}", file=sys.stderr)


def _pure_requested() -> bool:
    return os.environ.get("RACESIM_PURE", "") not in ("", "0")


def _sources() -> dict[str, dict[str, str]]:
    """Each compiled module's source and its SHA-256, read before mypyc reads them."""
    modules = {}
    for source in COMPILED:
        name = source.removesuffix(".py").replace("/", ".")
        digest = hashlib.sha256((ROOT / source).read_bytes()).hexdigest()
        modules[name] = {"source": source, "sha256": digest}
    return modules


_SOURCES = _sources()


def _write_manifest(dirs: list[Path], complete: bool) -> None:
    """``sim/_native.json`` in each of ``dirs`` (written whole or not at all): until it says
    the build completed, sim/_native.py loads every module from source."""
    text = json.dumps({"compiler": "mypyc", "complete": complete, "shared": f"{GROUP}__mypyc",
                       "modules": _SOURCES}, indent=1, sort_keys=True) + "\n"
    for d in dirs:
        if (d / "sim").is_dir():
            tmp = d / MANIFEST.with_suffix(".json.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, d / MANIFEST)


class OptionalBuildExt(build_ext):
    """Compile if possible; a failure leaves a pure-Python install, never a failed one."""

    def run(self) -> None:
        targets = [Path(self.build_lib)]
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
    else:
        try:
            from mypyc.build import mypycify

            return list(mypycify(list(COMPILED), opt_level="3", group_name=GROUP))
        except (Exception, SystemExit) as exc:  # no mypyc, or its type check failed
            reason = f"mypyc is unavailable or failed ({exc!r})"
    _say(f"{reason}; installing pure Python")
    if (ROOT / MANIFEST).exists():  # an earlier in-place build: its compiled files stay unused
        _write_manifest([ROOT], complete=False)
    return []


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
