"""A real browser opens the race report: headless Chromium dumps the DOM and takes a screenshot.

Skipped where Chromium is missing, except in CI (``CI`` set), where ``.ci/run`` installs it and
a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from racesim.reports import write_run_report
from racesim.runner import run_command, run_scenario
from racesim.scenarios import load_scenario, scenario_from_dict

TIMEOUT = 120
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars"]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    if Path("/usr/bin/chromium").exists():
        return "/usr/bin/chromium"
    if os.environ.get("CI"):
        pytest.fail("chromium is missing in CI (.ci/run installs Debian's chromium)")
    pytest.skip("chromium is not installed")


@pytest.fixture(scope="module")
def browser() -> str:
    return _chromium()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The abort-reuse race report, with hostile request IDs in place of 'X'."""
    data = load_scenario("abort-reuse").to_dict()
    data["request"][0]["id"] = "<script>alert(1)</script>"
    data["request"][1]["id"] = '"><img src=x onerror=alert(2)>'
    hostile = scenario_from_dict(data)
    out = tmp_path_factory.mktemp("report")
    for scen, name in ((load_scenario("abort-reuse"), "race.html"), (hostile, "hostile.html")):
        result = run_scenario(scen, "buggy", witness=True)
        command = run_command(scen.name, "buggy", {}, result.seed, result.schedule)
        write_run_report(out / name, scen, "buggy", {}, result, command)
    return out


def _run(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)


