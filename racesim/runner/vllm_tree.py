"""Run a vLLM tree's Python code over the installed release's compiled parts.

A vLLM checkout has no compiled extension modules (``vllm._C`` and friends are built by a wheel
build), and a patched shadow tree should not copy them. An import hook on ``sys.meta_path``
resolves every ``vllm`` module of this process: an extension module from the installed
release, everything else from the tree, and nothing else from the installed release (a module
the tree lacks is missing, as it would be in a build of that tree). ``vllm.__file__`` then
lies in the tree, which :func:`activate` checks.

vLLM's model registry inspects a model class in a subprocess the first time a config names it
(``ModelConfig``); that subprocess imports the installed release, not the tree. It only reads
the tiny model's architecture, which a lifecycle patch does not change.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from racesim.sim.errors import InputError

__all__ = ["activate", "check_src", "tree_version", "tree_hash", "installed_package_dir"]

_EXT = tuple(importlib.machinery.EXTENSION_SUFFIXES)
_VERSION = re.compile(r"""^(?:__version__|version)\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?"""
                      r"""['"]([^'"]+)['"]""", re.M)


def installed_package_dir() -> Path | None:
    """The installed release's ``vllm`` folder, found without importing it (None: not found).
    Read before the hook goes in, so it is the installed one."""
    for finder in sys.meta_path:
        if isinstance(finder, _TreeFinder):
            return finder.installed
    spec = importlib.util.find_spec("vllm") if "vllm" not in sys.modules else None
    if spec is None:
        module = sys.modules.get("vllm")
        origin = getattr(module, "__file__", None)
        return Path(origin).parent if origin else None
    locations = list(spec.submodule_search_locations or ())
    return Path(locations[0]) if locations else None


def check_src(src: str) -> Path:
    """``--vllm-src DIR``: the folder holding ``vllm/__init__.py`` (absolute), or exit 2."""
    root = Path(src).expanduser()
    if not root.is_dir():
        raise InputError(f"--vllm-src {src}: not a folder")
    if not (root / "vllm" / "__init__.py").is_file():
        hint = " (that is the package itself: give the folder above it)" \
            if root.name == "vllm" and (root / "__init__.py").is_file() else ""
        raise InputError(f"--vllm-src {src}: no vllm/__init__.py in it; give a vLLM checkout "
                         f"or a folder holding a vllm package{hint}")
    return root.resolve()


def tree_version(root: Path) -> str | None:
    """The tree's version string, read (never imported) from ``vllm/_version.py`` (written by
    a build) or ``vllm/version.py``; None when neither states one."""
    for name in ("_version.py", "version.py"):
        try:
            text = (root / "vllm" / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        match = _VERSION.search(text)
        if match:
            return match.group(1)
    return None


def tree_hash(root: Path) -> str:
    """sha256 of the tree's Python code: every ``.py`` under ``vllm/``, by relative path and
    content (in sorted path order, so it does not depend on the file system's order)."""
    digest = hashlib.sha256()
    pkg = root / "vllm"
    files = sorted(p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py")
                   if "__pycache__" not in p.parts)
    for rel in files:
        digest.update(rel.encode() + b"\0")
        digest.update((pkg / rel).read_bytes() + b"\0")
    return digest.hexdigest()


class _TreeFinder(importlib.abc.MetaPathFinder):
    """``vllm`` and its submodules: extension modules from the installed release, the rest
    from the tree."""

    def __init__(self, tree: Path, installed: Path | None) -> None:
        self.tree = tree  # the tree's vllm/ folder
        self.installed = installed  # the installed release's vllm/ folder

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> Any:
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        parts = fullname.split(".")[1:]
        if self.installed is not None:
            there = importlib.machinery.PathFinder.find_spec(
                fullname, [str(self.installed.parent.joinpath("vllm", *parts[:-1]))]
                if parts else [str(self.installed.parent)])
            if there is not None and (there.origin or "").endswith(_EXT):
                return there
        here = [str(self.tree.joinpath(*parts[:-1]))] if parts else [str(self.tree.parent)]
        spec = importlib.machinery.PathFinder.find_spec(fullname, here)
        if spec is not None and (spec.origin or "").endswith(_EXT):
            return None  # the tree's own build: the installed compiled parts run instead
        return spec


def activate(tree: Path | None, base: str | None) -> None:
    """Make this process's ``import vllm`` the one of ``tree`` (None: the installed release)
    and, with ``base``, use that generation's adapter whatever the tree's version says.
    Idempotent; a process that already imported another vLLM is refused in one line (vLLM
    cannot be imported twice in one process)."""
    from racesim.engine_vllm import _vllm

    finders = [f for f in sys.meta_path if isinstance(f, _TreeFinder)]
    current = finders[0].tree.parent if finders else None
    wanted = tree.resolve() if tree is not None else None
    loaded = sys.modules.get("vllm")
    if current == wanted and (loaded is None or _under(loaded, wanted)):
        if wanted is not None:
            _vllm.API_RELEASE = _release_of(base)
        return
    if loaded is not None:
        where = os.path.dirname(getattr(loaded, "__file__", "") or "?")
        raise InputError(f"this process already imported vLLM from {where}; a run on "
                         f"{wanted or 'the installed release'} needs a fresh process "
                         f"(racesim diff and the pytest fixture's diff() start one per tree)")
    if wanted is None:
        for f in finders:
            sys.meta_path.remove(f)
        _vllm.API_RELEASE = None
        return
    installed = installed_package_dir()
    for f in finders:
        sys.meta_path.remove(f)
    sys.meta_path.insert(0, _TreeFinder(wanted / "vllm", installed))
    _vllm.API_RELEASE = _release_of(base)
    importlib.invalidate_caches()
    import vllm

    if not _under(vllm, wanted):  # a finder ahead of ours, or a stale cache
        raise InputError(f"vLLM imported from {os.path.dirname(vllm.__file__ or '?')}, not "
                         f"from {wanted}")


def _release_of(base: str | None) -> str | None:
    from racesim.runner.engines import SUPPORTED_VLLM

    return SUPPORTED_VLLM.get(base or "")


def _under(module: ModuleType, root: Path | None) -> bool:
    origin = getattr(module, "__file__", None)
    if root is None or origin is None:
        return root is None
    return Path(origin).parent.parent == root
