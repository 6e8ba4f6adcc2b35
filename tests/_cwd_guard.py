"""A test that leaves a file in the folder pytest was started from fails (``pytest -q`` must
write nothing there: tests write into ``tmp_path``).

The fixture compares the folder's entries, and the contents of the folders racesim writes by
default (``racesim-out/``, ``racesim-report-cells/``), before and after each test, and once
for the whole session. Not counted: ``__pycache__`` (Python's) and ``.pytest_cache`` (pytest's
own, off in this project). hypothesis's ``.hypothesis`` folder is counted: conftest.py points
hypothesis at the user's cache folder instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["no_files_left_in_cwd", "entries", "pytest_sessionstart", "pytest_sessionfinish"]

#: The folders racesim writes into when not told otherwise (explore, matrix, the plugin).
WATCHED = ("racesim-out", "racesim-report-cells")
IGNORED = ("__pycache__", ".pytest_cache")


def entries(folder: Path) -> frozenset[str]:
    """The names in ``folder``, and the paths under its WATCHED folders."""
    try:
        names = {p.name for p in folder.iterdir() if p.name not in IGNORED}
    except OSError:
        return frozenset()
    for watched in WATCHED:
        if (folder / watched).is_dir():
            names.update(p.relative_to(folder).as_posix() for p in (folder / watched).rglob("*"))
    return frozenset(names)


@pytest.fixture(autouse=True)
def no_files_left_in_cwd(request: pytest.FixtureRequest) -> Iterator[None]:
    folder = Path(request.config.invocation_params.dir)
    before = entries(folder)
    yield
    left = sorted(entries(folder) - before)
    if left:
        pytest.fail(f"the test left {', '.join(left[:5])}{' ...' if len(left) > 5 else ''} "
                    f"in the folder pytest runs in ({folder}): write into tmp_path",
                    pytrace=False)


_BEFORE = pytest.StashKey[frozenset[str]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_BEFORE] = entries(Path(session.config.invocation_params.dir))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """What no single test left, but the session did (a module or session fixture)."""
    folder = Path(session.config.invocation_params.dir)
    before = session.config.stash.get(_BEFORE, None)
    left = sorted(entries(folder) - before) if before is not None else []
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (f"the test session left {', '.join(left[:5])}"
                   f"{' ...' if len(left) > 5 else ''} in the folder pytest runs in ({folder})")
        if reporter is not None:
            reporter.write_line(f"ERROR: {message}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
