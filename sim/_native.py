"""Compiled or source: decided once, before any module of ``sim`` or ``engine_model`` loads.

``pip install`` compiles the simulation's hot modules with mypyc when it can (``setup.py``) and,
only when that succeeded, writes ``sim/_native.json``: each compiled module with the SHA-256 of
the source it was compiled from. Python prefers a compiled ``.so`` over the ``.py`` beside it, so
after an editable install an edited source would silently not run. This module prevents that:
the compiled modules are used only when the manifest is there, every source still has the hash
it was compiled from, and every compiled file is present. Otherwise, or when ``RACESIM_PURE`` is
set in the environment, a finder loads every ``sim`` and ``engine_model`` module from its
source (all of them: compiled modules call each other's native classes directly, so a mix would
not work). Both builds give the same traces and trace hashes; the compiled one is faster.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["NATIVE", "REASON", "build_info"]

_PACKAGES = ("sim", "engine_model")
_ROOT = Path(__file__).resolve().parents[1]
_MANIFEST = Path(__file__).with_name("_native.json")


def _decide() -> tuple[bool, str]:
    try:
        manifest = json.loads(_MANIFEST.read_text(encoding="utf-8"))
        modules: dict[str, dict[str, str]] = manifest["modules"]
    except FileNotFoundError:
        return False, "not compiled"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return False, f"unreadable {_MANIFEST.name} ({exc})"
    if os.environ.get("RACESIM_PURE"):
        return False, "RACESIM_PURE is set"
    for entry in modules.values():
        source = _ROOT / entry["source"]
        try:
            digest = hashlib.sha256(source.read_bytes()).hexdigest()
        except OSError:
            return False, f"{entry['source']} is missing"
        if digest != entry["sha256"]:
            return False, f"{entry['source']} changed since it was compiled"
        if not any(source.with_name(source.stem + suffix).exists()
                   for suffix in importlib.machinery.EXTENSION_SUFFIXES):
            return False, f"the compiled {entry['source']} is missing"
    return True, f"mypyc ({len(modules)} modules)"


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Loads ``sim.*`` and ``engine_model.*`` modules from their ``.py`` files."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", 1)[0] not in _PACKAGES or path is None:
            return None
        leaf = fullname.rsplit(".", 1)[-1]
        for directory in path:
            source = Path(directory, leaf + ".py")
            if source.is_file():
                return importlib.util.spec_from_file_location(fullname, source)
        return None  # a subpackage, or not ours: the normal finders decide


NATIVE, REASON = _decide()
if not NATIVE and not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SourceFinder())


def build_info() -> str:
    """One line for ``racesim --version`` and the bench: which build is running, and why."""
    return f"compiled: {REASON}" if NATIVE else f"pure Python: {REASON}"
