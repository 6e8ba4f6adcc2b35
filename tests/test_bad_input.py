"""Bad input everywhere: every malformed input to the CLI exits 2 with one line on stderr.

Each case runs ``racesim.cli.main(argv)`` in-process (a few also as a real process) and
checks the contract of the README's exit-status table: exit status 2, nothing on stdout, exactly one
non-empty line on stderr, and no traceback anywhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from racesim.cli import main

VALID_SCENARIO = """\
name = "tiny"
[[request]]
id = "X"
max_tokens = 2
abort_at = 0.01
"""

SCENARIO_FILES: dict[str, str | bytes] = {
    "syntax-error.toml": 'name = "x"\n[[request]\nid = "X"\n',
    "unknown-top-key.toml": VALID_SCENARIO + "bogus = 1\n",
    "unknown-table-key.toml": VALID_SCENARIO + "[engine]\nwarp_speed = 9\n",
    "unknown-request-key.toml": VALID_SCENARIO.replace('id = "X"', 'id = "X"\npriority = 1'),
    "wrong-type.toml": VALID_SCENARIO.replace('name = "tiny"', 'name = "tiny"\nhorizon = "long"'),
    "wrong-type-request.toml": VALID_SCENARIO.replace("max_tokens = 2", 'max_tokens = "2"'),
    "negative-time.toml": VALID_SCENARIO.replace("abort_at = 0.01", "abort_at = -1.0"),
    "unknown-topology.toml": VALID_SCENARIO.replace('name = "tiny"',
                                                    'name = "tiny"\ntopology = "ring"'),
    "unknown-witness-point.toml": VALID_SCENARIO + '[witness]\n"nosuch.point" = 0.1\n',
    "no-requests.toml": 'name = "x"\n',
    "empty.toml": "",
    "binary.toml": bytes(range(256)) * 4,
    "not-utf8.toml": 'name = "caf\xe9"\n'.encode("latin-1"),
}


def _counterexample(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": "racesim-counterexample/1",
        "scenario": {"name": "tiny", "request": [{"id": "X", "max_tokens": 2}]},
        "policy": "buggy", "policy_options": {}, "seed": 0,
        "schedule": [{"point": "frontend.abort:after_pop", "occurrence": 0, "delay": 0.05}],
        "skip": [], "violations": [], "trace_hash": "0" * 64}
    for key, value in changes.items():
        if value is _DROP:
            del doc[key]
        else:
            doc[key] = value
    return doc


_DROP = object()
COUNTEREXAMPLE_FILES: dict[str, str | bytes] = {
    "not-json.json": "this is not JSON",
    "json-array.json": "[1, 2, 3]",
    "json-null.json": "null",
    "binary.json": bytes(range(256)),
    "nested-too-deep.json": "[" * 100_000 + "]" * 100_000,
    "unknown-format.json": json.dumps(_counterexample(format="racesim-counterexample/99")),
    "missing-scenario.json": json.dumps(_counterexample(scenario=_DROP)),
    "missing-schedule.json": json.dumps(_counterexample(schedule=_DROP)),
    "missing-seed.json": json.dumps(_counterexample(seed=_DROP)),
    "seed-is-text.json": json.dumps(_counterexample(seed="0")),
    "seed-is-bool.json": json.dumps(_counterexample(seed=True)),
    "schedule-is-object.json": json.dumps(_counterexample(schedule={"a": 1})),
    "schedule-unknown-point.json": json.dumps(_counterexample(
        schedule=[{"point": "nosuch.point", "occurrence": 0, "delay": 0.1}])),
    "schedule-negative-delay.json": json.dumps(_counterexample(
        schedule=[{"point": "client.send", "occurrence": 0, "delay": -1}])),
    "schedule-text-delay.json": json.dumps(_counterexample(
        schedule=[{"point": "client.send", "occurrence": 0, "delay": "soon"}])),
    "schedule-negative-occurrence.json": json.dumps(_counterexample(
        schedule=[{"point": "client.send", "occurrence": -1, "delay": 0.1}])),
    "schedule-extra-key.json": json.dumps(_counterexample(
        schedule=[{"point": "client.send", "occurrence": 0, "delay": 0.1, "why": "?"}])),
    "bad-embedded-scenario.json": json.dumps(_counterexample(
        scenario={"name": "x", "topology": "ring", "request": [{"id": "X"}]})),
    "scenario-is-list.json": json.dumps(_counterexample(scenario=[1])),
    "unknown-policy.json": json.dumps(_counterexample(policy="nosuch")),
    "unknown-policy-module.json": json.dumps(_counterexample(policy="nosuch.module:Cls")),
    "policy-option-not-text.json": json.dumps(_counterexample(policy_options={"x": 1})),
    "unknown-policy-option.json": json.dumps(_counterexample(policy_options={"nosuch": "1"})),
    "unknown-skip.json": json.dumps(_counterexample(skip=["nosuch"])),
    "trace-hash-not-text.json": json.dumps(_counterexample(trace_hash=5)),
    # issue 28 (research/reliability.md D6, D8): a file's release fields and unknown keys
    "unknown-top-key.json": json.dumps(_counterexample(bogus=1)),
    "vllm-release-not-text.json": json.dumps(_counterexample(vllm="0.33", vllm_release=5)),
    "vllm-release-not-the-profile.json": json.dumps(_counterexample(vllm="0.33",
                                                                    vllm_release="0.20.0")),
    "vllm-not-a-profile.json": json.dumps(_counterexample(vllm="9.99")),
}


@pytest.fixture
def bad(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], str]:
    """Write every junk file into a fresh directory (also the cwd); map a file name to its path."""
    for name, content in {**SCENARIO_FILES, **COUNTEREXAMPLE_FILES}.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    (tmp_path / "valid.toml").write_text(VALID_SCENARIO, encoding="utf-8")
    (tmp_path / "a-directory").mkdir()
    monkeypatch.chdir(tmp_path)
    return lambda name: str(tmp_path / name)


def exits_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    out, err = capsys.readouterr()
    assert stop.value.code == 2, (argv, stop.value.code, out, err)
    assert "Traceback" not in out + err, err
    assert out == "", out
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), err
    return lines[0]


# -- scenario files: run, explore, matrix --------------------------------------------------------

@pytest.mark.parametrize("name", [*SCENARIO_FILES, "missing.toml", "a-directory", "nosuch"])
@pytest.mark.parametrize("command", [
    ["run", "{}"], ["run", "{}", "--json"], ["explore", "{}", "-p", "buggy", "--budget", "2"],
    ["matrix", "-s", "{}", "-p", "buggy", "--budget", "2"]], ids=["run", "run-json", "explore",
                                                                  "matrix"])
def test_bad_scenario_file(bad: Callable[[str], str], capsys: pytest.CaptureFixture[str],
                           command: list[str], name: str) -> None:
    target = name if name == "nosuch" else bad(name)
    line = exits_2_with_one_line([w.replace("{}", target) for w in command], capsys)
    assert line.startswith("racesim: error: ")


def test_scenario_errors_name_the_file_line_and_key(bad: Callable[[str], str],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    line = exits_2_with_one_line(["run", bad("wrong-type.toml")], capsys)
    assert "wrong-type.toml:2: horizon" in line and "'long'" in line
    line = exits_2_with_one_line(["run", bad("unknown-topology.toml")], capsys)
    assert "topology" in line and "'ring'" in line


# -- options: policies, points, delays, strategies, budgets -------------------------------------

RUN = ["run", "valid.toml"]
EXPLORE = ["explore", "valid.toml", "-p", "buggy", "--budget", "2", "--workers", "1"]
MATRIX = ["matrix", "-s", "valid.toml", "-p", "buggy", "--budget", "2", "--workers", "1"]

BAD_OPTIONS = {
    "unknown policy": ["-p", "nosuch"],
    "unknown policy module": ["-p", "nosuch.module:Cls"],
    "policy attribute missing": ["-p", "racesim.engine_model.policies:NoSuchPolicy"],
    "policy not a class": ["-p", "racesim.cli:main"],
    "policy not a LifecyclePolicy": ["-p", "os:path"],
    "empty policy module": ["-p", ":Cls"],
    "unknown policy option": ["--policy-opt", "nosuch=1"],
    "policy option without =": ["--policy-opt", "junk"],
    "bad policy option value": ["-p", "internal-id", "--policy-opt", "suffix_hex=zz"],
    "unknown invariant to skip": ["--skip", "nosuch"],
    "non-numeric seed": ["--seed", "abc"],
}
RUN_ONLY = {
    "negative delay": ["--delay", "frontend.abort:after_pop=-1"],
    "non-numeric delay": ["--delay", "frontend.abort:after_pop=abc"],
    "infinite delay": ["--delay", "frontend.abort:after_pop=inf"],
    "nan delay": ["--delay", "frontend.abort:after_pop=nan"],
    "delay without =": ["--delay", "frontend.abort:after_pop"],
    "unknown point": ["--delay", "nosuch.point=1"],
    "bad occurrence": ["--delay", "frontend.abort:after_pop#x=1"],
    "negative occurrence": ["--delay", "frontend.abort:after_pop#-1=1"],
}
EXPLORE_AND_MATRIX = {
    "unknown strategy": ["--strategy", "nosuch"],
    "zero budget": ["--budget", "0"],
    "negative budget": ["--budget", "-5"],
    "non-numeric budget": ["--budget", "abc"],
    "zero workers": ["--workers", "0"],
    "negative workers": ["--workers", "-1"],
    "non-numeric workers": ["--workers", "abc"],
    "absurd workers": ["--workers", "100000"],  # once started ~3,300 processes and said nothing
    "negative time limit": ["--time-limit", "-1"],
    "zero time limit": ["--time-limit", "0"],
    "non-numeric time limit": ["--time-limit", "abc"],
}
MATRIX_OPTIONS = {k: v for k, v in BAD_OPTIONS.items() if "option" not in k and "seed" not in k}


def _cases() -> list[Any]:
    cases = []
    for name, extra in {**BAD_OPTIONS, **RUN_ONLY}.items():
        cases.append(pytest.param(RUN + extra, id=f"run: {name}"))
    for name, extra in {**BAD_OPTIONS, **EXPLORE_AND_MATRIX}.items():
        cases.append(pytest.param(EXPLORE + extra, id=f"explore: {name}"))
    for name, extra in {**MATRIX_OPTIONS, **EXPLORE_AND_MATRIX}.items():
        cases.append(pytest.param(MATRIX + extra, id=f"matrix: {name}"))
    return cases


@pytest.mark.parametrize("argv", _cases())
def test_bad_option(bad: Callable[[str], str], capsys: pytest.CaptureFixture[str],
                    argv: list[str]) -> None:
    exits_2_with_one_line(argv, capsys)


# -- counterexample files: replay ----------------------------------------------------------------

@pytest.mark.parametrize("name", [*COUNTEREXAMPLE_FILES, "missing.json", "a-directory",
                                  "binary.toml"])
@pytest.mark.parametrize("extra", [[], ["--json"]], ids=["human", "json"])
def test_bad_counterexample(bad: Callable[[str], str], capsys: pytest.CaptureFixture[str],
                            name: str, extra: list[str]) -> None:
    exits_2_with_one_line(["replay", bad(name), *extra], capsys)


# -- commands and arguments ----------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["nosuch-command"], ["run"], ["replay"], ["list", "nosuch"],
                                  ["run", ""], ["run", "valid.toml", "--no-such-flag"]])
def test_bad_command_line(bad: Callable[[str], str], capsys: pytest.CaptureFixture[str],
                          argv: list[str]) -> None:
    exits_2_with_one_line(argv, capsys)


# -- the same through a real process -------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["run", "binary.toml"],
    ["run", "valid.toml", "--delay", "frontend.abort:after_pop=-1"],
    ["explore", "valid.toml", "-p", "nosuch.module:Cls"],
    ["replay", "nested-too-deep.json"],
    ["matrix", "-s", "valid.toml", "--workers", "0"],
])
def test_bad_input_in_a_real_process(bad: Callable[[str], str], argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", "from racesim.cli import main; main()", *argv],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("racesim: error: ")


# -- output paths that cannot be written, and budgets past any sane size -----------------------

_OUTPUT_PATH = "valid.toml/inside-a-file"  # unwritable for everyone: a path under a file


@pytest.mark.parametrize("argv", [
    pytest.param(["run", "valid.toml", "--html", f"{_OUTPUT_PATH}.html"],
                 id="run --html unwritable"),
    pytest.param(["run", "valid.toml", "--trace", f"{_OUTPUT_PATH}.json"],
                 id="run --trace unwritable"),
    pytest.param(["explore", "abort-reuse", "-p", "buggy", "--budget", "3", "--workers", "1",
                  "--out", _OUTPUT_PATH], id="explore --out unwritable"),
    pytest.param(["explore", "valid.toml", "-p", "buggy", "--budget", "2", "--workers", "1",
                  "--html", f"{_OUTPUT_PATH}.html"],
                 id="explore --html unwritable"),
    pytest.param(["matrix", "-s", "valid.toml", "-p", "buggy", "--budget", "2", "--workers", "1",
                  "--html", f"{_OUTPUT_PATH}.html"],
                 id="matrix --html unwritable"),
    pytest.param(["explore", "valid.toml", "-p", "buggy", "--budget", str(10**23),
                  "--time-limit", "0.2", "--workers", "1"],
                 id="explore --budget 1e23"),
    pytest.param(["matrix", "-s", "valid.toml", "-p", "buggy", "--budget", str(10**23),
                  "--workers", "1"], id="matrix --budget 1e23"),
])
def test_unwritable_outputs_and_huge_budgets(bad: Callable[[str], str],
                                            capsys: pytest.CaptureFixture[str],
                                            argv: list[str]) -> None:
    exits_2_with_one_line(argv, capsys)
