"""Issue 22 item 3, Dask: no workers, or an address that is not a scheduler, ends within
--time-limit in one line (exit 2); a policy module the workers cannot import says so and how
to ship it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

_SCRIPT = Path(sys.executable).with_name("racesim")
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "racesim"]


def _racesim(*args: str, cwd: Path | None = None,
             timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    started = time.monotonic()
    proc = subprocess.run([*COMMAND, *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=timeout, check=False)
    return proc, time.monotonic() - started


def _one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("racesim: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A TCP port that accepts connections and never says a word: not a Dask scheduler."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


def test_an_address_that_is_not_a_scheduler_ends_within_the_time_limit(
        tmp_path: Path, silent_listener: str) -> None:
    proc, took = _racesim("explore", "abort-reuse", "--dask", silent_listener, "--time-limit",
                          "2", "--out", str(tmp_path))
    _one_line_error(proc, "--dask", silent_listener)
    assert took < 30, took  # today: it never ends


def test_a_scheduler_with_no_workers_ends_within_the_time_limit(tmp_path: Path) -> None:
    with distributed.LocalCluster(n_workers=0, processes=False, protocol="tcp",
                                  dashboard_address=":0") as cluster:  # any free port
        address = cluster.scheduler_address
        proc, took = _racesim("explore", "abort-reuse", "--dask", address, "--time-limit", "2",
                              "--out", str(tmp_path))
        _one_line_error(proc, "no workers", "dask worker")
        assert took < 30, took
        proc, _took = _racesim("matrix", "-s", "abort-reuse", "-p", "buggy", "--dask", address,
                               "--time-limit", "2", "--budget", "5", "--out", str(tmp_path))
        _one_line_error(proc, "no workers")


MINE = """\
from racesim.engine_model.policies import Buggy


class Mine(Buggy):
    name = "mine"
    summary = "the buggy policy, from a module only the client has"
"""


def test_a_policy_the_workers_cannot_import_says_how_to_ship_it(tmp_path: Path) -> None:
    (tmp_path / "minepolicy.py").write_text(MINE)
    # the workers' current folder is not tmp_path: they cannot import minepolicy
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        proc, _took = _racesim("explore", "abort-reuse", "-p", "minepolicy:Mine", "--budget",
                               "20", "--dask", cluster.scheduler_address, "--out", "out",
                               cwd=tmp_path, timeout=120)
    _one_line_error(proc, "minepolicy:Mine", "worker", "upload_file('minepolicy.py')")
