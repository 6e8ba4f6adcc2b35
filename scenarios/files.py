"""Finding scenarios: a bundled name (``scenarios/bundled/NAME.toml``), a corpus entry's name
(``scenarios/corpus/NAME.toml``), or a path."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

from racesim.scenarios.limits import MAX_FILE_BYTES
from racesim.scenarios.checks import show as _show
from racesim.scenarios.loader import Scenario, parse_scenario
from racesim.sim.errors import InputError

__all__ = ["bundled_names", "corpus_names", "load_scenario"]

_MAX_FILE_BYTES = MAX_FILE_BYTES
_BUNDLED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _bundled_dir() -> Any:
    return resources.files(__package__ or "scenarios").joinpath("bundled")


def _corpus_dir() -> Any:
    return resources.files(__package__ or "scenarios").joinpath("corpus")


def _names(folder: Any) -> tuple[str, ...]:
    try:
        return tuple(sorted(e.name[:-5] for e in folder().iterdir()
                            if e.name.endswith(".toml") and e.is_file()))
    except (OSError, ModuleNotFoundError):
        return ()


def bundled_names() -> tuple[str, ...]:
    """Sorted names of the bundled scenarios (``scenarios/bundled/*.toml``)."""
    return _names(_bundled_dir)


def corpus_names() -> tuple[str, ...]:
    """Sorted names of the bundled corpus entries (``scenarios/corpus/<issue>-<slug>.toml``):
    real vLLM bugs, each with its ``[corpus]`` table."""
    return _names(_corpus_dir)


def _read(path: Path, source: str) -> str:
    """A scenario file's text; any reason it cannot be read is an InputError."""
    try:
        problem = ("no such scenario file" if not path.exists()
                   else "is a directory, not a scenario file" if path.is_dir()
                   else "not a regular file" if not path.is_file()
                   else "too large for a scenario file" if path.stat().st_size > _MAX_FILE_BYTES
                   else None)
        raw = b"" if problem else path.read_bytes()
    except (OSError, ValueError) as e:
        problem = f"cannot read: {getattr(e, 'strerror', None) or e}"
    if problem:
        raise InputError(f"{source}: {problem}")
    return _decode(raw, source)


def _decode(raw: bytes, source: str) -> str:
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise InputError(f"{source}: not a UTF-8 text file (bad byte at offset {e.start})") \
            from None


def load_scenario(name_or_path: str) -> Scenario:
    """A bundled scenario by name, or a scenario file by path.

    A string containing ``/`` or ending in ``.toml`` is a path; any other is tried as a
    bundled name first, then as a corpus entry's name, then as a path.
    """
    if not isinstance(name_or_path, str) or not name_or_path:
        raise InputError(f"scenario name or path must be a non-empty string "
                         f"(got {_show(name_or_path)})")
    is_path = "/" in name_or_path or name_or_path.endswith(".toml")
    if not is_path and _BUNDLED_NAME.fullmatch(name_or_path):
        for folder, where in (("bundled", _bundled_dir), ("corpus", _corpus_dir)):
            source = f"<{folder} {name_or_path}>"
            try:
                entry = where().joinpath(f"{name_or_path}.toml")
                raw = entry.read_bytes() if entry.is_file() else None
            except (OSError, ModuleNotFoundError) as e:
                raise InputError(f"{source}: cannot read: {e}") from None
            if raw is not None:
                return parse_scenario(_decode(raw, source), source)
    path = Path(name_or_path)
    if not is_path:
        try:
            exists = path.exists()
        except (OSError, ValueError):
            exists = False
        if not exists:
            known = ", ".join(bundled_names()) or "none"
            raise InputError(f"unknown scenario {name_or_path!r}: not a bundled name "
                             f"(bundled: {known}; 'racesim list corpus' lists the corpus "
                             f"entries) and no such file")
    return parse_scenario(_read(path, name_or_path), name_or_path)
