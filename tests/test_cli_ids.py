"""Issue 28 item 1: the request-ID scheme is an axis of its own (``--ids given|release``),
beside the policy (the abort ordering); ``shipped`` is each release as shipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _cli import cli, one_line_error
from racesim.documents import read_counterexample
from racesim.engine_model.policies import (
    POLICIES,
    LifecyclePolicy,
    id_scheme,
    release_assigns_ids,
)
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario


def test_the_releases_that_assign_internal_ids_by_default() -> None:
    # 0.33 input_processor.py:354-371, 0.20 :215-232, 0.14 :434-444; none before 0.14
    assert [v for v in ("0.8", "0.9", "0.10", "0.11", "0.14", "0.20", "0.33")
            if release_assigns_ids(v)] == ["0.14", "0.20", "0.33"]


def test_each_policy_has_a_default_id_scheme() -> None:
    assert {n: id_scheme(c, None) for n, c in POLICIES.items()} == {
        "shipped": "release", "buggy": "given", "abort-scope": "given",
        "engine-final": "given", "internal-id": "own"}

    class Mine(LifecyclePolicy):  # a user's change: the release's IDs unless told otherwise
        name = "mine"

    assert id_scheme(Mine, None) == "release" and id_scheme(Mine, "given") == "given"
    assert id_scheme(Mine, "legacy") == "given"  # a file written before the axis


def test_shipped_is_internal_id_on_033_and_buggy_on_08() -> None:
    scen = load_scenario("abort-reuse")
    shipped = run_scenario(scen, "shipped", witness=True)
    assert shipped.trace_hash == run_scenario(scen, "internal-id", witness=True).trace_hash
    assert shipped.trace_hash == run_scenario(scen, "buggy", ids="release",
                                              witness=True).trace_hash
    assert run_scenario(scen, "shipped", ids="given", witness=True).trace_hash == \
        run_scenario(scen, "buggy", witness=True).trace_hash
    old = scen.with_vllm("0.8")  # no internal IDs before 0.14: as given
    assert run_scenario(old, "shipped", witness=True).trace_hash == \
        run_scenario(old, "buggy", witness=True).trace_hash


def test_the_fix_runs_on_the_releases_own_ids(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = cli(capsys, "run", "abort-reuse", "-p", "abort-scope", "--ids", "release",
                          "--witness", "--json")
    doc = json.loads(out)
    assert doc["ids"] == "release" and doc["verdict"] == "accounting" and code == 0
    code, out, _err = cli(capsys, "run", "abort-reuse", "-p", "abort-scope", "--witness",
                          "--json")
    assert json.loads(out)["ids"] == "given" and code == 1


def test_ids_is_refused_for_a_policy_with_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = cli(capsys, "run", "abort-reuse", "-p", "internal-id", "--ids", "given")
    one_line_error(code, err, "internal-id", "--ids", "shipped")


def test_counterexample_files_record_the_scheme_and_old_ones_replay(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = cli(capsys, "explore", "abort-reuse", "-p", "shipped", "--ids", "given",
                          "--budget", "30", "--workers", "1", "--out", str(tmp_path), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ids"] == "given"  # IDs as given: abort-reuse races
    path = Path(doc["counterexample"]["path"])
    assert "ids-given" in path.name  # not shipped's default: the name says so
    assert read_counterexample(str(path)).ids == "given"
    data = json.loads(path.read_text())
    assert data["ids"] == "given"
    del data["ids"]  # a file from before the axis: the policy's own assign_request_id
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert read_counterexample(str(old)).ids == "legacy"
    code, out, _err = cli(capsys, "replay", str(old), "--json")
    assert json.loads(out)["trace_hash"] == data["trace_hash"]
