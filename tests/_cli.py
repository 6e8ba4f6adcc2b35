"""Calling ``racesim``'s CLI in-process from a test, and checking its one-line errors."""

from __future__ import annotations

import pytest

from racesim.cli import main


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``racesim ARGS``: its exit status, stdout and stderr."""
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    out = capsys.readouterr()
    code = exit_.value.code
    return (code if isinstance(code, int) else 1), out.out, out.err


def one_line_error(code: int, err: str, *needles: str) -> None:
    """Bad input: exit 2 and one ``racesim: error:`` line holding every needle, no traceback."""
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("racesim: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
