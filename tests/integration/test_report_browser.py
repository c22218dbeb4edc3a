"""The HTML spend report opened in a real headless browser (Debian's Chromium): the DOM the
browser built holds every chart's marks (a spend line per team, a cap line per capped team, a
forecast per team, a bar per site and per zone), and its screenshot shows them in colour.

Chromium is found at ``$SPILLWAY_CHROMIUM``, ``/usr/bin/chromium`` or on PATH. Where none is
installed the test skips and says why; where CI runs (``$CI`` or ``$SPILLWAY_CHROMIUM`` set),
or .ci/run installed it, a missing browser is a failure, never a silent skip."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path

import pytest

from broker.report import Charge, Inputs, Run, build
from broker.report_html import PALETTE, SITE_COLOUR, ZONE_COLOUR, to_html
from broker.report_window import parse_window
from broker.store.budgets import Budget

pytestmark = pytest.mark.integration
AWS = "aws:us-east-1:us-east-1a:spot"
GCP = "gcp:europe-west4:europe-west4-a:ondemand"


def chromium() -> str:
    for cand in (os.environ.get("SPILLWAY_CHROMIUM"), "/usr/bin/chromium",
                 shutil.which("chromium"), shutil.which("chromium-browser")):
        if cand and os.access(cand, os.X_OK):
            return cand
    if os.environ.get("CI") or os.environ.get("SPILLWAY_CHROMIUM"):
        pytest.fail("Chromium is required in CI and is missing: apt-get install -y chromium "
                    "(.ci/run does it)")
    pytest.skip("no Chromium is installed here and none could be: apt-get install -y "
                "chromium (Debian's package; .ci/run installs it)")


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def report() -> dict:  # type: ignore[type-arg]
    """November 2026 at the 16th: three teams (two capped), three sites, two zones."""
    runs = [Run("vision", "onprem", "A100-80GB", 4, ts("2026-11-02T00:00:00"),
                ts("2026-11-03T12:00:00")),
            Run("nlp", AWS, "V100-16GB", 1, ts("2026-11-05T00:00:00"),
                ts("2026-11-05T06:00:00"))]
    charges = [Charge("vision", AWS, f"2026-11-{d:02d}", 30.0 + d) for d in range(1, 16)] + \
        [Charge("nlp", GCP, "2026-11-05", 80.0), Charge("speech", AWS, "2026-11-09", 12.0)]
    budgets = {"vision": Budget("vision", 1000.0), "nlp": Budget("nlp", 50.0, "week")}
    inputs = Inputs(parse_window("2026-11", None, None, None, 0), ts("2026-11-16T00:00:00"),
                    charges, runs, budgets)

    def emit(site: str, gpus: float, model: str, a: float, b: float
             ) -> tuple[str, float | None, float]:
        kwh = gpus * (b - a) / 3600
        return ("DE" if site == "onprem" else "US-MIDA-PJM"), kwh * 0.3, kwh

    return build(inputs, emit, lambda s, g, m, a, b: g * (b - a) / 3600 * 0.81)


class Marks(HTMLParser):
    """Counts (svg id, tag, class) of the elements inside each <svg id=...>."""

    def __init__(self) -> None:
        super().__init__()
        self.svg = ""
        self.seen: Counter[tuple[str, str, str]] = Counter()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "svg":
            self.svg = a.get("id") or ""
        elif self.svg:
            self.seen[(self.svg, tag, a.get("class") or "")] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self.svg = ""


def browse(page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--hide-scrollbars", f"--user-data-dir={tmp / 'profile'}",
           "--window-size=1000,1400", *args, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_the_html_report_draws_its_charts_in_chromium(tmp_path: Path) -> None:
    r = report()
    page = tmp_path / "report.html"
    page.write_text(to_html(r), encoding="utf-8")
    shot = tmp_path / "shot.png"
    done = browse(page, tmp_path, "--dump-dom")
    assert done.returncode == 0 and "</svg>" in done.stdout, done.stderr[-2000:]
    marks = Marks()
    marks.feed(done.stdout)
    seen = marks.seen
    # 3 teams with spend, 2 with caps, a forecast each (the window is half over)
    assert seen[("spend-chart", "path", "spend")] == 3
    assert seen[("spend-chart", "line", "cap")] == 2
    assert seen[("spend-chart", "path", "forecast")] == 3
    assert seen[("site-chart", "rect", "bar")] == len(r["sites"]) == 3
    assert seen[("zone-chart", "rect", "bar")] == len(r["zones"]) == 2
    done = browse(page, tmp_path, f"--screenshot={shot}")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    from PIL import Image

    with Image.open(shot) as img:
        assert img.size == (1000, 1400)
        colours = Counter({rgb: n for n, rgb in img.convert("RGB").getcolors(1 << 24) or ()})
    assert len(colours) > 50  # text, lines and bars, not a blank page

    def near(hexa: str, within: int = 10) -> int:
        """Pixels within ``within`` (per channel) of a colour: lines are antialiased."""
        want = [int(hexa[i:i + 2], 16) for i in (1, 3, 5)]
        return sum(n for rgb, n in colours.items()
                   if all(abs(c - w) <= within for c, w in zip(rgb, want)))

    assert near(SITE_COLOUR, 0) > 1000 and near(ZONE_COLOUR, 0) > 1000  # the bars, filled
    for hexa in PALETTE[:3]:  # each team's lines (spend, cap, forecast) and legend swatch
        assert near(hexa) > 300, (hexa, near(hexa))
    assert near(PALETTE[3]) < 20  # no fourth team


def test_without_chromium_it_skips_saying_why_and_fails_in_ci(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    for var in ("CI", "SPILLWAY_CHROMIUM"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y chromium"):
        chromium()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="required in CI"):
        chromium()
