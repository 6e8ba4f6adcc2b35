"""``pip install -e .`` twice in a row compiles once: setup.py skips mypyc when the in-place
build it left is complete and was made from the same sources (the skip decision, tested here
without a compile; a real second install takes seconds instead of minutes)."""

from __future__ import annotations

import importlib.machinery
import json
import runpy
import shutil
from pathlib import Path
from typing import Any

import pytest
import setuptools

ROOT = Path(__file__).resolve().parents[1]
_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


@pytest.fixture
def build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """setup.py's functions, loaded against a copy of the compiled folders (setup() is not
    called, and sys.argv asks for no build, so nothing is compiled)."""
    for folder in ("sim", "engine_model"):
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.json"))
    shutil.copy2(ROOT / "pyproject.toml", tmp_path)
    shutil.copy2(ROOT / "setup.py", tmp_path)
    monkeypatch.setattr(setuptools, "setup", lambda **kw: None)
    monkeypatch.setattr("sys.argv", ["setup.py", "egg_info"])
    return runpy.run_path(str(tmp_path / "setup.py"), run_name="racesim_setup")


def _as_built(build: dict[str, Any]) -> Path:
    """The tree as a completed in-place build leaves it: compiled files and the manifest."""
    root: Path = build["ROOT"]
    for name in build["COMPILED"]:
        (root / build["_source"](name)).with_suffix(_SUFFIX).write_bytes(b"\0")
    shared = Path(build["_source"](f"{build['GROUP']}__mypyc")).with_suffix(_SUFFIX)
    (root / shared).write_bytes(b"\0")
    build["_write_manifest"]([root], complete=True)
    return root


def test_an_unchanged_tree_is_not_compiled_again(build: dict[str, Any]) -> None:
    root = _as_built(build)
    assert build["_up_to_date"](root) is True


def test_any_change_a_compile_reads_compiles_again(build: dict[str, Any]) -> None:
    root = _as_built(build)
    # a module mypyc only type-checks still changes what it compiles
    (root / "sim" / "errors.py").write_text("# edited\n", encoding="utf-8")
    assert build["_up_to_date"](root) is False


@pytest.mark.parametrize("damage", ["incomplete", "missing-module", "missing-shared",
                                    "no-key", "no-manifest"])
def test_anything_short_of_a_current_complete_build_compiles(build: dict[str, Any],
                                                              damage: str) -> None:
    root = _as_built(build)
    manifest = root / "sim" / "_native.json"
    data = json.loads(manifest.read_text(encoding="utf-8"))
    if damage == "incomplete":
        manifest.write_text(json.dumps({**data, "complete": False}), encoding="utf-8")
    elif damage == "no-key":  # written by a setup.py from before the cache
        manifest.write_text(json.dumps({k: v for k, v in data.items() if k != "build_key"}),
                            encoding="utf-8")
    elif damage == "no-manifest":
        manifest.unlink()
    elif damage == "missing-shared":
        (root / f"{data['shared']}{_SUFFIX}").unlink()
    else:
        (root / "sim" / f"points{_SUFFIX}").unlink()
    assert build["_up_to_date"](root) is False


def test_only_an_editable_install_reuses_its_build(build: dict[str, Any]) -> None:
    """A wheel (pip install .) is built in a fresh folder and needs its compiled files."""
    reuse = build["_reuses_in_place_build"]
    assert reuse(["editable_wheel", "--dist-dir", "x"]) and reuse(["develop"])
    assert not reuse(["bdist_wheel"]) and not reuse(["build_ext"])
