"""The event report in headless Debian Chromium: the DOM shows the numbers and titles, the screenshot shows charts.

Also exercises the Typer command function end to end (``report_event_command`` with ``--store chdb:PATH``).
Fails (does not skip) when chromium is missing: install it with ``apt-get install -y chromium``
(``make system-deps`` does).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import test_dashboards_fixture as fx
from forumpulse.dashboards.report import report_event_command
from forumpulse.pipeline.store import migrate, open_store

pytestmark = pytest.mark.browser

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--hide-scrollbars"]


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        pytest.fail("chromium is not installed: apt-get install -y chromium (or make system-deps)")
    return exe


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("browser_chdb")
    store = open_store(f"chdb:{folder}")
    migrate(store, {"raw_ttl_days": 0, "rollup_ttl_days": 0})
    tr = fx.make_traffic(minutes=240, flood=False)
    fx.load_requests(store, tr.rows)
    store.close()
    out = tmp_path_factory.mktemp("report")
    app = typer.Typer()
    app.command()(report_event_command)
    res = CliRunner().invoke(app, ["--topic", "101", "--from", "2024-03-10T00:00:00Z", "--to", "2024-03-10T04:00:00Z",
                                   "--out", str(out), "--store", f"chdb:{folder}"])
    assert res.exit_code == 0, res.output
    path = Path(res.output.strip().splitlines()[-1])
    assert path == out / "index.html"
    return path, tr.rows


def run_chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_dump_dom_shows_numbers(report: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    path, rows = report
    res = run_chromium(["--dump-dom", path.as_uri()], tmp_path / "profile")
    assert res.returncode == 0, res.stderr[-2000:]
    dom = res.stdout
    views = sum(r["topic_id"] == 101 and not r["is_bot"] and r["page_kind"] == "topic_view" for r in rows)
    assert "Topic #101" in dom and "Share of forum traffic" in dom and "Top referrers" in dom
    m = re.search(r'id="total-views"><div class="v">([^<]+)<', dom)
    assert m and m.group(1) == f"{views:,}"
    assert dom.count('<img class="chart"') == 4


def test_screenshot_shows_charts(report: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    path, _ = report
    shot = tmp_path / "shot.png"
    res = run_chromium([f"--screenshot={shot}", "--window-size=1100,2600", path.as_uri()], tmp_path / "profile")
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    with Image.open(shot) as im:
        rgb = im.convert("RGB")
        w, h = rgb.size
        # the views line colour (#1f77b4) must be drawn, and the region it spans must not be one flat colour
        xs, ys = [], []
        px = rgb.load()
        assert px is not None
        for y in range(0, h, 2):
            for x in range(0, w, 2):
                r, g, b = px[x, y]
                if abs(r - 0x1F) < 12 and abs(g - 0x77) < 12 and abs(b - 0xB4) < 12:
                    xs.append(x)
                    ys.append(y)
        assert len(xs) > 300, "no chart lines visible in the screenshot"
        area = rgb.crop((min(xs), min(ys), max(xs) + 1, max(ys) + 1))
        colours = area.getcolors(maxcolors=1 << 20) or []
        assert len(colours) > 20, "chart area is (nearly) one flat colour"
