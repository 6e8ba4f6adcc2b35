"""Reports a person reads: the terminal matrix at 80 columns keeps every scenario, policy and
invariant name whole (the invariant column wraps between names, never inside one)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from racesim.engine_model import INVARIANTS, POLICIES
from racesim.cli.render import print_matrix
from racesim.scenarios import bundled_names


def _doc() -> dict:
    scenarios = bundled_names()
    policies = list(POLICIES)
    every = list(INVARIANTS)
    cells = [{"scenario": s, "policy": p, "runs": 100, "violating_runs": 26,
              "invariants": every if i % 2 else every[:2], "label": "live race"}
             for i, (s, p) in enumerate((s, p) for s in scenarios for p in policies)]
    return {"scenarios": scenarios, "policies": policies, "cells": cells,
            "parameters": {"budget": 100}}


def test_the_terminal_matrix_reads_at_80_columns() -> None:
    out = io.StringIO()
    print_matrix(Console(file=out, width=80, force_terminal=False), _doc())
    text = out.getvalue()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    words = {w.strip("│┃,") for line in lines for w in line.split()}
    for name in [*bundled_names(), *POLICIES, *INVARIANTS]:
        assert name in words, f"{name} is cut across lines"


def test_the_whole_run_at_a_glance_zooms_to_the_activity() -> None:
    """pd-kv-load-failure's events end by 0.06 s; the run goes on to its 30 s horizon."""
    from racesim.reports.html import render_run_report
    from racesim.reports.model import TraceModel
    from racesim.reports.overview import _LEFT, _PLOT_W, build_overview
    from racesim.runner import run_scenario
    from racesim.scenarios import load_scenario

    scen = load_scenario("pd-kv-load-failure")
    result = run_scenario(scen, "buggy", witness=True)
    assert result.sim_time > 10 * max(e.time for e in result.trace)
    model = TraceModel(result.trace, result.topology)
    o = build_overview(model, result.violations, result.sim_time, [], None)
    rightmost = max(x + w for x, _y, w, *_ in o.cells)
    assert rightmost > _LEFT + 0.9 * _PLOT_W  # the activity fills the strip
    assert o.axis[-1][1].endswith(f"(the run ends at t={result.sim_time:.3f}s)")
    assert "the run ends at t=" in render_run_report(scen, "buggy", {}, result, "")


def test_long_event_text_wraps_in_the_diagram_instead_of_being_cut() -> None:
    from racesim.reports.model import TraceModel
    from racesim.reports.swimlane import build_diagrams
    from racesim.runner import run_scenario
    from racesim.scenarios import load_scenario, scenario_from_dict

    long_id = "tenant-42/" + "very-long-request-id-" * 6 + "end"
    data = load_scenario("abort-reuse").to_dict()
    for request in data["request"]:
        request["id"] = long_id
    scen = scenario_from_dict(data)
    result = run_scenario(scen, "buggy", witness=True)
    (page, *_) = build_diagrams(TraceModel(result.trace, result.topology), result.violations,
                                result.sim_time)
    rows = [r for r in page.rows if r.kind == "event"]
    assert not any(line.endswith("…") for r in rows for line in r.lines)
    registers = [r for r in rows if "registers" in r.title]
    assert registers and all(long_id in "".join(r.lines) for r in registers)
    assert all(len(r.lines) > 1 and r.h > 22 for r in registers)  # a taller row, not a cut
    for above, below in zip(page.rows, page.rows[1:], strict=False):
        assert below.y >= above.y + above.h  # rows never overlap


def test_the_race_window_header_names_its_event_by_caption_and_links_to_its_row() -> None:
    import html as html_lib
    import re

    from racesim.reports.html import render_run_report
    from racesim.runner import run_scenario
    from racesim.scenarios import load_scenario

    scen = load_scenario("abort-reuse")
    result = run_scenario(scen, "buggy", witness=True)
    page = render_run_report(scen, "buggy", {}, result, "racesim run abort-reuse --witness")
    story = re.search(r"Race window opens at (.*?)</li>", page, re.S)
    assert story, "no race window in the story"
    link = re.search(r'<a href="#([\w-]+)">#(\d+)</a>', story.group(1))
    assert link, story.group(1)
    anchor, seq = link.groups()
    assert f'id="{anchor}"' in page  # the row it links to exists
    # the caption is the row's own text: "X #1: ◆ await point ..." as the diagram shows it
    row = re.search(rf'<g id="{anchor}">(.*?)</g>', page, re.S)
    assert row, anchor
    shown = html_lib.unescape(re.sub(r"<[^>]+>", "", row.group(1).split("</title>", 1)[1]))
    caption = html_lib.unescape(re.sub(r"<[^>]+>", "", story.group(1)))
    said = "X #1: ◆ await point frontend.abort:after_pop#0 delayed 0.05s"
    assert said in caption and said in " ".join(shown.split()), (caption, shown)
    assert seq == "68"


def test_matrix_cells_link_their_reports_and_files_and_reports_link_back(
        tmp_path: Path) -> None:
    import re
    from urllib.parse import unquote

    from racesim.explore.matrix import run_matrix
    from racesim.documents.report_files import write_matrix_reports
    from racesim.scenarios import load_scenario

    out = tmp_path / "out"
    out.mkdir()
    result = run_matrix([load_scenario("abort-reuse")], ["buggy", "internal-id"], budget=5,
                        seed=0, strategy="random", workers=1, dask=None, skip=(),
                        out_dir=out)
    page = tmp_path / "html" / "m.html"
    page.parent.mkdir()
    write_matrix_reports(page, result.document(), result)
    text = page.read_text(encoding="utf-8")
    hrefs = [unquote(h) for h in re.findall(r'href="([^"]+)"', text)]
    reports = [h for h in hrefs if h.endswith(".html")]
    files = [h for h in hrefs if h.endswith(".json")]
    assert reports and files
    for h in reports + files:
        assert (page.parent / h).resolve().is_file(), h
    assert {Path(h).name for h in files} == {p.name for p in out.glob("*.json")}
    for h in reports:
        cell = (page.parent / h).read_text(encoding="utf-8")
        back = re.search(r'<a href="\.\./m\.html#([\w.-]+)">', cell)
        assert back, "the cell's report links back to the matrix"
        assert f'id="{back.group(1)}"' in text


def test_the_overview_names_each_lane_group_once() -> None:
    from racesim.reports.model import TraceModel
    from racesim.reports.overview import build_overview
    from racesim.runner import run_scenario
    from racesim.scenarios import load_scenario

    result = run_scenario(load_scenario("pd-kv-load-failure"), "buggy", witness=True)
    o = build_overview(TraceModel(result.trace, result.topology), result.violations,
                       result.sim_time, [], None)
    groups = [title.split(" / ")[0] for title, _y in o.lanes if " / " in title]
    assert groups and len(groups) == len(set(groups)), [t for t, _ in o.lanes]
    assert "sched + KV" in [t for t, _ in o.lanes]  # a later lane of its group: its own name
