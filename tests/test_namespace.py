"""An install adds one import name, ``racesim``: a user's own ``sim`` package and ``import
hypothesis`` in the same environment are unaffected (README "Layout").

Each check runs in a fresh interpreter (``-I``: no PYTHONPATH, no current directory on the
path) with a user project on ``sys.path`` first, as a user's test run would have it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_GENERIC = ("sim", "engine_model", "scenarios", "reports")


def _user_project(tmp_path: Path) -> Path:
    """A project with its own package named ``sim``, marked so it can be told apart."""
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "__init__.py").write_text('MARKER = "the user\'s sim"\n')
    return tmp_path


def _run(project: Path, code: str) -> dict[str, object]:
    prelude = f"import json, sys\nsys.path.insert(0, {str(project)!r})\n"
    proc = subprocess.run([sys.executable, "-I", "-c", prelude + code], cwd=project,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def test_import_hypothesis_loads_no_racesim_and_leaves_the_users_sim(tmp_path: Path) -> None:
    project = _user_project(tmp_path)
    doc = _run(project, """
import hypothesis
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("racesim", "simpy"))
import sim  # the user's package (ns-rename: skip)
print(json.dumps({"loaded": loaded, "marker": getattr(sim, "MARKER", None),
                  "sim_file": sim.__file__}))
""")
    assert doc["loaded"] == [], "import hypothesis must not load racesim or simpy"
    assert doc["marker"] == "the user's sim"
    assert doc["sim_file"] == str(project / "sim" / "__init__.py")


def test_racesim_in_use_still_leaves_the_users_sim(tmp_path: Path) -> None:
    project = _user_project(tmp_path)
    doc = _run(project, """
import importlib.util
import racesim.sim, racesim.engine_model, racesim.scenarios, racesim.reports
import sim  # the user's package (ns-rename: skip)
generic = {n: importlib.util.find_spec(n) is not None
           for n in ("engine_model", "scenarios", "reports")}
print(json.dumps({"marker": getattr(sim, "MARKER", None), "generic": generic,
                  "kernel": racesim.sim.__name__}))
""")
    assert doc["marker"] == "the user's sim"
    assert doc["generic"] == {"engine_model": False, "scenarios": False, "reports": False}
    assert doc["kernel"] == "racesim.sim"


@pytest.mark.parametrize("first", ["hypothesis", "racesim"])
def test_the_seed_source_is_registered_whichever_loads_first(tmp_path: Path,
                                                            first: str) -> None:
    """hypothesis controls SEED_SOURCE once racesim's kernel is in use, in either order."""
    imports = ["import hypothesis", "from racesim.sim.rng import SEED_SOURCE"]
    if first == "racesim":
        imports.reverse()
    doc = _run(_user_project(tmp_path), "\n".join(imports) + """
from hypothesis.internal.entropy import RANDOMS_TO_MANAGE
print(json.dumps({"registered": any(r is SEED_SOURCE for r in RANDOMS_TO_MANAGE.values())}))
""")
    assert doc["registered"] is True


def test_import_racesim_is_light() -> None:
    """Every racesim.sim import passes through racesim/__init__.py: it must load nothing."""
    code = ("import racesim, _racesim_hypothesis, sys; "
            "print(sorted(m for m in sys.modules if m.startswith(('racesim', 'simpy'))))")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "['racesim']"


def test_no_generic_name_is_installed() -> None:
    code = ("import importlib.util, json; print(json.dumps([n for n in " + repr(_GENERIC)
            + " if importlib.util.find_spec(n) is not None]))")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                         timeout=60, check=True, cwd="/").stdout
    assert json.loads(out) == []


def test_every_package_folder_is_installed() -> None:
    """pyproject lists packages by name (the folders are mapped): a new subpackage must be
    added there, or a wheel would silently leave it out."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = config["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for package, folder in setuptools["package-dir"].items():
        for init in (root / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(root / folder).parts
            found.add(".".join((package, *parts)))
    assert found == listed