def _dump_dom(browser: str, page: Path, profile: Path) -> str:
    proc = _run(browser, profile, "--dump-dom", page.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.parametrize("name", ["race.html", "hostile.html"])
def test_dom_has_the_svg_and_nothing_injected(browser: str, report: Path, tmp_path: Path,
                                              name: str) -> None:
    dom = _dump_dom(browser, report / name, tmp_path / "profile")
    assert "<svg" in dom and "</svg>" in dom and "<line" in dom
    lowered = dom.lower()
    assert "<script" not in lowered  # neither ours nor an injected one
    assert "<img" not in lowered  # no element from a request ID
    if name == "race.html":
        assert "race window" in dom and "no-crosstalk" in dom
    else:  # the IDs are in the page, as text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
        assert "&lt;img src=x onerror=alert(2)&gt;" in dom


def _png_pixels(data: bytes) -> tuple[int, int, int, list[bytes]]:
    """Decode a non-interlaced 8-bit RGB/RGBA PNG into rows of raw pixel bytes."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    assert header is not None
    width, height, depth, colour, _c, _f, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def _pixels(rows: list[bytes], bpp: int, step: int) -> Iterator[tuple[int, int, int]]:
    for row in rows[::step]:
        for x in range(0, len(row), bpp * step):
            yield row[x], row[x + 1], row[x + 2]


def test_screenshot_is_not_blank(browser: str, report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    proc = _run(browser, tmp_path / "profile", f"--screenshot={shot}",
                "--window-size=1400,1000", (report / "race.html").as_uri())
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    width, height, bpp, rows = _png_pixels(shot.read_bytes())
    assert (width, height) == (1400, 1000)
    sample = list(_pixels(rows, bpp, 4))
    colours = set(sample)
    white = sum(1 for p in sample if min(p) >= 245)
    assert len(colours) >= 50, "the page looks blank"
    assert white < 0.97 * len(sample), "the page is (almost) all white"
    reds = sum(1 for r, g, b in sample if r > 180 and g < 90 and b < 90)
    assert reds > 0, "no red: the verdict badge or the violation marks did not render"


# -- issue 14: nothing clipped at 1000-1400 px, true titles, the matrix's own page ----------------

def _band_rows(rows: list[bytes], bpp: int) -> list[int]:
    """Rows of the screenshot crossing the race window's solid orange left bar (#e08a1e)."""
    out = []
    for y, row in enumerate(rows):
        run = 0
        for x in range(0, min(len(row), 200 * bpp), bpp):
            r, g, b = row[x], row[x + 1], row[x + 2]
            run = run + 1 if (abs(r - 0xE0) < 24 and abs(g - 0x8A) < 24 and b < 80) else 0
            if run >= 4:
                out.append(y)
                break
    return out


@pytest.fixture(scope="module")
def pd_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    scen = load_scenario("pd-reuse")
    result = run_scenario(scen, "buggy", witness=True)
    path = tmp_path_factory.mktemp("pd") / "pd.html"
    write_run_report(path, scen, "buggy", {}, result,
                     run_command(scen.name, "buggy", {}, result.seed, result.schedule))
    return path


@pytest.mark.parametrize("width", [1000, 1400])
def test_the_race_window_is_seen_whole_at_common_widths(browser: str, pd_report: Path,
                                                        tmp_path: Path, width: int) -> None:
    """The window's frame spans the diagram's full width: its right edge (dashed orange)
    is on screen only if the diagram is not cut off on the right."""
    shot = tmp_path / "shot.png"
    proc = _run(browser, tmp_path / "profile", f"--screenshot={shot}",
                f"--window-size={width},1400", pd_report.as_uri())
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    w, _h, bpp, rows = _png_pixels(shot.read_bytes())
    band = _band_rows(rows, bpp)
    assert band, "no race window on screen"
    edges: dict[int, int] = {}  # x of the rightmost orange pixel per band row -> rows
    for y in band:
        row = rows[y]
        for x in range(w - 1, w // 2, -1):
            r, g, b = row[x * bpp], row[x * bpp + 1], row[x * bpp + 2]
            if abs(r - 0xE0) < 40 and abs(g - 0x8A) < 50 and b < 120:
                edges[x // 3] = edges.get(x // 3, 0) + 1
                break
    column, hits = max(edges.items(), key=lambda kv: kv[1], default=(0, 0))
    right_edge = column * 3
    # a frame, not text: the same column is orange down much of the window
    assert hits >= 0.3 * len(band) and right_edge > w * 0.8, \
        "the right end of the diagram is cut off"
    assert right_edge < w - 8, "the diagram runs past the page's margin"


def test_lane_labels_and_titles_are_whole(browser: str, pd_report: Path, tmp_path: Path) -> None:
    dom = _dump_dom(browser, pd_report, tmp_path / "profile")
    assert "API serv…" not in dom and "…</text>" not in dom.split("The whole run")[0]
    for lane in ("API server", "P.frontend0", "D.frontend0", "prefill engine", "decode engine"):
        assert f">{lane}</text>" in dom, lane
    assert ">sockets</text>" not in dom, "an empty lane is drawn"
    assert "to the first violation, and what followed" in dom
    assert "X #1" in dom and "X #3" in dom and "X #4" not in dom


def test_matrix_report_shows_parameters_legend_and_accounting_style(
        browser: str, tmp_path: Path) -> None:
    from racesim.explore.matrix import run_matrix
    from racesim.reports import write_matrix_report

    result = run_matrix([load_scenario("abort-reuse"), load_scenario("multi-frontend")],
                        ["internal-id", "buggy"], budget=4, seed=0, strategy="random",
                        workers=1, dask=None, skip=(), out_dir=None)
    page = write_matrix_report(tmp_path / "m.html", result.document(), {})
    dom = _dump_dom(browser, page, tmp_path / "profile")
    for text in ("budget", "4 runs per cell", "strategy", "random", "seed", "racesim"):
        assert text in dom, text
    assert "<h2>Invariants</h2>" in dom and "accounting only" in dom
    assert 'class="gap"' in dom and 'class="chip acct"' in dom   # amber, not red
    assert 'class="fail"' in dom and 'class="chip inv"' in dom
    shot = tmp_path / "m.png"
    proc = _run(browser, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1000,900",
                page.as_uri())
    assert proc.returncode == 0
    _w, _h, bpp, rows = _png_pixels(shot.read_bytes())
    sample = list(_pixels(rows, bpp, 2))
    amber = sum(1 for r, g, b in sample if (r, g, b) == (0xFF, 0xF8, 0xE6))
    pink = sum(1 for r, g, b in sample if (r, g, b) == (0xFF, 0xF0, 0xF0))
    assert amber > 50 and pink > 50, "accounting-only and racing cells look alike"


# -- issue 22: reports link to each other; long text wraps ---------------------------------------

def test_matrix_and_cell_reports_link_each_other_in_the_browser(browser: str,
                                                                 tmp_path: Path) -> None:
    import re
    from urllib.parse import unquote

    from racesim.explore.matrix import run_matrix
    from racesim.documents.report_files import write_matrix_reports

    result = run_matrix([load_scenario("duplicate-in-flight")], ["buggy"], budget=3, seed=0,
                        strategy="random", workers=1, dask=None, skip=(),
                        out_dir=tmp_path / "out")
    page = tmp_path / "m.html"
    write_matrix_reports(page, result.document(), result)
    dom = _dump_dom(browser, page, tmp_path / "profile")
    (cell,) = [unquote(h) for h in re.findall(r'href="([^"]+\.html)"', dom)]
    (cx,) = [unquote(h) for h in re.findall(r'href="([^"]+\.json)"', dom)]
    assert (tmp_path / cx).is_file()
    cell_dom = _dump_dom(browser, tmp_path / cell, tmp_path / "profile")
    back = re.search(r'<a href="\.\./m\.html#([\w.-]+)">', cell_dom)
    assert back and f'id="{back.group(1)}"' in dom
    story = re.search(r"First violation at <b><a href=\"#([\w-]+)\">", cell_dom)
    assert story and f'id="{story.group(1)}"' in cell_dom  # the row the story names


def test_a_long_event_text_is_wrapped_not_cut(browser: str, tmp_path: Path) -> None:
    import re

    long_id = "tenant-42/" + "very-long-request-id-" * 6 + "end"
    data = load_scenario("abort-reuse").to_dict()
    for request in data["request"]:
        request["id"] = long_id
    scen = scenario_from_dict(data)
    result = run_scenario(scen, "buggy", witness=True)
    write_run_report(tmp_path / "long.html", scen, "buggy", {}, result, "racesim run x")
    dom = _dump_dom(browser, tmp_path / "long.html", tmp_path / "profile")
    svg = dom.split("<svg", 1)[1].split("</svg>", 1)[0]
    rows = re.findall(r'<g id="d1-e\d+">(.*?)</g>', svg, re.S)
    texts = [re.sub(r'<tspan font-weight="700"[^>]*>[^<]*</tspan>', "",  # the label may be short
                    row.split("</title>", 1)[1]) for row in rows]
    assert rows and not any("…" in text for text in texts)  # no event text is cut
    assert svg.count('dy="14"') >= 2  # the long ones continue on further lines
    assert "#1</tspan>" in svg and "#2</tspan>" in svg  # a long ID keeps its incarnation
