"""Issue 14, "Hardening and the first hour": each defect found by trying racesim as a new user.

Most cases run ``racesim.cli.main`` in this process; those that need a fresh process (the
current folder on the import path, Ctrl-C, hypothesis's folder) run the console script.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from _cli import cli, one_line_error

from racesim.cli import main
from racesim.explore import explore
from racesim.reports._io import write_text
from racesim.scenarios import load_scenario, parse_scenario
from racesim.sim import InputError

_SCRIPT = Path(sys.executable).with_name("racesim")
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "racesim"]

TINY = """\
name = "tiny"
horizon = 5.0
[[request]]
id = "X"
max_tokens = 2
"""

BOOM = """\
from racesim.engine_model.policies import LifecyclePolicy


class Boom(LifecyclePolicy):
    name = "boom"
    summary = "raises in abort"

    def abort(self, llm, request_ids):
        raise RuntimeError("kaboom")
        yield
"""


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    out = capsys.readouterr()
    code = exit_.value.code
    return (code if isinstance(code, int) else 1), out.out, out.err


def script(*args: str, cwd: Path | None = None, columns: int = 200,
           **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(COLUMNS=str(columns), NO_COLOR="1")
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300, check=False, **kw)


# -- 1. writing outputs --------------------------------------------------------------------------

def test_a_symlink_is_written_through_and_stays_a_link(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "target.html"
    target.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    code, _out, _err = cli(capsys, "run", "abort-reuse", "--witness", "--html", str(link))
    assert code == 1
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text().startswith("<!DOCTYPE html>")


def _device_like(tmp_path: Path, name: str, like: str) -> Path:
    """A node in ``tmp_path`` for the same device as ``like`` (so a regression that replaces
    it harms nothing outside the test); skipped where nodes cannot be made."""
    st = os.stat(like)
    if not stat.S_ISCHR(st.st_mode):
        pytest.skip(f"{like} is not a device here")
    node = tmp_path / name
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, st.st_rdev)
    except (PermissionError, OSError):
        pytest.skip("cannot make device nodes here")
    return node


def test_dev_null_is_written_through_not_replaced(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    null = _device_like(tmp_path, "null", os.devnull)
    code, _out, err = cli(capsys, "run", "abort-reuse", "--witness", "--html", str(null),
                          "--trace", str(null))
    assert code == 1, err
    assert stat.S_ISCHR(os.lstat(null).st_mode)


def test_a_named_pipe_is_written_through(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_text(fifo, "through the pipe")
    reader.join(timeout=30)
    assert got == [b"through the pipe"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("option", ["--html", "--trace"])
def test_a_folder_or_a_device_is_refused_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str) -> None:
    code, out, err = cli(capsys, "run", "abort-reuse", option, str(tmp_path))
    one_line_error(code, err, str(tmp_path), "folder")
    assert out == ""
    full = _device_like(tmp_path, "full", "/dev/full")  # once turned into an HTML file
    code, out, err = cli(capsys, "run", "abort-reuse", "--witness", option, str(full))
    one_line_error(code, err, str(full), "device")
    assert stat.S_ISCHR(os.lstat(full).st_mode) and out == ""


def test_a_failed_write_names_the_users_path_not_a_temp_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    def full(*args: Any, **kw: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", full)
    with pytest.raises(InputError) as info:
        write_text(tmp_path / "report.html", "x")
    assert str(tmp_path / "report.html") in str(info.value)
    assert ".tmp" not in str(info.value) and "No space left" in str(info.value)


def test_matrix_refuses_a_cells_folder_that_is_a_file_before_exploring(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mm-cells").write_text("mine")
    code, _out, err = cli(capsys, "matrix", "-s", "abort-reuse", "-p", "buggy", "--budget", "2",
                          "--workers", "1", "--out", str(tmp_path / "o"), "--html",
                          str(tmp_path / "mm.html"))
    one_line_error(code, err, "mm-cells")
    assert (tmp_path / "mm-cells").read_text() == "mine"
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_matrix_writes_cells_only_into_its_own_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("matrix", "-s", "abort-reuse", "-p", "buggy", "--budget", "8", "--workers", "1",
            "--out", str(tmp_path / "o"), "--html", str(tmp_path / "mm.html"))
    (tmp_path / "mm-cells").mkdir()
    (tmp_path / "mm-cells" / "abort-reuse__buggy.html").write_text("mine")
    code, _out, err = cli(capsys, *args)
    one_line_error(code, err, "not written by racesim")
    assert (tmp_path / "mm-cells" / "abort-reuse__buggy.html").read_text() == "mine"
    (tmp_path / "mm-cells" / "abort-reuse__buggy.html").unlink()
    (tmp_path / "mm-cells").rmdir()
    for _ in range(2):  # the second run replaces what the first wrote there
        code, out, _err = cli(capsys, *args)
        assert code == 0 and f"{tmp_path / 'mm-cells'}/" in out
        assert (tmp_path / "mm-cells" / "abort-reuse__buggy.html").read_text() != "mine"


def test_an_unshrunk_counterexample_never_replaces_a_shrunk_one(tmp_path: Path) -> None:
    scen = load_scenario("abort-reuse")
    shrunk = explore(scen, "buggy", budget=30, out_dir=tmp_path)
    path = Path(shrunk.counterexample_path or "")
    assert path.name == "abort-reuse__buggy__random__seed0.json"
    before = path.read_bytes()
    assert json.loads(before)["shrunk_from"] is not None

    def interrupt(done: int, total: int, violating: int) -> None:
        if violating:
            raise KeyboardInterrupt

    cut = explore(scen, "buggy", budget=30, out_dir=tmp_path, progress=interrupt)
    assert cut.interrupted
    assert cut.counterexample_path == str(path.with_name(path.stem + ".unshrunk.json"))
    assert path.read_bytes() == before
    doc = cut.document()["counterexample"]
    assert doc is not None and doc["shrunk"] is False and doc["path"].endswith(".unshrunk.json")


def test_ctrl_c_in_explore_reports_what_it_kept_and_exits_130(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from racesim.cli import progress

    def interrupt(self: Any, done: int, total: int, violating: int) -> None:
        if violating > 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(progress.ProgressBar, "__call__", interrupt)
    code, out, err = cli(capsys, "explore", "abort-reuse", "--budget", "50", "--workers", "1",
                         "--out", str(tmp_path))
    assert code == 130, err
    assert "interrupted" in err and ".unshrunk.json" in err
    assert "NOT shrunk" in out and "None" not in out


# -- 2. exit statuses ------------------------------------------------------------------------------

def test_accounting_only_is_exit_0_with_one_warning_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    # on 0.8: on 0.33 the same delay makes abort-scope's kept state meet the re-add (README)
    code, out, err = cli(capsys, "run", "abort-reuse", "-p", "abort-scope", "--witness",
                         "--vllm", "0.8")
    assert code == 0
    assert err.count("\n") == 1 and "warning" in err and "metrics-exact" in err
    assert out.startswith("ACCOUNTING ONLY")
    code, _out, _err = cli(capsys, "run", "abort-reuse", "-p", "abort-scope", "--witness",
                           "--vllm", "0.8", "--strict")
    assert code == 1


def test_matrix_exits_0_when_it_completed_and_1_only_with_fail_on_race(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["matrix", "-s", "multi-frontend", "-p", "buggy", "--budget", "2", "--workers", "1",
            "--out", str(tmp_path), "--time-limit", "60"]
    code, out, _err = cli(capsys, *argv)
    assert code == 0 and "race" in out
    code, _out, _err = cli(capsys, *argv, "--fail-on-race")
    assert code == 1


def test_a_policy_that_raises_is_one_line_naming_its_method_and_line(tmp_path: Path) -> None:
    (tmp_path / "boompolicy.py").write_text(BOOM)
    proc = script("run", "abort-reuse", "-p", "boompolicy:Boom", cwd=tmp_path)
    one_line_error(proc.returncode, proc.stderr, "boompolicy:Boom", "RuntimeError", "abort()",
                   "boompolicy.py:9", "kaboom")
    proc = script("matrix", "-s", "abort-reuse", "-p", "buggy", "-p", "boompolicy:Boom",
                  "--budget", "3", "--workers", "1", "--html", "m.html", "--json", cwd=tmp_path)
    one_line_error(proc.returncode, proc.stderr, "abort()")
    cells = {c["policy"]: c for c in json.loads(proc.stdout)["cells"]}
    assert cells["buggy"]["runs"] == 3 and cells["boompolicy:Boom"]["error"]
    assert (tmp_path / "m.html").exists(), "the matrix still writes its report"


# -- 3. limits ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("old", "new", "needles"), [
    ('id = "X"', 'id = "' + "x" * 257 + '"', ("request[0].id", "257", "256")),
    ("max_tokens = 2", "max_tokens = 2\nat = 5.0", ("request[0].at", "horizon")),
])
def test_request_limits_are_load_errors(old: str, new: str, needles: tuple[str, ...]) -> None:
    assert parse_scenario(TINY, "t.toml").workload.requests[0].id == "X"
    with pytest.raises(InputError) as info:
        parse_scenario(TINY.replace(old, new), "t.toml")
    for needle in needles:
        assert needle in str(info.value)


def test_witness_without_a_witness_table_is_exit_2(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    code, _out, err = cli(capsys, "run", str(path), "--witness")
    one_line_error(code, err, "--witness", "tiny", "[witness]")
    code, _out, _err = cli(capsys, "run", "multi-frontend", "--witness")  # an empty table
    assert code == 1


def test_replay_imports_a_policy_only_when_allowed(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "sneaky.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from racesim.engine_model.policies import AbortScope as Sneaky\n")
    from racesim.documents import Counterexample, write_counterexample

    cx = Counterexample(load_scenario("abort-reuse"), "sneaky:Sneaky", {}, 0, (), (), (),
                        "0" * 64)
    write_counterexample(tmp_path / "cx.json", cx)
    proc = script("replay", "cx.json", cwd=tmp_path)
    one_line_error(proc.returncode, proc.stderr, "--allow-import", "sneaky:Sneaky")
    assert not marker.exists()
    proc = script("replay", "cx.json", "--allow-import", cwd=tmp_path)
    assert proc.returncode == 0 and marker.exists(), proc.stderr


# -- 4. terminal safety and layout -----------------------------------------------------------------

def test_control_characters_are_escaped_in_terminal_and_html(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "evil.toml"
    path.write_text(TINY.replace('id = "X"', 'id = "A\\u001b[2J\\u0007\\r\\u0000"'))
    html = tmp_path / "evil.html"
    code, out, err = cli(capsys, "run", str(path), "--html", str(html))
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out and "\x00" not in out
    assert "A\\x1b[2J\\x07\\r\\x00" in out
    page = html.read_bytes()
    assert b"\x1b" not in page and b"\x00" not in page and b"A\\x1b[2J" in page


def test_tables_fit_80_columns_and_commands_are_never_wrapped(tmp_path: Path) -> None:
    proc = script("run", "abort-reuse", "--witness", "--vllm", "0.8", columns=80)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    command = [ln for ln in lines if ln.startswith("reproduce: ")]
    assert len(command) == 1 and command[0].endswith("'frontend.abort:after_pop#0=0.05'")
    table_lines = [ln for ln in lines if ln[:1] in "┃│┏┡└"]
    assert table_lines and all(len(ln) <= 80 for ln in table_lines)
    for name in ("unique-live-id", "abort-precision", "engine-alive"):
        assert any(name in ln for ln in table_lines), name   # never broken mid-word
    proc = script("matrix", "-s", "pd-reuse", "--budget", "20", "--workers", "1", "--out",
                  str(tmp_path), columns=80)
    assert proc.returncode == 0
    assert all(len(ln) <= 80 for ln in proc.stdout.splitlines())
    assert "frontend-covers-engine" in proc.stdout or "unique-live-id" in proc.stdout


# -- 6. extending and documenting ------------------------------------------------------------------

def test_policies_load_from_the_current_folder_and_show_name_and_summary(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(
        "from racesim.engine_model.policies import AbortScope\n\n\n"
        "class Mine(AbortScope):\n    name = 'mine'\n    summary = 'my own fix'\n")
    proc = script("run", "abort-reuse", "-p", "mine:Mine", "--witness", "--vllm", "0.8",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "mine:Mine (mine): my own fix" in proc.stdout.splitlines()[0]


def test_show_prints_a_bundled_scenarios_toml(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = cli(capsys, "show", "abort-reuse")
    assert code == 0
    assert parse_scenario(out, "shown") == load_scenario("abort-reuse")


def test_explore_defaults_to_buggy_and_hypothesis_stays_under_out(tmp_path: Path) -> None:
    proc = script("explore", "abort-reuse", "--strategy", "hypothesis", "--budget", "15",
                  "--out", "o", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "under buggy" in proc.stdout
    assert not (tmp_path / ".hypothesis").exists()


def test_gitignore_covers_the_main_jobs_outputs() -> None:
    ignored = (Path(__file__).parents[1] / ".gitignore").read_text().split()
    for name in ("racesim-out/", "racesim-report.html", "racesim-report-cells/"):
        assert name in ignored


def test_explore_prints_progress_when_stderr_is_not_a_terminal(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """Issue 28 (research/reliability.md D8): off a terminal (a CI log), explore printed
    nothing until it ended; it now prints a plain line every LOG_EVERY seconds, as matrix
    prints one per cell (0 here, so every progress call logs)."""
    import racesim.cli.progress as progress

    monkeypatch.setattr(progress, "LOG_EVERY", 0.0)
    code, _, err = cli(capsys, "explore", "abort-reuse", "-p", "buggy", "--budget", "30",
                       "--workers", "1", "--out", str(tmp_path))
    assert code in (0, 1), err
    lines = [x for x in err.splitlines() if x.startswith("racesim: abort-reuse / buggy: ")]
    assert lines and "/30 runs" in lines[-1], err
    assert "\x1b" not in err  # no bar's control characters in a log
