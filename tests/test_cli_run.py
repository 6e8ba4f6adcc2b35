"""``racesim run`` and ``racesim list`` end to end, through the installed console script.

The JSON document's contract (``run_document`` in racesim/documents/__init__.py), and bad input: exit
status 2 with exactly one line on stderr and no traceback (the README's exit-status table).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from racesim.cli import main
from racesim.engine_model import INVARIANTS, POINTS, POLICIES
from racesim.scenarios import bundled_names, load_scenario

FIXTURES = Path(__file__).parent / "fixtures"
BUNDLED = resources.files("racesim.scenarios") / "bundled" / "abort-reuse.toml"
_SCRIPT = Path(sys.executable).with_name("racesim")
_COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else \
    [sys.executable, "-c", "from racesim.cli import main; main()"]


def racesim(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(pythonpath), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run([*_COMMAND, *args], capture_output=True, text=True, env=env,
                          timeout=60, check=False)


def run_json(*args: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    proc = racesim("run", *args, "--json", **kw)
    assert proc.stderr == ""
    return proc.returncode, json.loads(proc.stdout)   # one document and nothing else


def violated(doc: dict[str, Any]) -> set[str]:
    return {v["invariant"] for v in doc["violations"]}


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("racesim: error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def racesim_in_process(capsys: pytest.CaptureFixture[str],
                       *args: str) -> subprocess.CompletedProcess[str]:
    """``racesim.cli.main`` in this process (fast), shaped like a finished subprocess."""
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    out = capsys.readouterr()
    code = exit_.value.code
    return subprocess.CompletedProcess(["racesim", *args], code if isinstance(code, int) else 1,
                                       out.out, out.err)


# -- issue 2, done when ----------------------------------------------------------------------------

def test_buggy_with_the_bug_point_delay_exits_1_with_unique_live_id() -> None:
    code, doc = run_json("abort-reuse", "--vllm", "0.8", "-p", "buggy", "--delay",
                         "frontend.abort:after_pop=0.05")
    assert code == 1
    assert "unique-live-id" in violated(doc)
    assert doc["schedule"] == [{"point": "frontend.abort:after_pop", "occurrence": 0,
                                "delay": 0.05}]


def test_abort_scope_with_the_same_delay_shows_only_metrics_exact() -> None:
    code, doc = run_json("abort-reuse", "--vllm", "0.8", "-p", "abort-scope", "--delay",
                         "frontend.abort:after_pop=0.05")
    assert code == 0, "accounting only is not a race"
    assert violated(doc) == {"metrics-exact"} and doc["verdict"] == "accounting"
    code, doc = run_json("abort-reuse", "--vllm", "0.8", "-p", "abort-scope", "--delay",
                         "frontend.abort:after_pop=0.05", "--strict")
    assert code == 1, "--strict counts it"
    code, doc = run_json("abort-reuse", "--vllm", "0.8", "-p", "abort-scope", "--delay",
                         "frontend.abort:after_pop=0.05", "--skip", "metrics-exact")
    assert (code, doc["violations"]) == (0, [])


def test_delay_for_one_occurrence_only() -> None:
    code, doc = run_json("abort-reuse", "--vllm", "0.8", "--delay",
                         "frontend.abort:after_pop#0=0.05")
    assert code == 1 and "unique-live-id" in violated(doc)
    proc = racesim("run", "abort-reuse", "--vllm", "0.8", "--delay",
                   "frontend.abort:after_pop#1=0.05", "--json")
    assert "unique-live-id" not in violated(json.loads(proc.stdout)), \
        "there is no second abort to delay"
    assert "frontend.abort:after_pop#1" in proc.stderr and "no effect" in proc.stderr


def test_witness_human_output_shows_the_violation_table_and_the_timeline() -> None:
    proc = racesim("run", "abort-reuse", "-p", "buggy", "--witness", "--vllm", "0.8")
    assert proc.returncode == 1 and proc.stderr == ""
    out = proc.stdout
    assert out.startswith("RACE ")
    assert "violations" in out and "timeline" in out
    for name in ("unique-live-id", "abort-precision", "engine-alive"):
        assert name in out
    assert "OVERWRITES requests['X']" in out            # the race, in vLLM's words
    assert "frontend.abort:after_pop#0 delayed 0.05s" in out
    assert "<-- violation" in out
    assert "racesim run abort-reuse -p buggy --vllm 0.8" in out  # the command that reproduces it
    assert "latent hazard: needs a delay at frontend.abort:after_pop" in out


def test_the_seeds_race_on_033_is_a_latent_hazard() -> None:
    """Issue 12's first "done when": the seed's race, on the newest release, needs a delay where
    vLLM 0.33 never yields; the duplicate ADD there kills the engine (scheduler assert)."""
    code, doc = run_json("abort-reuse", "-p", "buggy", "--witness", "--vllm", "0.33")
    assert code == 1 and doc["vllm"] == "0.33" and doc["reach"] == "latent"
    assert {"engine-alive", "no-crosstalk"} <= violated(doc)
    for v in doc["violations"]:
        assert v["reach"] == "latent" and v["needs"] == ["frontend.abort:after_pop"]


def test_a_clean_run_exits_0() -> None:
    code, doc = run_json("abort-reuse", "--vllm", "0.8", "-p", "engine-final", "--witness")
    assert (code, doc["violations"]) == (0, [])


# -- JSON document ---------------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", ["multi-frontend", "abort-storm"])
def test_json_document_has_the_design_fields_and_requests_in_scenario_order(
        scenario: str) -> None:
    code, doc = run_json(scenario, "-p", "buggy", "--witness", "--seed", "3")
    assert {"scenario", "policy", "seed", "trace_hash", "events", "sim_time", "schedule",
            "violations", "requests"} <= set(doc)
    assert (doc["scenario"], doc["policy"], doc["seed"]) == (scenario, "buggy", 3)
    assert len(doc["trace_hash"]) == 64 and int(doc["trace_hash"], 16) >= 0
    assert doc["events"] > 0 and doc["sim_time"] > 0
    for d in doc["schedule"]:
        assert set(d) == {"point", "occurrence", "delay"} and d["point"] in POINTS
    assert doc["vllm"] == "0.33"  # the default profile
    for v in doc["violations"]:
        assert {"invariant", "time", "request", "detail", "reach", "needs"} <= set(v)
        assert v["invariant"] in INVARIANTS
        assert v["reach"] in ("live", "latent")
        assert (v["reach"] == "latent") == bool(v["needs"])
    specs = load_scenario(scenario).workload.requests
    assert [(r["id"], r["frontend"]) for r in doc["requests"]] == \
        [(s.id, s.frontend) for s in specs]
    for r in doc["requests"]:
        assert set(r) >= {"id", "frontend", "tokens", "finish_reason"}
        assert r["finish_reason"] in ("stop", "length", "abort", "error", "rejected",
                                      "stream_finished", None)
    assert code == (1 if doc["violations"] else 0)


def test_list_shows_every_scenario_policy_point_and_invariant() -> None:
    proc = racesim("list")
    assert proc.returncode == 0 and proc.stderr == ""
    for name in (*bundled_names(), *POLICIES, *POINTS.names(), *INVARIANTS):
        assert name in proc.stdout, name
    as_json = json.loads(racesim("list", "--json").stdout)
    assert [x["name"] for x in as_json["scenarios"]] == list(bundled_names())
    assert [x["name"] for x in as_json["policies"]] == list(POLICIES)
    assert [x["name"] for x in as_json["points"]] == list(POINTS.names())
    assert [x["name"] for x in as_json["invariants"]] == list(INVARIANTS)
    assert all(x["meaning"] for section in as_json.values() for x in section)


def test_list_indexes_each_scenario_by_its_first_sentence() -> None:
    from racesim.cli.listing import _first_sentence

    assert _first_sentence("X dies on 0.33 (e.g. v1/a.py:1). Then more. And more.") == \
        "X dies on 0.33 (e.g. v1/a.py:1)."
    assert _first_sentence("no end") == "no end"
    text = racesim("list", "scenarios").stdout
    whole = json.loads(racesim("list", "scenarios", "--json").stdout)["scenarios"]
    for s in whole:
        assert " ".join(_first_sentence(s["meaning"]).split()) in " ".join(text.split())
    assert len(text) < sum(len(s["meaning"]) for s in whole)


def test_list_alone_is_a_short_overview_that_points_to_each_section() -> None:
    from racesim.documents.catalogue import SECTIONS

    out = racesim("list").stdout
    assert len(out.splitlines()) < 60, out
    for section in SECTIONS:
        assert f"racesim list {section}" in out, section
    # the names only: what each is, is in its section
    assert load_scenario("abort-reuse").summary[:60] not in out
    assert load_scenario("abort-reuse").summary[:60] in racesim("list", "scenarios").stdout


def _piped(*args: str, columns: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["NO_COLOR"] = "1"
    if columns is not None:
        env["COLUMNS"] = columns
    proc = subprocess.run([*_COMMAND, *args], capture_output=True, text=True, env=env,
                          timeout=60, check=False, stdin=subprocess.DEVNULL)
    return proc.stdout


def test_piped_output_is_not_wrapped_unless_columns_says_so() -> None:
    lines = _piped("list", "points").splitlines()
    rows = [ln for ln in lines if ln.startswith("  ")]
    assert len(rows) == len(POINTS.names()) and max(map(len, rows)) > 100
    run = _piped("run", "abort-reuse", "-p", "buggy", "--witness")
    died = [ln for ln in run.splitlines() if "engine died:" in ln]
    assert died and all(ln.startswith("│") and "(EngineDeadError for every request on it)" in ln
                        for ln in died[:1]), run
    # COLUMNS sets a width: wrapped there, a wrapped meaning indented under itself
    versions = _piped("list", "versions", columns="70").splitlines()
    assert all(len(ln) <= 70 for ln in versions)
    assert all(ln.startswith(" ") for ln in versions[1:]), versions[:5]


def test_a_third_party_policy_runs_from_the_command_line() -> None:
    spec = "racesim_thirdparty_policy:SendThenDrop"
    code, doc = run_json("abort-reuse", "--vllm", "0.8", "-p", spec, "--policy-opt", "note=x",
                         "--witness", pythonpath=FIXTURES)
    assert violated(doc) == {"metrics-exact"} and code == 0
    assert doc["policy"] == spec
    assert_one_line_error(racesim("run", "abort-reuse", "-p", spec, "--policy-opt", "note=bad",
                                  pythonpath=FIXTURES), "note must not be 'bad'")


# -- bad input -------------------------------------------------------------------------------------

def _variant(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = BUNDLED.read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / f"{name}.toml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


@pytest.mark.parametrize(("name", "old", "new", "needles"), [
    ("bad-toml", "[[request]]", "[[request]", ("invalid TOML",)),
    ("unknown-key", "horizon = 30.0", "horizon = 30.0\nbogus = 1", ("bogus", "unknown")),
    ("wrong-type", "prompt_tokens = 32", 'prompt_tokens = "32"', ("prompt_tokens", "integer")),
    ("negative-time", "at = 0.13", "at = -0.13", ("at", ">= 0", "-0.13")),
])
def test_malformed_scenarios_exit_2_with_one_line(tmp_path: Path, name: str, old: str, new: str,
                                                  needles: tuple[str, ...]) -> None:
    path = _variant(tmp_path, name, old, new)
    assert_one_line_error(racesim("run", str(path)), path.name, *needles)


@pytest.mark.parametrize(("args", "needles"), [
    (("-p", "no-such-policy"), ("unknown policy 'no-such-policy'",)),
    (("-p", "no_such_module:Cls"), ("cannot import module 'no_such_module'",)),
    (("--delay", "frontend.abort:no_such_point=0.05"), ("unknown await point",)),
    (("--delay", "frontend.abort:after_pop=-0.05"), (">= 0",)),
    (("--delay", "frontend.abort:after_pop=soon"), ("number of seconds",)),
    (("--delay", "frontend.abort:after_pop"), ("POINT=SECONDS",)),
    (("--skip", "no-such-invariant"), ("unknown invariant 'no-such-invariant'",)),
    (("-p", "internal-id", "--policy-opt", "suffix_hex=zz"), ("suffix_hex",)),
    (("--policy-opt", "nokeyvalue"), ("KEY=VALUE",)),
])
def test_bad_options_exit_2_with_one_line(capsys: pytest.CaptureFixture[str],
                                         args: tuple[str, ...], needles: tuple[str, ...]) -> None:
    assert_one_line_error(racesim_in_process(capsys, "run", "abort-reuse", *args), *needles)


def test_bad_option_through_the_console_script_has_no_traceback() -> None:
    assert_one_line_error(racesim("run", "abort-reuse", "--delay", "frontend.abort:x=1"),
                          "unknown await point 'frontend.abort:x'")


def test_unknown_scenario_exits_2_with_one_line() -> None:
    assert_one_line_error(racesim("run", "no-such-scenario"), "no-such-scenario")


def test_the_console_script_is_installed() -> None:
    assert _SCRIPT.exists() or shutil.which("racesim"), "pip install -e '.[test]' first"
