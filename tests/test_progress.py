"""Progress on every long command: a rich bar on a terminal, one line per cell or phase in a
log (stderr not a terminal), and with --time-limit a bar whose total is the time."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import racesim.bench as bench_module
import racesim.cli.explore as explore_cli
from racesim.cli import main
from racesim.cli.progress import ProgressBar


def _log(text: io.StringIO) -> Console:
    return Console(file=text, force_terminal=False, width=200)


def test_a_log_gets_one_line_per_step() -> None:
    out = io.StringIO()
    bar = ProgressBar(True, "matrix", console=_log(out))
    bar.start("abort-reuse / buggy", steps=2)
    bar(5, 10, 1)
    bar.finish("race (engine-alive)")
    bar.start("abort-reuse / internal-id", steps=2)
    bar.start("phase without an explicit finish")
    bar.close()
    lines = out.getvalue().splitlines()
    assert re.fullmatch(r"racesim: matrix \[1/2\] abort-reuse / buggy: race \(engine-alive\), "
                        r"\d+\.\d s", lines[0]), lines
    assert lines[1].startswith("racesim: matrix [2/2] abort-reuse / internal-id, ")
    assert len(lines) == 2  # the third step never ended


def test_disabled_progress_prints_nothing() -> None:
    out = io.StringIO()
    bar = ProgressBar(False, "matrix", console=_log(out))
    bar.start("x", steps=1)
    bar(1, 1, 0)
    bar.finish("done")
    assert out.getvalue() == ""


def test_with_a_time_limit_the_bar_counts_seconds_not_runs() -> None:
    term = Console(file=io.StringIO(), force_terminal=True, width=120)
    bar = ProgressBar(True, "explore", time_limit=30.0, console=term, delay=0.0)
    bar(150, 5000, 3)
    try:
        (task,) = bar.progress.tasks
        assert task.total == 30.0 and task.completed < 30.0  # seconds, not 150 of 5000 runs
        assert "150 runs" in task.fields["v"]
    finally:
        bar.close()


def test_explore_gives_its_time_limit_to_the_bar(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    made: list[ProgressBar] = []

    class Kept(ProgressBar):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(explore_cli, "ProgressBar", Kept)
    with pytest.raises(SystemExit):
        main(["explore", "abort-reuse", "-p", "internal-id", "--budget", "3",
              "--time-limit", "7", "--out", str(tmp_path), "--json"])
    assert [b.time_limit for b in made] == [7.0]


def _stderr_of(args: list[str], cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "racesim", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_the_matrix_logs_one_line_per_cell(tmp_path: Path) -> None:
    err = _stderr_of(["matrix", "-s", "abort-reuse", "-s", "duplicate-in-flight",
                      "-p", "buggy", "-p", "internal-id", "--budget", "5", "--workers", "1",
                      "--out", str(tmp_path)], tmp_path)
    cells = [line for line in err.splitlines() if line.startswith("racesim: matrix [")]
    assert [c.split(":")[1].split("]")[1].strip() for c in cells] == [
        "abort-reuse / buggy", "abort-reuse / internal-id",
        "duplicate-in-flight / buggy", "duplicate-in-flight / internal-id"], err
    assert cells[0].startswith("racesim: matrix [1/4] ") and " runs, " in cells[0]


def test_conform_logs_one_line_per_cell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from test_conform import _model_twice  # both sides on the model: no vLLM needed

    _model_twice(monkeypatch)
    with pytest.raises(SystemExit):
        main(["conform", "abort-reuse", "duplicate-in-flight", "-p", "internal-id",
              "--budget", "3", "--workers", "1", "--out", str(tmp_path)])
    err = capsys.readouterr().err  # captured: not a terminal
    cells = [line for line in err.splitlines() if line.startswith("racesim: conform [")]
    assert len(cells) == 2 and "abort-reuse / internal-id" in cells[0], err


def test_bench_logs_one_line_per_phase(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    def fake_bench(*, quick: bool = False, progress: Any = None) -> dict[str, Any]:
        for phase in ("bare simpy", "model events: abort-reuse", "scale: 1000 requests"):
            progress(phase)
            time.sleep(0.01)
        return {"fake": True}

    monkeypatch.setattr(bench_module, "run_bench", fake_bench)
    monkeypatch.setattr("racesim.bench.render.print_bench", lambda console, doc: None)
    with pytest.raises(SystemExit):
        main(["bench", "--quick"])
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("racesim: bench")]
    assert [x.split(",")[0] for x in lines] == [
        "racesim: bench [1] bare simpy", "racesim: bench [2] model events: abort-reuse",
        "racesim: bench [3] scale: 1000 requests"], lines
