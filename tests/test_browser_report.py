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
