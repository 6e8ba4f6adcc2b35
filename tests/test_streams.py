"""Exit codes and streams: a reader that stops reading (``racesim list | head -1``) ends
racesim with exit 0 and nothing on stderr, whatever prints (rich tables, JSON, TOML)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest_plugins = ["pytester"]


@pytest.mark.parametrize("args", [
    ["list"],
    ["list", "--json"],
    ["show", "abort-reuse"],
    ["run", "abort-reuse", "-p", "buggy", "--witness"],
    ["run", "abort-reuse", "-p", "buggy", "--witness", "--json"],
], ids=" ".join)
def test_a_closed_pipe_is_exit_0_and_quiet(args: list[str], tmp_path: os.PathLike[str]) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader has gone, as head has after its first line: every write fails
    try:
        done = subprocess.run([sys.executable, "-m", "racesim", *args], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120, cwd=tmp_path)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0, "")


def test_a_test_that_writes_into_the_cwd_fails(pytester: pytest.Pytester) -> None:
    """The guard every test here runs under (tests/_cwd_guard.py, autouse in conftest.py)."""
    pytester.makeconftest("from _cwd_guard import no_files_left_in_cwd  # noqa: F401\n")
    pytester.makepyfile(test_inner="""
        from pathlib import Path

        def test_writes_here():
            Path("racesim-out").mkdir(exist_ok=True)
            Path("racesim-out", "x.json").write_text("{}")

        def test_writes_in_tmp_path(tmp_path):
            (tmp_path / "x.json").write_text("{}")
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*left racesim-out, racesim-out/x.json in the folder*"])


def test_a_session_that_writes_into_the_cwd_fails(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("from _cwd_guard import (no_files_left_in_cwd, pytest_sessionfinish,"
                          " pytest_sessionstart)  # noqa: F401\n")
    pytester.makepyfile(test_inner="""
        from pathlib import Path

        import pytest

        @pytest.fixture(scope="module")
        def written():
            Path("left-by-a-fixture.txt").write_text("x")

        def test_uses_it(written):
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*session left left-by-a-fixture.txt in the folder*"])
