"""The arrows of docs/layout.md, checked on every run: ``sim`` <- ``engine_model`` <-
``scenarios`` <- ``reports`` / the app layer; ``engine_vllm`` reaches ``engine_model`` only
through the interfaces both backends share; the app package's subpackages use only the arrows
docs/layout.md draws; and no import cycles between modules.

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


#: The engine_model modules engine_vllm may import: what both backends share, as engine_vllm
#: imported it when this list was written (issue 29). The World and its System (system), the
#: process shell around an engine core (engine_shell, fatal), the records on the wire
#: (messages) and in the trace (events, every module of it), the configuration and profiles
#: (config, versions), the policies, data parallelism's coordinator, and the model parts the
#: vllm backend keeps where vLLM's own code does not run (runner, scheduler's SchedulerOutput,
#: kv_cache, the frontend's outputs and OutputProcessor records). A new entry needs a reason.
SHARED = {
    "racesim.engine_model", "racesim.engine_model.system", "racesim.engine_model.engine_shell",
    "racesim.engine_model.fatal", "racesim.engine_model.messages", "racesim.engine_model.config",
    "racesim.engine_model.versions", "racesim.engine_model.policies",
    "racesim.engine_model.data_parallel", "racesim.engine_model.runner",
    "racesim.engine_model.scheduler", "racesim.engine_model.kv_cache",
    "racesim.engine_model.frontend", "racesim.engine_model.frontend.outputs",
    "racesim.engine_model.frontend.output_processor",
}
SHARED_PACKAGES = ("racesim.engine_model.events",)
#: The app package's subpackages (racesim/X/) -> the other ones each may import; every one may
#: import the library layers. ``cli`` is the top: only the entry points import it, and nothing
#: in racesim imports ``plugin`` (pytest loads it by its entry point).
APP = {
    "runner": set(),
    "documents": {"runner", "explore"},  # explore: report_files writes a MatrixResult
    "explore": {"runner", "documents"},
    "conform": {"runner", "documents", "explore"},
    "corpus": {"runner", "explore", "conform"},
    "bench": {"runner", "explore"},
    "diff": {"runner", "documents", "explore"},
    "plugin": {"runner", "documents", "explore", "diff"},
    "repro": {"runner", "documents"},
    "cli": {"runner", "documents", "explore", "conform", "corpus", "bench", "diff", "repro"},
}
#: The only modules directly in racesim/: the public API, ``python -m racesim``, the console
#: script's entry.
TOP_MODULES = {"__init__.py", "__main__.py", "_entry.py"}
#: What the top modules may import: the API re-exports, the entry points start the CLI.
TOP_ALLOWED = {"racesim": {"runner", "explore", "documents"}, "racesim.__main__": {"cli"},
               "racesim._entry": {"cli"}}


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


def app_package(module: str) -> str | None:
    """``cli``, ``explore``, ... for a module of racesim/X/; None for a library module or a
    top module of racesim/."""
    parts = module.split(".")
    if layer(module) != "app" or parts[0] != "racesim" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in APP else None


def test_reports_never_import_the_app_layer() -> None:
    wrong = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}"
             for m in MODULES if layer(m) == "reports"
             for t, line in imports(m) if layer(t) == "app"]
    assert wrong == [], "reports/ is below the app layer (racesim.cli, explore, ...)"


def test_sim_imports_nothing_above_itself() -> None:
    wrong = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}"
             for m in MODULES if layer(m) == "sim"
             for t, line in imports(m) if layer(t) != "sim"]
    assert wrong == []


def test_engine_vllm_reaches_engine_model_only_through_the_shared_interfaces() -> None:
    wrong = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}"
             for m in MODULES if layer(m) == "engine_vllm"
             for t, line in imports(m) if layer(t) == "engine_model"
             and t not in SHARED and not t.startswith(SHARED_PACKAGES)]
    assert wrong == [], ("engine_vllm may import only the engine_model modules in SHARED; add a "
                         "new one there with the reason both backends share it")


def test_the_shared_interfaces_exist() -> None:
    """A module renamed away from SHARED would make the rule above silently looser."""
    assert not SHARED - set(MODULES)
    assert all(any(m.startswith(p) for m in MODULES) for p in SHARED_PACKAGES)


def test_every_app_subpackage_has_its_arrows() -> None:
    found = {p.name for p in (ROOT / "racesim").iterdir()
             if p.is_dir() and (p / "__init__.py").exists()}
    assert found == set(APP), "a new racesim/ subpackage gets its arrows in APP (docs/layout.md)"


@pytest.mark.parametrize("package", sorted(APP))
def test_each_app_subpackage_imports_only_its_arrows(package: str) -> None:
    wrong = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}"
             for m in MODULES if app_package(m) == package
             for t, line in imports(m)
             if (other := app_package(t)) is not None and other != package
             and other not in APP[package]]
    assert wrong == [], f"racesim.{package} may import only {sorted(APP[package])} of the app"


def test_only_the_entry_points_import_the_cli_and_nothing_imports_the_plugin() -> None:
    users = {m for m in MODULES for t, _ in imports(m)
             if app_package(t) in ("cli", "plugin") and app_package(m) != app_package(t)}
    assert users == {"racesim.__main__", "racesim._entry"}


def test_racesim_holds_no_module_outside_a_subpackage() -> None:
    loose = {p.name for p in (ROOT / "racesim").glob("*.py")}
    assert loose == TOP_MODULES, f"move {sorted(loose - TOP_MODULES)} into a subpackage"
    for module, allowed in TOP_ALLOWED.items():
        used = {app_package(t) for t, _ in imports(module)} - {None}
        assert used <= allowed, (module, used)


def test_an_app_arrow_breach_is_seen(tmp_path: Path) -> None:
    """A probe in racesim.runner importing the CLI breaks two of the rules above."""
    MODULES["racesim.runner._probe"] = tmp_path / "probe.py"
    (tmp_path / "probe.py").write_text("from racesim.cli import main\n")
    try:
        assert [app_package(t) for t, _ in imports("racesim.runner._probe")] == ["cli"]
        assert "cli" not in APP["runner"]
    finally:
        del MODULES["racesim.runner._probe"]


def test_an_engine_vllm_import_outside_the_shared_interfaces_is_seen(tmp_path: Path) -> None:
    MODULES["racesim.engine_vllm._probe"] = tmp_path / "probe.py"
    (tmp_path / "probe.py").write_text("from racesim.engine_model.engine_core import EngineCore\n"
                                       "from racesim.engine_model.events.pd import PdRead\n")
    try:
        outside = [t for t, _ in imports("racesim.engine_vllm._probe")
                   if t not in SHARED and not t.startswith(SHARED_PACKAGES)]
        assert outside == ["racesim.engine_model.engine_core"]
    finally:
        del MODULES["racesim.engine_vllm._probe"]


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
