"""The arrows of the README's "Layout", checked on every run: ``sim`` <- ``engine_model`` <-
``scenarios`` <- ``reports`` / the app layer, and no import cycles between modules.

An AST walk over every source module: imports inside functions and under ``TYPE_CHECKING``
count too, since they are the same dependency taken later (or only by the type checker).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Installed name -> folder in the repository (package-dir in pyproject.toml).
FOLDERS = {"racesim": "racesim", "racesim.sim": "sim", "racesim.engine_model": "engine_model",
           "racesim.scenarios": "scenarios", "racesim.reports": "reports",
           "racesim.engine_vllm": "engine_vllm"}
LIBRARY = ("sim", "engine_model", "engine_vllm", "scenarios", "reports")
#: layer -> the other racesim layers it may import.
ALLOWED = {
    "sim": set(),
    "engine_model": {"sim"},
    # the vLLM backend swaps vLLM's own engine classes into the model's World
    "engine_vllm": {"sim", "engine_model"},
    "scenarios": {"sim", "engine_model"},
    "reports": {"sim", "engine_model", "scenarios"},
}


def _modules() -> dict[str, Path]:
    found = {"_racesim_hypothesis": ROOT / "_racesim_hypothesis.py"}
    for package, folder in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if package == "racesim" and parts and f"racesim.{parts[0]}" in FOLDERS:
                continue  # not a real case (the folders are apart), but never count one twice
            found[".".join((package, *parts))] = path
    return found


MODULES = _modules()


def layer(module: str) -> str:
    """``sim``, ``engine_model``, ``scenarios``, ``reports``, or ``app`` (the rest of racesim)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "racesim" and len(parts) > 1 and parts[1] in LIBRARY else "app"


def _resolve(name: str) -> str | None:
    """The racesim module an import of ``name`` loads last (its longest known prefix)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in MODULES:
            return candidate
    return None


def imports(module: str) -> Iterator[tuple[str, int]]:
    """``(imported racesim module, line)`` for every import statement anywhere in ``module``."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports the module pkg.mod; `from pkg import name`, pkg
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target is not None and target != module:
                yield target, node.lineno


GRAPH = {m: sorted({t for t, _ in imports(m)}) for m in MODULES}


def test_the_walk_sees_every_package() -> None:
    assert {layer(m) for m in MODULES} == {*LIBRARY, "app"}
    assert "racesim.engine_model.frontend.async_llm" in MODULES
    assert "racesim.sim.world" in GRAPH["racesim.engine_model.engine_core"] or any(
        t.startswith("racesim.sim") for t in GRAPH["racesim.engine_model.engine_core"])


@pytest.mark.parametrize("package", LIBRARY)
def test_each_library_package_imports_only_the_layers_below(package: str) -> None:
    wrong = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}"
             for m in MODULES if layer(m) == package
             for t, line in imports(m)
             if layer(t) != package and layer(t) not in ALLOWED[package]]
    assert wrong == [], f"{package} may import only {sorted(ALLOWED[package]) or 'itself'}"


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_a_layer_breach_is_seen(tmp_path: Path) -> None:
    """The walk reads function-level and TYPE_CHECKING imports too."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
              "    from racesim.reports import html\n"
              "def f():\n    import racesim.cli\n")
    MODULES["racesim.sim._probe"] = tmp_path / "probe.py"
    (tmp_path / "probe.py").write_text(source)
    try:
        assert sorted(t for t, _ in imports("racesim.sim._probe")) == [
            "racesim.cli", "racesim.reports.html"]
    finally:
        del MODULES["racesim.sim._probe"]
