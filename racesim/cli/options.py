"""The click options several racesim commands share, declared once."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from racesim.engine_model.versions import ALIASES, DEFAULT_VLLM, PROFILES
from racesim.runner.engines import ENGINES
from racesim.sim.strategies import STRATEGIES

__all__ = ["vllm_option", "engine_option", "backend_options", "ids_option", "run_options",
           "strict_option", "output_options",
           "explore_options", "matrix_options"]


Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def vllm_option(default: str = f"the scenario's, else {DEFAULT_VLLM}") -> Decorator:
    """``--vllm``; ``default`` says what this command does without it."""
    return click.option("--vllm", type=click.Choice([*PROFILES, *ALIASES]), default=None,
                        help=f"vLLM release profile, by name (0.20) or release (0.20.0) "
                             f"[default: {default}; see 'racesim list versions'].")


def engine_option(default: str = "model") -> Decorator:
    """``--engine``; ``default`` says what this command does without it."""
    return click.option("--engine", type=click.Choice(list(ENGINES)), default=None,
                        help=f"Backend: 'model' (racesim's model of vLLM) or 'vllm' (vLLM's own "
                             f"engine classes, of the installed vLLM, and its own AsyncLLM "
                             f"frontend where it runs; RACESIM_VLLM_FRONTEND=model keeps the "
                             f"model's, RACESIM_VLLM_RUNNER=model steps racesim's model of the "
                             f"runner; see README) [default: {default}].")


def ids_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--ids``: the request-ID scheme, an axis of its own beside the policy (the abort
    ordering)."""
    return click.option(
        "--ids", type=click.Choice(["given", "release"]), default=None,
        help="Request IDs: 'release' = as the profile's release assigns them (internal "
             "'ID-<8 hex>' from 0.14, as given before), 'given' = the client's IDs (0.20/0.33 "
             "with VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1) [default: the policy's: release "
             "for shipped and your own policies, given for buggy, abort-scope, engine-final; "
             "internal-id assigns its own].")(f)
def backend_options(default: str = "model") -> Decorator:
    """``--engine``, ``--vllm-src``, ``--vllm-patch`` and ``--vllm-base``, resolved into one
    ``backend`` argument (a :class:`~racesim.runner.backend.Backend`, or None when none of
    them is given: the command's default) before the command runs: chosen and checked once."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def wrapper(*args: Any, engine: str | None, vllm_src: str | None,
                    vllm_patch: str | None, vllm_base: str | None, **kwargs: Any) -> Any:
            from racesim.runner.backend import resolve_backend

            given = (engine, vllm_src, vllm_patch, vllm_base) != (None,) * 4
            kwargs["backend"] = resolve_backend(engine, src=vllm_src, patch=vllm_patch,
                                                base=vllm_base) if given else None
            return f(*args, **kwargs)

        g: Callable[..., Any] = click.option(
            "--vllm-base", default=None, metavar="VERSION",
            help="With --vllm-src/--vllm-patch: run the tree as this supported vLLM "
                 "generation (0.33, 0.20.0...) [default: its version's nearest].")(wrapper)
        g = click.option(
            "--vllm-patch", type=click.Path(dir_okay=False), default=None, metavar="FILE",
            help="Run the installed vLLM with this unified diff applied (a cached shadow "
                 "tree; implies --engine vllm).")(g)
        g = click.option(
            "--vllm-src", type=click.Path(file_okay=False), default=None, metavar="DIR",
            help="Run the Python code of the vLLM checkout DIR (a folder holding vllm/) over "
                 "the installed release's compiled parts (implies --engine vllm).")(g)
        return engine_option(default)(g)

    return decorate


def run_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = ids_option(f)
    f = click.option("--skip", multiple=True, metavar="INVARIANT",
                     help="Leave an invariant unchecked (repeatable).")(f)
    f = strict_option(f)
    f = click.option("--seed", type=int, default=0, show_default=True, help="Run seed.")(f)
    f = click.option("--policy-opt", "policy_opts", multiple=True, metavar="KEY=VALUE",
                     help="A policy option (repeatable).")(f)
    f = click.option("-p", "--policy", default="buggy", show_default=True,
                     help="Policy (the abort ordering; buggy also means IDs as given) name or "
                          "package.module:ClassName; 'shipped' is the release as shipped.")(f)
    return f


def strict_option(f: Callable[..., Any], note: str = "") -> Callable[..., Any]:
    return click.option("--strict", is_flag=True,
                        help="Count accounting-only violations (metrics-exact) as failures too"
                             f"{note}.")(f)


def output_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--check-determinism", "check_det", is_flag=True,
                     help="Run the schedule a second time and compare the traces; show the "
                          "first differing event (exit 1 when they differ).")(f)
    f = click.option("--trace", "trace_file", type=click.Path(dir_okay=False),
                     help="Write Chrome trace-event JSON (opens in Perfetto).")(f)
    f = click.option("--html", "html_file", type=click.Path(dir_okay=False),
                     help="Write a self-contained HTML race report.")(f)
    f = click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")(f)
    return f


def explore_options(f: Callable[..., Any], matrix: bool = False) -> Callable[..., Any]:
    f = click.option("--out", "out_dir", type=click.Path(file_okay=False),
                     default="racesim-out", show_default=True,
                     help="Where counterexample files are written.")(f)
    f = click.option("--dask", default=None, metavar="ADDRESS",
                     help="Run on a Dask cluster (pip install 'racesim[dask]').")(f)
    f = click.option("--workers", type=int, default=None,
                     help="Worker processes [default: all cores].")(f)
    f = click.option("--seed", type=int, default=0, show_default=True, help="Base seed.")(f)
    f = click.option("--strategy", type=click.Choice(list(STRATEGIES)), default="random",
                     show_default=True,
                     help="How delays are chosen (hypothesis runs in this process).")(f)
    f = click.option("--skip", multiple=True, metavar="INVARIANT",
                     help="Leave an invariant unchecked (repeatable).")(f)
    f = click.option("--time-limit", type=float, default=None,
                     help=f"Stop exploring{' each cell' if matrix else ''} after this many "
                          f"seconds (shrinking is bounded by runs).")(f)
    return strict_option(f, " (with --fail-on-race)" if matrix else "")


def matrix_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``explore_options`` as the matrix words them (per cell)."""
    return explore_options(f, matrix=True)
