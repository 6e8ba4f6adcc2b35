"""``racesim conform``'s comparison logic, with the model on both sides and a perturbed second
side (so a disagreement really is found); the runs on vLLM's own code are in
``tests/test_conform_vllm.py``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import racesim.conform as conform_module
from racesim.cli import cli
from racesim.conform import conform, lifecycle
from racesim.conform.known import KNOWN, KnownMismatch, explain, markdown_table
from racesim.conform.outcome import differences, outcome_of
from racesim.documents import read_counterexample
from racesim.engine_model import RunResult
from racesim.runner import run_scenario
from racesim.scenarios import load_scenario

CONFORM_DOC = Path(__file__).parents[1] / "docs" / "conform.md"


def _model_twice(monkeypatch: pytest.MonkeyPatch, perturb: Any = None) -> None:
    """Both sides on the model; the "vllm" side passed through ``perturb`` (a RunResult ->
    RunResult function), and no vLLM needed for the checks that would refuse it."""
    real = conform_module.run_scenario

    def run_on(engine: str, scenario: Any, policy: str, **kwargs: Any) -> RunResult:
        r = real(scenario, policy, **kwargs)
        r = dataclasses.replace(r, engine=engine)
        return perturb(r) if perturb is not None and engine == "vllm" else r

    monkeypatch.setattr(conform_module, "run_on", run_on)
    monkeypatch.setattr(conform_module, "check_backend", lambda scenario: None)
    monkeypatch.setattr(conform_module, "model_only", lambda *a: None)


def _no_eos(r: RunResult) -> RunResult:
    """A second backend that never ends a request on EOS: what a token-level divergence in the
    real scheduler would look like from outside."""
    requests = tuple(dataclasses.replace(q, finish_reason="length")
                     if q.finish_reason == "stop" else q for q in r.requests)
    return dataclasses.replace(r, requests=requests)


# -- outcomes -----------------------------------------------------------------------------------

def test_an_outcome_names_whose_tokens_a_client_received() -> None:
    """return-path-crosstalk with equal IDs: the old X's last token reaches the new X's client."""
    r = run_scenario(load_scenario("return-path-crosstalk"), "buggy")
    o = outcome_of(r)
    assert [q.finish_reason for q in o.requests] == ["abort", "length"]
    first, second = o.requests
    assert {s[1] for s in first.received} == {0}
    assert second.received[0][1] == 0 and second.received[-1][1] == 1  # client0's token first
    assert sum(s[3] for s in second.received) == second.tokens
    assert ("no-crosstalk", "live") in o.invariants


def test_equal_runs_have_no_differences_and_each_kind_of_difference_is_named() -> None:
    scen = load_scenario("duplicate-in-flight")
    a = outcome_of(run_scenario(scen, "buggy"))
    assert differences(a, outcome_of(run_scenario(scen, "buggy"))) == []
    assert a.dead_engines and a.dead_engines[0][0] == "engine"  # the duplicate-id assert
    b = outcome_of(run_scenario(scen, "internal-id"))  # unique IDs: nobody dies
    keys = {d.split(" ", 1)[0] for d in differences(a, b)}
    assert "engine-death:engine" in keys and "invariant:engine-alive" in keys
    assert any(k.startswith("finish_reason:client") for k in keys)


def test_an_outcome_needs_the_trace() -> None:
    r = run_scenario(load_scenario("abort-reuse"), "buggy", retain_trace=False)
    with pytest.raises(ValueError, match="trace"):
        outcome_of(r)


# -- conform ------------------------------------------------------------------------------------

def test_the_model_agrees_with_itself_on_every_bundled_scenario(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _model_twice(monkeypatch)
    scens = [load_scenario(n) for n in ("abort-reuse", "eager-abort-reuse", "abort-storm")]
    res = conform(scens, [lifecycle("0.33")], budget=15, workers=1)
    assert res.runs == 45 and res.agreeing_runs == 45 and res.mismatches == []
    assert [c["runs"] for c in res.cells] == [15, 15, 15]


def test_a_perturbed_side_is_a_mismatch_saved_as_a_replayable_file(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _model_twice(monkeypatch, _no_eos)
    scen = load_scenario("abort-storm")  # some of its clients end on EOS
    res = conform([scen], [("internal-id", {})], budget=6, workers=1, out_dir=tmp_path,
                  known=lambda *a, **k: None)
    assert res.runs == 6 and res.agreeing_runs == 0 and len(res.unlisted) == 6
    m = res.mismatches[0]
    assert m.run == 0 and m.schedule == ()  # the baseline already differs
    assert all(d.startswith("finish_reason:client") for d in m.differences)
    doc = res.document()["mismatches"][0]
    assert set(doc) >= {"scenario", "seed", "schedule", "model", "vllm", "path"}
    assert doc["model"]["engine"] == "model" and doc["vllm"]["engine"] == "vllm"
    cx = read_counterexample(doc["path"])
    assert cx.engine == "vllm" and cx.policy == "internal-id"
    assert cx.found_by["by"] == "conform" and cx.found_by["differences"] == list(m.differences)
    again = run_scenario(cx.scenario, cx.policy, options=cx.options, seed=cx.seed,
                         schedule=cx.schedule, skip=cx.skip)
    assert again.trace_hash == cx.trace_hash  # the model side replays it exactly


def test_a_schedule_drawn_on_the_model_is_replayed_exactly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, Any]] = []
    real = conform_module.run_scenario

    def run_on(engine: str, scenario: Any, policy: str, **kwargs: Any) -> RunResult:
        r = real(scenario, policy, **kwargs)
        seen.append((engine, kwargs.get("schedule")))
        if engine == "model" and kwargs.get("decider") is not None:
            seen.append(("drawn", r.schedule))
        return r

    monkeypatch.setattr(conform_module, "run_on", run_on)
    monkeypatch.setattr(conform_module, "check_backend", lambda scenario: None)
    monkeypatch.setattr(conform_module, "model_only", lambda *a: None)
    conform([load_scenario("abort-reuse")], [("buggy", {})], budget=5, workers=1)
    drawn = [s for e, s in seen if e == "drawn"]
    # the vllm side's unperturbed baseline first (whose frontend and points it has), then
    # each drawn schedule replayed exactly
    baseline, *replayed = [s for e, s in seen if e == "vllm"]
    assert baseline is None
    assert len(replayed) == 5 and replayed[1:] == drawn and any(drawn)


def test_a_listed_mismatch_is_known_and_an_entry_must_cover_every_difference() -> None:
    entry = KnownMismatch("abort-*", "*", ("finish_reason:*", "tokens:*"), "because")
    diffs = ["finish_reason:client1 (X) stop != length", "tokens:client1 (X) 3 != 4"]
    assert explain("abort-storm", "internal-id", diffs, [entry]) == "because"
    assert explain("pd-reuse", "internal-id", diffs, [entry]) is None
    assert explain("abort-storm", "buggy", [*diffs, "invariant:no-hang holds != live"],
                   [entry]) is None
    dead = KnownMismatch("*", "*", ("invariant:one-terminal-output",), "after death", True)
    after = ["invariant:one-terminal-output holds != live"]
    assert explain("abort-storm", "buggy", after, [dead]) is None
    assert explain("abort-storm", "buggy", after, [dead], engine_died=True) == "after death"


def test_a_listed_mismatch_scoped_to_releases_explains_only_their_runs() -> None:
    entry = KnownMismatch("abort-storm", "buggy", ("tokens:*",), "0.10's runner",
                          releases=("0.10", "0.11"))
    diffs = ["tokens:client1 (X) 3 != 4"]
    assert explain("abort-storm", "buggy", diffs, [entry], release="0.11") == "0.10's runner"
    assert explain("abort-storm", "buggy", diffs, [entry], release="0.33") is None
    assert "(vLLM 0.10, 0.11 only)" in markdown_table([entry])


def test_the_conform_doc_shows_the_known_mismatch_table() -> None:
    text = CONFORM_DOC.read_text(encoding="utf-8")
    block = text.split("<!-- table: known-mismatches -->\n", 1)[1].split("\n\n", 1)[0]
    assert block.strip() == markdown_table(KNOWN)


def test_a_user_file_at_a_mismatch_path_is_never_overwritten(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _model_twice(monkeypatch, _no_eos)
    mine = tmp_path / "conform__abort-storm__internal-id__random__seed0__run0.json"
    mine.write_text("my notes\n", encoding="utf-8")
    res = conform([load_scenario("abort-storm")], [("internal-id", {})], budget=1, workers=1,
                  out_dir=tmp_path, known=lambda *a, **k: None)
    assert mine.read_text(encoding="utf-8") == "my notes\n"
    assert res.mismatches[0].path == str(mine.with_name(mine.stem + "-2.json"))
    again = conform([load_scenario("abort-storm")], [("internal-id", {})], budget=1,
                    workers=1, out_dir=tmp_path, known=lambda *a, **k: None)
    assert again.mismatches[0].path == res.mismatches[0].path  # its own file is reused


def test_workers_do_not_change_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    _model_twice(monkeypatch, _no_eos)  # fork: the workers inherit the perturbed side
    scen = load_scenario("abort-storm")
    one = conform([scen], [("internal-id", {})], budget=20, workers=1, known=lambda *a, **k: None)
    two = conform([scen], [("internal-id", {})], budget=20, workers=2, known=lambda *a, **k: None)
    assert [m.document() for m in one.mismatches] == [m.document() for m in two.mismatches]


# -- the command --------------------------------------------------------------------------------

def _cli(args: list[str]) -> Any:
    return CliRunner().invoke(cli, args)


def test_conform_json_and_exit_status(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _model_twice(monkeypatch)
    html = tmp_path / "c.html"
    r = _cli(["conform", "abort-reuse", "stop-string-reuse", "--budget", "4", "--workers", "1",
              "--out", str(tmp_path), "--json", "--html", str(html)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert (doc["runs"], doc["agreeing_runs"], doc["mismatches"]) == (8, 8, [])
    assert doc["policies"] == ["internal-id"]
    assert "AGREE" in html.read_text(encoding="utf-8")

    _model_twice(monkeypatch, _no_eos)
    r = _cli(["conform", "abort-storm", "--budget", "2", "--workers", "1",
              "--out", str(tmp_path), "--html", str(html)])
    assert r.exit_code == 1, r.output
    assert "UNLISTED" in r.output and "2 unlisted mismatches" in r.output
    page = html.read_text(encoding="utf-8")
    assert "Unlisted mismatch" in page and "--engine vllm" in page and "<script" not in page

    import racesim.conform.known as known_module
    monkeypatch.setattr(known_module, "KNOWN", (KnownMismatch(
        "abort-storm", "internal-id", ("finish_reason:*",), "a test's listed cause"),))
    r = _cli(["conform", "abort-storm", "--budget", "2", "--workers", "1",
              "--out", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["mismatches"][0]["known"] == "a test's listed cause"


def _exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    from racesim.cli import main

    with pytest.raises(SystemExit) as stop:
        main(argv)
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and out == "", (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("args, message", [
    (["no-such-scenario"], "no-such-scenario"),
    (["abort-reuse", "--strategy", "hypothesis"], "hypothesis"),
    (["abort-reuse", "--budget", "0"], "budget"),
    (["abort-reuse", "--workers", "0"], "--workers"),
    (["abort-reuse", "--skip", "no-such-invariant"], "no-such-invariant"),
    (["abort-reuse", "-p", "abort-scope"], "abort-scope"),  # it changes vLLM's own code
    (["abort-reuse", "--vllm", "0.8"], "0.8"),  # a model-only profile
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    line = _exits_2(["conform", *args, "--out", str(tmp_path)], capsys)
    assert message in line
