"""Issue 22 item 3: bounded resources. Every size has a cap (exit 2 above it), replay reads only
regular files of bounded size, error lines are clipped, explore's memory does not grow with the
runs it makes, and pool workers die with their parent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _cli import cli as _cli, one_line_error as _one_line_error
from racesim.scenarios.limits import (
    MAX_FILE_BYTES,
    MAX_REQUESTS,
    MAX_SCHEDULE,
    MAX_TOTAL_BLOCKS,
    MAX_TOTAL_OUTPUT_TOKENS,
    MAXIMUM,
)

_SCRIPT = Path(sys.executable).with_name("racesim")
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "racesim"]

BASE = """\
name = "sized"
horizon = 5.0
{top}
[engine]
{engine}
[[request]]
id = "X"
{request}
"""




@pytest.mark.parametrize(("top", "engine", "request_", "key"), [
    ("", "num_blocks = 1000000000000", "", "engine.num_blocks"),
    ("", f"num_blocks = {MAXIMUM['engine.num_blocks'] + 1}", "", "engine.num_blocks"),
    (f"frontends = {MAXIMUM['frontends'] + 1}", "", "", "frontends"),
    ("", f"data_parallel_size = {MAXIMUM['engine.data_parallel_size'] + 1}", "",
     "engine.data_parallel_size"),
    ("", "", f"n = {MAXIMUM['request.n'] + 1}", "request[0].n"),
    ("", "num_blocks = 100000", f"max_tokens = {MAXIMUM['request.max_tokens'] + 1}",
     "request[0].max_tokens"),
    ("", "", f"prompt_tokens = {MAXIMUM['request.prompt_tokens'] + 1}",
     "request[0].prompt_tokens"),
    ("", f"max_num_seqs = {MAXIMUM['engine.max_num_seqs'] + 1}", "", "engine.max_num_seqs"),
    ("", f"num_blocks = {MAX_TOTAL_BLOCKS // 4 + 1}\ndata_parallel_size = 4", "",
     "engine.num_blocks"),
    ("", "num_blocks = 100000", "max_tokens = 60000\nn = 8", "request"),
])
def test_a_size_above_its_cap_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], top: str, engine: str,
        request_: str, key: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(BASE.format(top=top, engine=engine, request=request_))
    code, _out, err = _cli(capsys, "run", str(path))
    _one_line_error(code, err, key, "cap", "docs/limits.md")


def test_too_many_requests_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.toml"
    path.write_text('name = "many"\n' + '[[request]]\nid = "X"\n' * (MAX_REQUESTS + 1))
    code, _out, err = _cli(capsys, "run", str(path))
    _one_line_error(code, err, "request", str(MAX_REQUESTS))


def test_too_many_requests_fail_fast_and_small_before_parsing() -> None:
    """Issue 28 (research/reliability.md D7): a 7 MB scenario with 100,001 [[request]]
    tables used to be parsed whole (tomllib, about 200 MB and 10-20 s) before its request
    count was checked; the count is now checked on the text first. Measured in-process: the
    memory parse_scenario allocates (tracemalloc's peak), and its time."""
    import tracemalloc

    from racesim.scenarios import parse_scenario
    from racesim.sim import InputError

    one = '\n[[request]]\nid = "R{}"\nat = 0.0\nprompt_tokens = 16\nmax_tokens = 4\n'
    text = 'name = "big"\n' + "".join(one.format(i) for i in range(100_001))
    assert len(text) > 6_500_000
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(InputError) as err:
            parse_scenario(text, "big.toml")
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    line = 3 + 6 * MAX_REQUESTS  # the header of request 10,001 (0-based 10,000)
    assert str(err.value).startswith(f"big.toml:{line}: request: "), err.value
    assert str(MAX_REQUESTS) in str(err.value) and "docs/limits.md" in str(err.value)
    assert peak < 16 * 2**20, f"{peak} bytes allocated"  # the text itself is not copied
    assert seconds < 3.0, f"{seconds:.1f} s"


def test_a_scenario_name_has_a_length_cap(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A 300-character name ran, then explore failed on the file name it makes ("File name
    too long"): the name is capped when the file is read (docs/limits.md)."""
    from racesim.scenarios.limits import MAX_NAME

    path = tmp_path / "s.toml"
    path.write_text(BASE.format(top="", engine="", request="").replace(
        'name = "sized"', f'name = "{"n" * (MAX_NAME + 1)}"'))
    code, _out, err = _cli(capsys, "run", str(path))
    _one_line_error(code, err, "name", str(MAX_NAME), "docs/limits.md")
    path.write_text(BASE.format(top="", engine="", request="").replace(
        'name = "sized"', f'name = "{"n" * MAX_NAME}"'))
    code, _out, err = _cli(capsys, "explore", str(path), "--budget", "2",
                           "--out", str(tmp_path / "o"))
    assert code in (0, 1), err


def test_the_caps_leave_room_for_every_bundled_scenario() -> None:
    from racesim.scenarios import bundled_names, load_scenario

    assert all(load_scenario(n) for n in bundled_names())
    assert MAX_TOTAL_OUTPUT_TOKENS >= 2**16


def _counterexample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    _cli(capsys, "explore", "abort-reuse", "--budget", "5", "--workers", "1", "--out",
         str(tmp_path / "cx"))
    return next((tmp_path / "cx").glob("*.json"))


def test_a_counterexample_above_a_cap_is_exit_2(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = _counterexample(tmp_path, capsys)
    data = json.loads(path.read_text())
    data["scenario"]["engine"]["num_blocks"] = 10**12
    (tmp_path / "big.json").write_text(json.dumps(data))
    code, _out, err = _cli(capsys, "replay", str(tmp_path / "big.json"))
    _one_line_error(code, err, "engine.num_blocks", "cap")
    data = json.loads(path.read_text())
    data["schedule"] = [{"point": "client.send", "occurrence": i, "delay": 0.001}
                        for i in range(MAX_SCHEDULE + 1)]
    (tmp_path / "long.json").write_text(json.dumps(data))
    code, _out, err = _cli(capsys, "replay", str(tmp_path / "long.json"))
    _one_line_error(code, err, "schedule", str(MAX_SCHEDULE))


def test_replay_refuses_a_file_over_the_size_cap(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "huge.json"
    with path.open("wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk used
    code, _out, err = _cli(capsys, "replay", str(path))
    _one_line_error(code, err, "huge.json", str(MAX_FILE_BYTES))


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_replay_refuses_dev_zero(capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = _cli(capsys, "replay", "/dev/zero")
    _one_line_error(code, err, "/dev/zero", "not a regular file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_replay_refuses_a_fifo_with_no_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "cx.json"
    os.mkfifo(fifo)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([*COMMAND, "replay", str(fifo)], capture_output=True, text=True,
                          env=env, timeout=60, check=False)  # today: blocks forever
    _one_line_error(proc.returncode, proc.stderr, "cx.json", "not a regular file")


def test_an_error_line_with_a_pasted_megabyte_is_clipped(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = _cli(capsys, "run", "abort-reuse", "--delay", "x" * 100_000 + "=1")
    _one_line_error(code, err, "--delay")
    assert len(err) < 1100 and err.rstrip().endswith(" chars)")


# -- explore's memory -------------------------------------------------------------------------

def _schedule(i: int) -> tuple[object, ...]:
    from racesim.sim import Decision

    return tuple(Decision("engine.step:execute", i + k, 0.01 * (k + 1)) for k in range(5))


def test_distinct_schedules_are_counted_exactly_below_the_limit() -> None:
    from racesim.explore.distinct import DistinctCounter

    counter = DistinctCounter()
    for i in range(3000):
        counter.add(_schedule(i % 1000))
        counter.add(())
    assert len(counter) == 1001 and not counter.estimated


def test_past_the_limit_the_count_is_a_marked_estimate_in_fixed_memory() -> None:
    import tracemalloc

    from racesim.explore.distinct import DistinctCounter

    counter = DistinctCounter(exact_limit=1000)
    for i in range(1000):
        counter.add(_schedule(i))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1000, 40_000):
            counter.add(_schedule(i))
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert counter.estimated
    assert abs(len(counter) - 40_000) < 0.05 * 40_000
    assert grown < 64_000, grown  # the 16 KB sketch; keeping schedules would be ~100 MB


def test_explore_keeps_digests_not_schedules() -> None:
    """What an exploration keeps per run is a digest (an int, which the garbage collector does
    not track), not the run's schedule (tuples of decisions): after 200 more runs it holds about
    as many objects as before. Keeping schedules held about 25 more objects a run."""
    import gc

    from racesim.explore import explore
    from racesim.scenarios import load_scenario

    scen = load_scenario("abort-reuse")
    explore(scen, "internal-id", budget=2, workers=1)  # warm caches and imports

    def held_at_the_end(budget: int) -> int:
        held: list[int] = []

        def progress(done: int, total: int, _violating: int) -> None:
            if done == total:  # the last run is recorded: what the exploration holds now
                gc.collect()
                held.append(len(gc.get_objects()))

        res = explore(scen, "internal-id", budget=budget, workers=1, shrink_runs=0,
                      progress=progress)
        assert res.distinct_traces > budget // 2 and not res.distinct_estimated
        return held[0]

    grown = held_at_the_end(250) - held_at_the_end(50)
    assert grown < 1000, grown  # keeping the 200 schedules: about 5000


# -- pool workers ----------------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is ``pid``, from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


def _wait_for(what: object, deadline: float) -> object:
    while time.monotonic() < deadline:
        value = what()  # type: ignore[operator]
        if value:
            return value
        time.sleep(0.05)
    return what()  # type: ignore[operator]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_pool_workers_die_with_their_parent(tmp_path: Path, sig: signal.Signals) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([*COMMAND, "explore", "abort-reuse", "-p", "internal-id",
                             "--budget", "1000000", "--time-limit", "120", "--workers", "2",
                             "--out", str(tmp_path), "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    workers: list[int] = []
    try:
        # the pool's two workers (and multiprocessing's resource tracker, which exits by itself)
        found = _wait_for(lambda: len(_children(proc.pid)) >= 2, time.monotonic() + 60)
        assert found, "the explore never started its workers"
        workers = _children(proc.pid)
        proc.send_signal(sig)
        proc.wait(timeout=30)
        gone = _wait_for(lambda: not any(_alive(w) for w in workers), time.monotonic() + 20)
        assert gone, f"{[w for w in workers if _alive(w)]} outlived their parent"
    finally:
        if proc.poll() is None:
            proc.kill()
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)


def test_docs_limits_lists_every_cap_as_the_code_has_it() -> None:
    from racesim.scenarios import limits

    text = (Path(__file__).parents[1] / "docs" / "limits.md").read_text()
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip()
            for line in text.splitlines() if line.startswith("| `")}
    for key, cap in limits.MAXIMUM.items():
        name = key.split(".")[-1]
        row = next((v for k, v in rows.items() if f"`{key}`" in k or f"`{name}`" in k), None)
        assert row is not None and row.split()[0] == str(cap), (key, cap, row)
    for cap in (limits.MAX_REQUESTS, limits.MAX_PLAN_ENTRIES, limits.MAX_TOTAL_BLOCKS,
                limits.MAX_TOTAL_PROMPT_TOKENS, limits.MAX_TOTAL_OUTPUT_TOKENS,
                limits.MAX_SCHEDULE, limits.MAX_FILE_BYTES, limits.MAX_NAME):
        assert str(cap) in text, cap
