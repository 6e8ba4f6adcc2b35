"""HTML race reports and the Perfetto trace: content, bounds, escaping and determinism."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from markupsafe import escape

from racesim.cli import cli
from racesim.engine_model import INVARIANTS, RunResult
from racesim.reports import (
    chrome_trace,
    render_explore_report,
    render_matrix_report,
    render_run_report,
    write_chrome_trace,
    write_explore_report,
    write_matrix_report,
    write_run_report,
)
from racesim.reports.model import TraceModel, topology_of
from racesim.runner import run_command, run_scenario
from racesim.scenarios import Scenario, load_scenario, scenario_from_dict

SCRIPT_ID = "<script>alert(1)</script>"
IMG_ID = '"><img src=x onerror=alert(2)>'


def _run(scenario: Scenario, **kw: Any) -> tuple[RunResult, str]:
    result = run_scenario(scenario, "buggy", witness=True, **kw)
    return result, run_command(scenario.name, "buggy", {}, result.seed, result.schedule)


@pytest.fixture(scope="module")
def abort_reuse() -> tuple[Scenario, RunResult, str, str]:
    scen = load_scenario("abort-reuse").with_vllm("0.8")
    result, command = _run(scen)
    return scen, result, command, render_run_report(scen, "buggy", {}, result, command)


def _big_storm() -> Scenario:
    """abort-storm plus long background requests: about 5,000 events, same races."""
    data = load_scenario("abort-storm").with_vllm("0.8").to_dict()
    data["request"] += [{"id": f"bg{i}", "at": 0.001 * i, "prompt_tokens": 16, "max_tokens": 90}
                        for i in range(36)]
    return scenario_from_dict(data)


def _hostile() -> Scenario:
    data = load_scenario("abort-reuse").with_vllm("0.8").to_dict()
    data["name"] = "hostile"
    data["request"][0]["id"] = SCRIPT_ID
    data["request"][1]["id"] = IMG_ID
    return scenario_from_dict(data)


def _assert_self_contained(html: str) -> None:
    assert html.startswith("<!DOCTYPE html>")
    assert ('<meta http-equiv="Content-Security-Policy" content="default-src &#39;none&#39;; '
            'style-src &#39;unsafe-inline&#39;; img-src data:">') in html
    assert "<script" not in html.lower()
    assert "<img" not in html.lower()
    assert "<link" not in html.lower()
    assert "@import" not in html and "url(http" not in html
    # the only absolute URL is the SVG namespace
    assert set(re.findall(r"https?://[^\s\"'<>)]+", html)) <= {"http://www.w3.org/2000/svg"}


# -- the run report ---------------------------------------------------------------------------

def test_run_report_verdict_lanes_violation_schedule_and_command(abort_reuse: Any) -> None:
    _scen, result, command, html = abort_reuse
    _assert_self_contained(html)
    assert "LATENT HAZARD" in html and "abort-reuse" in html and "buggy" in html
    assert "latent hazard: needs a delay at frontend.abort:after_pop" in html and "0.8" in html
    assert result.trace_hash in html and f"seed <span class=\"mono\">{result.seed}<" in html
    for name in result.violated:
        assert f'<span class="chip inv" title="{escape(INVARIANTS[name])}">{name}</span>' in html
    # one lane per component group, under its group header
    for lane in ("client0", "client1", "frontend0", "input thread", "busy loop",
                 "scheduler", "KV cache", "runner", "EngineCore", "API server"):
        assert f">{lane}</text>" in html, lane
    # a lane nothing is drawn in is dropped (messages start in their sender's lane)
    assert ">sockets</text>" not in html and ">IPC / sockets</text>" in html
    # every violating event is marked in the diagram (red ring and a labelled row)
    assert html.count('stroke="#d62728" stroke-width="2.6"') >= len(
        {v.event for v in result.violations if v.event >= 0})
    assert "✖ no-crosstalk · </tspan>" in html
    assert "race window" in html
    # the violations table carries the state that broke
    model = TraceModel(result.trace, topology_of(result))
    for v in result.violations:  # incarnations in the reader's numbers
        assert str(escape(model.relabel(v.detail))) in html
    # the schedule and the one command that replays it
    assert "frontend.abort:after_pop" in html and "#0</td>" in html
    assert f'<pre class="cmd">{escape(command)}</pre>' in html
    # messages are arrows; incarnations are told apart
    assert html.count("<line") >= 10
    assert "X #1" in html and "X #2" in html, "incarnations numbered 1, 2... as they appear"
    numbers = sorted(inc.number for inc in model.incarnations.values())
    assert numbers == list(range(1, len(numbers) + 1))
    # the full event log, folded away
    assert "<details>" in html and "Full event log (119 events" in html


def test_the_terminal_numbers_incarnations_as_the_report_does(abort_reuse: Any) -> None:
    from rich.console import Console

    from racesim.cli.render import print_run

    _scen, result, command, html = abort_reuse
    console = Console(record=True, width=400)
    print_run(console, "abort-reuse", result, command)
    text = console.export_text()
    model = TraceModel(result.trace, topology_of(result))
    numbers = {c.inc: c.number for c in model.incarnations.values()}
    assert any(inc != n for inc, n in numbers.items()), "the model's numbers are not 1, 2, 3"
    for v in result.violations:
        assert model.relabel(v.detail) in text and str(escape(model.relabel(v.detail))) in html
    said = {int(n) for n in re.findall(r"\binc (\d+)", text)}
    assert said and said <= set(numbers.values())


def test_run_report_shades_the_race_from_the_delay_to_the_first_violation(
        abort_reuse: Any) -> None:
    _scen, result, _command, html = abort_reuse
    delay = next(e for e in result.trace if e.kind == "delay")
    first = min(v.event for v in result.violations if v.event >= 0)
    assert f'Race window opens at <b><a href="#d1-e{delay.seq}">#{delay.seq}</a></b>' in html
    assert f'First violation at <b><a href="#d1-e{first}">#{first}</a></b>' in html
    # the shaded rectangle is drawn once per page that shows the race
    assert html.count('fill="#f4a52a" fill-opacity="0.13"') == 1


def test_write_run_report_is_atomic_and_deterministic(abort_reuse: Any, tmp_path: Path) -> None:
    scen, result, command, html = abort_reuse
    out = write_run_report(tmp_path / "sub" / "r.html", scen, "buggy", {}, result, command)
    assert out.read_text(encoding="utf-8") == html
    assert [p.name for p in out.parent.iterdir()] == ["r.html"]  # no temp file left behind
    again = render_run_report(scen, "buggy", {}, run_scenario(scen, "buggy", witness=True),
                              command)
    assert again == html


def test_clean_run_report_says_so() -> None:
    scen = load_scenario("abort-reuse").with_vllm("0.8")
    result = run_scenario(scen, "engine-final")
    html = render_run_report(scen, "engine-final", {}, result,
                             "racesim run abort-reuse -p engine-final")
    _assert_self_contained(html)
    assert "NO VIOLATION" in html and "every invariant held" in html
    assert "race window" not in html


@pytest.mark.parametrize("make", [lambda: load_scenario("abort-storm").with_vllm("0.8"),
                                  _big_storm],
                         ids=["abort-storm", "abort-storm-5k"])
def test_big_run_report_stays_bounded(make: Any) -> None:
    scen = make()
    result, command = _run(scen)
    html = render_run_report(scen, "buggy", {}, result, command)
    _assert_self_contained(html)
    if make is _big_storm:
        assert result.events >= 4500
    svgs = re.findall(r"<svg.*?</svg>", html, flags=re.S)
    assert svgs
    for svg in svgs:
        assert svg.count("<line") <= 250  # arrows and lane lines, never one per event
        assert svg.count("<text") <= 800
    rows = re.findall(r"<text x=\"22\" y=\"[\d.]+\" font-size=\"11\" fill=\"#667\" "
                      r"font-family=[^>]*>#(\d+)</text>", html)
    assert 10 <= len(rows) <= 4 * 80  # event rows: at most the budget per page
    assert "events folded" in html or "folded (t=" in html
    assert len(html.encode()) < 1_200_000
    # every violating event that got a row is marked
    assert "✖ unique-live-id" in html


def test_hostile_request_ids_render_as_text(tmp_path: Path) -> None:
    scen = _hostile()
    result, command = _run(scen)
    assert {r.id for r in result.requests} == {SCRIPT_ID, IMG_ID}
    html = render_run_report(scen, "buggy", {}, result, command)
    _assert_self_contained(html)
    assert "alert(1)" in html and "alert(2)" in html  # the IDs are there ...
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # ... as text
    assert "&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in html
    assert "onerror=alert(2)>" not in html
    trace = json.loads(json.dumps(chrome_trace(result)))
    names = {e.get("name") for e in trace["traceEvents"]}
    assert f"{SCRIPT_ID} #3" in names


# -- the Chrome trace -------------------------------------------------------------------------

def test_chrome_trace_is_valid_trace_event_json(abort_reuse: Any, tmp_path: Path) -> None:
    _scen, result, _command, _html = abort_reuse
    path = write_chrome_trace(tmp_path / "t.json", result)
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["displayTimeUnit"] == "ms"
    events = doc["traceEvents"]
    phases = Counter(e["ph"] for e in events)
    assert {"M", "X", "b", "e", "s", "f", "i"} <= set(phases)
    for e in events:
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and e["name"]
        if e["ph"] != "M":
            assert isinstance(e["ts"], int) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 1
    meta = {(e["name"], e["args"].get("name")) for e in events if e["ph"] == "M"}
    assert ("process_name", "EngineCore") in meta and ("thread_name", "scheduler") in meta
    assert ("thread_name", "runner") in meta and ("thread_name", "frontend0") in meta
    # one request span per incarnation, engine steps, one flow per message
    assert phases["b"] == phases["e"] == 2
    steps = [e for e in events if e["ph"] == "X" and e.get("cat") == "step"]
    assert len(steps) == sum(1 for e in result.trace if e.kind == "sched.step")
    messages = sum(1 for e in result.trace if e.kind == "ipc.send")
    assert phases["s"] == phases["f"] == messages
    assert ({e["id"] for e in events if e["ph"] == "s"}
            == {e["id"] for e in events if e["ph"] == "f"})
    violations = [e for e in events if e["ph"] == "i" and e.get("cat") == "violation"]
    assert len(violations) == len(result.violations)
    assert any(e["ph"] == "i" and e["name"] == "ENGINE DEAD" for e in events)


@pytest.mark.parametrize("name", ["async-sched-reuse", "pd-reuse", "abort-storm"])
def test_chrome_trace_slices_nest_and_flows_go_forward(name: str) -> None:
    """Perfetto drops ``X`` slices that overlap without nesting on one thread; async steps
    (two in flight) and many clients must get tracks of their own."""
    result = run_scenario(load_scenario(name).with_vllm("0.8"), "buggy", witness=True)
    events = chrome_trace(result)["traceEvents"]
    by_thread: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for e in events:
        if e["ph"] == "X":
            by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        stack: list[tuple[int, int]] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1][1], (stack[-1], (start, end))
            stack.append((start, end))
    starts = {e["id"]: e["ts"] for e in events if e["ph"] == "s"}
    assert all(e["ts"] >= starts[e["id"]] for e in events if e["ph"] == "f")
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in events if e["ph"] != "M"} <= named


def test_chrome_trace_is_byte_deterministic(tmp_path: Path) -> None:
    scen = load_scenario("pd-reuse").with_vllm("0.8")
    a = write_chrome_trace(tmp_path / "a.json", run_scenario(scen, "buggy", witness=True))
    b = write_chrome_trace(tmp_path / "b.json", run_scenario(scen, "buggy", witness=True))
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes().isascii()


def test_cli_run_writes_html_and_trace(tmp_path: Path) -> None:
    html, trace = tmp_path / "r.html", tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["run", "abort-reuse", "-p", "buggy", "--witness",
                                   "--html", str(html), "--trace", str(trace)])
    assert res.exit_code == 1, res.output  # a violation
    assert "<svg" in html.read_text(encoding="utf-8")
    assert json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]


# -- explore and matrix reports ---------------------------------------------------------------

def _explore_doc(cx_path: str | None) -> dict[str, Any]:
    return {
        "scenario": "abort-reuse", "policy": "buggy", "policy_options": {},
        "strategy": "random", "runs": 200, "violating_runs": 37, "first_violation_run": 4,
        "elapsed_s": 1.25, "distinct_traces": 151,
        "coverage": {"frontend.abort:after_pop": 120, "ipc.input:transit": 80},
        "confidence": {"rule_of_three": None, "pct_bound": 0.0625, "observed_rate": 0.185},
        "pct": {"n": 400, "k": 40, "d": 2, "bound": 0.0625},
        "counterexample": None if cx_path is None else {
            "seed": 7, "schedule": [{"point": "frontend.abort:after_pop", "occurrence": 0,
                                     "delay": 0.05}],
            "violations": [{"invariant": "no-crosstalk", "request": "X", "detail": "d1"}],
            "trace_hash": "ab" * 32, "shrunk_from": 3, "path": cx_path},
    }


def test_explore_report_shows_both_swimlanes_coverage_and_confidence(tmp_path: Path) -> None:
    scen = load_scenario("abort-reuse").with_vllm("0.8")
    before = run_scenario(scen, "buggy", witness=True,
                          delays=[("ipc.input:transit", 0, 0.002),
                                  ("client.send", 1, 0.001)])
    after = run_scenario(scen, "buggy", witness=True)
    doc = _explore_doc("out/cx <1>.json")
    html = render_explore_report(doc, scen, before, after)
    _assert_self_contained(html)
    assert "COUNTEREXAMPLE" in html and "explore abort-reuse" in html
    assert "before shrinking" in html and "after shrinking" in html
    assert html.count("<svg") == 2
    assert "frontend.abort:after_pop" in html and "120" in html and "60 %" in html
    assert "0.0625" in html and "observed_rate" in html
    assert "racesim replay &#39;out/cx &lt;1&gt;.json&#39;" in html
    assert "from 3 to 1 non-default delays" in html
    path = write_explore_report(tmp_path / "e.html", doc, scen, before, after)
    assert path.read_text(encoding="utf-8") == html


def test_explore_report_without_counterexample() -> None:
    html = render_explore_report(_explore_doc(None), None, None, None)
    _assert_self_contained(html)
    assert "NONE FOUND" in html and "<svg" not in html


def test_matrix_report_links_failing_cells(tmp_path: Path) -> None:
    doc = {
        "scenarios": ["abort-reuse", "pd-reuse", "<b>x</b>", "gap"],
        "policies": ["buggy", "fixed"],
        "cells": [
            {"scenario": "abort-reuse", "policy": "buggy", "runs": 50, "violating_runs": 12,
             "invariants": ["no-crosstalk", "unique-live-id"],
             "counterexample": {"path": "cx/abort-reuse-buggy.json"}},
            {"scenario": "abort-reuse", "policy": "fixed", "runs": 50, "violating_runs": 0,
             "invariants": [], "counterexample": None},
            {"scenario": "pd-reuse", "policy": "buggy", "runs": 50, "violating_runs": 3,
             "invariants": ["kv-ownership"], "counterexample": {"path": "cx/pd.json"}},
            {"scenario": "<b>x</b>", "policy": "buggy", "runs": 5, "violating_runs": 1,
             "invariants": ["no-hang"], "counterexample": {"path": "cx/x.json"}},
            {"scenario": "gap", "policy": "fixed", "runs": 50, "violating_runs": 50,
             "invariants": ["metrics-exact"], "counterexample": {"path": "cx/gap.json"}},
        ],
    }
    links = {("abort-reuse", "buggy"): "runs/abort-reuse buggy.html",
             ("pd-reuse", "buggy"): "javascript:alert(3)",
             ("<b>x</b>", "buggy"): "runs/x.html?a=1&b=2"}
    html = render_matrix_report(doc, links)
    _assert_self_contained(html)
    assert '<a href="runs/abort-reuse buggy.html">✖ 12 / 50 runs</a>' in html
    assert "javascript:" not in html  # a link with a scheme is dropped, the cell still fails
    assert "✖ 3 / 50 runs" in html
    assert 'href="runs/x.html?a=1&amp;b=2"' in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html
    assert "✔ 0 / 50 runs" in html and "not run" in html  # pd-reuse under fixed is missing
    assert "3 / 5 RACE" in html  # the metrics-exact-only cell is the standing gap, no race
    assert html.count('<td class="gap">') == 1 and html.count('<td class="fail">') == 3
    path = write_matrix_report(tmp_path / "m.html", doc, links)
    assert path.read_text(encoding="utf-8") == html


def test_pd_report_has_proxy_prefill_and_decode_lanes() -> None:
    scen = load_scenario("pd-reuse").with_vllm("0.8")
    result, command = _run(scen)
    html = render_run_report(scen, "buggy", {}, result, command)
    for lane in ("P.frontend0", "D.frontend0", "prefill engine", "decode engine",
                 "busy loop", "sched + KV", "connector"):
        assert f">{lane}</text>" in html, lane
    assert "KV done X" in html  # the NIXL notice is an arrow too
    assert "✖ unique-live-id" in html and "✖ kv-ownership" in html


def test_race_without_delays_opens_at_the_violating_incarnation() -> None:
    scen = load_scenario("multi-frontend").with_vllm("0.8")
    result = run_scenario(scen, "buggy")
    assert not result.schedule and result.violations
    html = render_run_report(scen, "buggy", {}, result, "racesim run multi-frontend -p buggy")
    second = next(e for e in result.trace if e.kind == "client.send" and e.component == "client2")
    assert f'Race window opens at <b><a href="#d1-e{second.seq}">#{second.seq}</a></b>' in html
    assert "race window" in html


def test_run_without_a_retained_trace_still_reports() -> None:
    scen = load_scenario("abort-reuse").with_vllm("0.8")
    result = run_scenario(scen, "buggy", witness=True, retain_trace=False)
    html = render_run_report(scen, "buggy", {}, result, "racesim run abort-reuse",
                             title="custom <title>")
    _assert_self_contained(html)
    assert "<title>custom &lt;title&gt;</title>" in html
    assert "did not retain its trace" in html and "no-crosstalk" in html
    assert chrome_trace(result)["traceEvents"] == [
        e for e in chrome_trace(result)["traceEvents"] if e["ph"] in ("M", "i")]
