"""Compiled or source: decided once, before any compiled module can load.

``pip install`` compiles the modules a run spends its time in with mypyc when it can (see
``setup.py``) and keeps a manifest beside this file, ``_native.json``: the compiled modules, the
SHA-256 of the source each was compiled from, and whether the build completed. Python prefers a
compiled ``.so`` to the ``.py`` beside it, so after an editable install an edited source would
silently not run. This module prevents that: the compiled modules are used only when the build
completed, every source still has the hash it was compiled from, and every compiled file is
there. Otherwise, or when ``RACESIM_PURE`` is set in the environment (to anything but 0), a
finder loads every module of the compiled packages from source (all of them: compiled modules
call each other's native classes directly, so a mix would not work). Both builds give the same
traces and trace hashes.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["NATIVE", "REASON", "GUARDED", "build_info", "decide"]

MANIFEST = Path(__file__).with_name("_native.json")
_EXTENSIONS = tuple(importlib.machinery.EXTENSION_SUFFIXES)
#: The packages setup.py compiles modules of (its COMPILED list; a test checks the two agree).
#: Whenever the compiled build is not used, their modules load from source, so compiled files
#: never load without a current manifest, even when the manifest is missing or unreadable.
GUARDED = ("racesim.sim", "racesim.engine_model")


def decide(manifest: Path, root: Path,
           environ: Mapping[str, str]) -> tuple[bool, str, tuple[str, ...]]:
    """``(compiled, why, packages)``: whether the compiled modules may load, and the packages
    whose modules must otherwise load from source. ``root`` is the folder that holds sim/
    (the repository, or site-packages/racesim): manifest paths are relative to it."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        modules: dict[str, dict[str, str]] = data["modules"]
        complete = data["complete"] is True
        shared = str(data["shared"])
        packages = tuple(dict.fromkeys(
            [*GUARDED, *(_package(name, entry["source"]) for name, entry in modules.items())]))
    except FileNotFoundError:
        return False, "not compiled", GUARDED
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return False, f"unreadable {manifest.name} ({exc!r})", GUARDED
    if environ.get("RACESIM_PURE", "") not in ("", "0"):
        return False, "RACESIM_PURE is set", packages
    if not complete:
        return False, "the last build did not compile", packages
    if not _compiled_file(root / shared):
        return False, f"the compiled library {shared} is missing", packages
    for entry in modules.values():
        source = root / entry["source"]
        try:
            digest = hashlib.sha256(source.read_bytes()).hexdigest()
        except OSError:
            return False, f"{entry['source']} is missing", packages
        if digest != entry["sha256"]:
            return False, f"{entry['source']} changed since it was compiled", packages
        if not _compiled_file(source.with_suffix("")):
            return False, f"the compiled {entry['source']} is missing", packages
    listed = {entry["source"].removesuffix(".py") for entry in modules.values()} | {shared}
    for package in packages:
        for path in sorted((root / _folder(package)).rglob("*")):
            if path.name.endswith(_EXTENSIONS):  # a compiled module: is it one of this build's?
                module = (path.parent / path.name.split(".", 1)[0]).relative_to(root)
                if module.as_posix() not in listed:
                    return False, f"{path.relative_to(root)} is not from this build", packages
    return True, f"mypyc, {len(modules)} modules", packages


def _package(module: str, source: str) -> str:
    """The package named by a compiled module's top-level folder: racesim.sim for
    ``racesim.sim.points`` compiled from ``sim/points.py``."""
    depth = len(module.split(".")) - len(source.split("/")) + 1
    return ".".join(module.split(".")[:depth])


def _folder(package: str) -> str:
    """The folder, relative to the one holding sim/, of a guarded package (installed as
    racesim/<folder>, kept in the repository as <folder>)."""
    return package.removeprefix("racesim.").replace(".", "/")


def _compiled_file(stem: Path) -> bool:
    return any(stem.with_name(stem.name + suffix).exists()
               for suffix in importlib.machinery.EXTENSION_SUFFIXES)


class SourceFinder(importlib.abc.MetaPathFinder):
    """Loads the modules of ``packages`` from their ``.py`` files."""

    def __init__(self, packages: Sequence[str]) -> None:
        self.packages = frozenset(packages)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if path is None or not any(fullname.startswith(p + ".") for p in self.packages):
            return None
        leaf = fullname.rsplit(".", 1)[-1]
        for directory in path:
            source = Path(directory, leaf + ".py")
            if source.is_file():
                return importlib.util.spec_from_file_location(fullname, source)
        return None  # a subpackage, or not there: the normal finders decide


NATIVE, REASON, _packages = decide(MANIFEST, Path(__file__).resolve().parents[1], os.environ)
if not NATIVE and not any(isinstance(f, SourceFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, SourceFinder(_packages))


def build_info() -> str:
    """One line for ``racesim --version`` and the bench: which build runs, and why."""
    return f"compiled ({REASON})" if NATIVE else f"pure Python ({REASON})"
