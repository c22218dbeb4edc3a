"""The HTML spend report opened in a real headless browser (Debian's Chromium): the DOM the
browser built holds every chart's marks (a spend line per team, a cap line per capped team, a
forecast per team, a bar per site and per zone), and its screenshot shows them in colour.

A report made from a ledger (an in-memory store whose machines the ledger billed) is checked
further in the DOM: every money axis's labels say the values their gridlines are drawn at,
cloud spend and on-prem chargeback have legend entries of two colours that their bars use, a
capped team's cap line is labelled with its cap, the machines table's rows and columns are the
instance records' and add up, team by team, to the ledger's charges, and no money reads
``-0.00``; in its screenshot both series' colours show. Pillow decodes the screenshot where it
is installed, else :func:`png_rgb` does (zlib).

Chromium is found at ``$SPILLWAY_CHROMIUM``, ``/usr/bin/chromium`` or on PATH. Where none is
installed the test skips and says why; where CI runs (``$CI`` or ``$SPILLWAY_CHROMIUM`` set),
or .ci/run installed it, a missing browser is a failure, never a silent skip."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path

import pytest

from broker.config.core import Config
from broker.cycle.plan import Plan, Start
from broker.model import Allocation, Gpu, Instance, InstanceState, JobSpec, Node
from broker.money.amounts import parse_label
from broker.money.ledger import accrue_store
from broker.money.report import Charge, Inputs, Run, build
from broker.money.report_data import gather
from broker.money.report_html import CLOUD_COLOUR, ONPREM_COLOUR, PALETTE, ZONE_COLOUR, to_html
from broker.money.report_window import parse_window
from broker.store import open_store
from broker.store.base import BaseStore
from broker.store.budgets import Budget, budget_book
from broker.store.events import Exited, Started

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

    assert near(CLOUD_COLOUR, 0) > 1000 and near(ZONE_COLOUR, 0) > 1000  # the bars, filled
    assert near(ONPREM_COLOUR, 0) > 200  # vision's on-prem chargeback (a short bar)
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


# -- a report from a ledger ---------------------------------------------------------------------

SPOT = "aws:us-east-1:us-east-1a:spot"
ONDEMAND = "aws:us-east-1:us-east-1a:ondemand"
NOV16 = ts("2026-11-16T00:00:00")
# (request id, offer, GPUs, $/h, billed from, ended (None: running at NOV16), its jobs:
# (team, GPUs, start, end))
Machine = tuple[str, str, int, float, str, "str | None",
                list[tuple[str, int, str, "str | None"]]]
MACHINES: list[Machine] = [
    ("r-1", f"{SPOT}/p3.8xlarge", 4, 3.672, "2026-11-05T09:00:00", "2026-11-05T15:10:00",
     [("vision", 2, "2026-11-05T09:10:00", "2026-11-05T14:10:00"),
      ("nlp", 2, "2026-11-05T09:10:00", "2026-11-05T12:10:00")]),
    ("r-2", f"{GCP}/a2-highgpu-1g", 1, 3.67, "2026-11-09T10:00:00", "2026-11-09T12:30:00",
     [("speech", 1, "2026-11-09T10:05:00", "2026-11-09T12:00:00")]),
    ("r-3", f"{ONDEMAND}/g5.xlarge", 1, 1.006, "2026-11-13T06:00:00", None,
     [("vision", 1, "2026-11-13T06:20:00", None)]),
]


def ledger_report() -> tuple[dict, BaseStore]:  # type: ignore[type-arg]
    """November 2026 at the 16th from an in-memory store: vision runs 4 A100s on-prem for a
    day and a half; three machines billed by the ledger (one spot machine shared by vision
    and nlp, one on-demand for speech, one on-demand still running for vision); vision has a
    monthly cap, nlp a weekly one."""
    store = open_store("memory://")
    book = budget_book(store)
    book.set(Budget("vision", 400.0, "month"), "test", ts("2026-10-01T00:00:00"))
    book.set(Budget("nlp", 50.0, "week", hard=False), "test", ts("2026-10-01T00:00:00"))
    t0 = ts("2026-11-02T00:00:00")
    store.heartbeat(node("n1", "A100-80GB", 8, "onprem"), 1e9, t0)
    run_job(store, "vision", 4, "n1", t0, t0 + 36 * 3600)
    for rid, offer, gpus, price, start, end, jobs in MACHINES:
        site, a = offer.partition("/")[0], ts(start)
        store.heartbeat(node(f"c{rid}", "V100-16GB", gpus, site), 1e9, a)
        ids = [run_job(store, team, n, f"c{rid}", ts(js), ts(je) if je else None)
               for team, n, js, je in jobs]
        store.record_instances([Instance(rid, offer, requested_at=a - 60, price_per_hour=price,
                                         for_jobs=tuple(ids))])
        store.move_instance(rid, InstanceState.BOOTING, a, "listed")
        store.move_instance(rid, InstanceState.READY, a + 600, "registered",
                            node_id=f"c{rid}")
        if end:
            store.move_instance(rid, InstanceState.TERMINATED, ts(end), "idle")
    accrue_store(store, book, NOV16)
    inputs, em = gather(store, Config(), parse_window("2026-11", None, None, None, 0), NOV16)
    return build(inputs, em, em.chargeback), store


def node(node_id: str, model: str, count: int, site: str) -> Node:
    gpus = tuple(Gpu(f"{node_id}-g{i}", i, model, 80.0) for i in range(count))
    return Node(node_id, gpus, site=site, incarnation="i1")


def run_job(store: BaseStore, team: str, gpus: int, node_id: str, start: float,
            end: float | None) -> str:
    job = store.submit(JobSpec(command="true", gpus=gpus, team=team), start - 60)
    gpu_ids = tuple(f"{node_id}-g{i}" for i in range(gpus))
    store.apply(Plan(starts=(Start(job.id, job.attempt, job.version,
                                   (Allocation(node_id, gpu_ids),)),)), start)
    store.report(job.id, job.attempt, Started(0), start)
    if end is not None:
        store.report(job.id, job.attempt, Exited(0, 0), end)
    return job.id


@dataclass
class El:
    tag: str
    attrs: dict[str, str]
    children: list[El] = field(default_factory=list)
    text: str = ""

    def all(self, tag: str, cls: str | None = None, **attrs: str) -> list[El]:
        """Descendants with ``tag``, class ``cls`` among their classes, and ``attrs``."""
        out = []
        for c in self.children:
            if c.tag == tag and (cls is None or cls in c.attrs.get("class", "").split()) \
                    and all(c.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items()):
                out.append(c)
            out += c.all(tag, cls, **attrs)
        return out

    def one(self, tag: str, cls: str | None = None, **attrs: str) -> El:
        [found] = self.all(tag, cls, **attrs)
        return found

    @property
    def full_text(self) -> str:
        return self.text + "".join(c.full_text for c in self.children)

    def texts(self) -> list[str]:
        """Each text node's text, on its own."""
        return [self.text] + [t for c in self.children for t in c.texts()]


class Tree(HTMLParser):
    """The DOM Chromium dumped, as a tree of :class:`El` (elements it closes itself, void
    HTML elements, are closed at once)."""

    VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "wbr"}

    def __init__(self, page: str) -> None:
        super().__init__()
        self.root = El("#root", {})
        self.stack = [self.root]
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = El(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(el)
        if tag not in self.VOID:
            self.stack.append(el)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(El(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(El("#text", {}, text=data))


def axis_matches(svg: El, coord: str) -> int:
    """Each gridline's label says its ``data-value``, and gridlines sit on one straight map of
    value to ``coord`` (y1 or x1); the number of gridlines."""
    ticks = svg.all("g", "tick")
    assert len(ticks) >= 3
    at = []
    for t in ticks:
        value = float(t.attrs["data-value"])
        label = t.one("text", "tick-label").full_text
        assert parse_label(label) == pytest.approx(value, abs=1e-12), (label, value)
        at.append((value, float(t.one("line", "grid").attrs[coord])))
    (v0, p0), (v1, p1) = at[0], at[1]
    for v, p in at:
        assert p == pytest.approx(p0 + (p1 - p0) * (v - v0) / (v1 - v0), abs=0.11)
    labels = [t.one("text", "tick-label").full_text for t in ticks]
    assert len(set(labels)) == len(labels), labels
    return len(ticks)


def test_the_ledger_report_in_chromium(tmp_path: Path) -> None:
    r, store = ledger_report()
    page = tmp_path / "report.html"
    page.write_text(to_html(r), encoding="utf-8")
    done = browse(page, tmp_path, "--dump-dom")
    assert done.returncode == 0 and "</svg>" in done.stdout, done.stderr[-2000:]
    dom = Tree(done.stdout).root
    zeros = [t for t in dom.texts() if re.search(r"-\$?0\.0+\b", t)]
    assert not zeros, zeros  # (no money prints a negative zero)

    # the spend chart: its axis, and vision's and nlp's caps drawn where the axis puts them
    spend = dom.one("svg", id="spend-chart")
    axis_matches(spend, "y1")
    ticks = [(float(t.attrs["data-value"]), float(t.one("line").attrs["y1"]))
             for t in spend.all("g", "tick")]
    (v0, y0), (v1, y1) = ticks[0], ticks[1]
    caps = {c.attrs["data-team"]: c for c in spend.all("line", "cap")}
    assert set(caps) == {"vision", "nlp"}
    teams = {t["team"]: t for t in r["teams"]}
    for team, line in caps.items():
        usd = float(line.attrs["data-usd"])
        assert usd == teams[team]["cap_usd"]
        assert float(line.attrs["y1"]) == pytest.approx(y0 + (y1 - y0) * (usd - v0) / (v1 - v0),
                                                        abs=0.11)
        label = spend.one("text", "cap-label", data_team=team).full_text
        assert label == f"{team} cap ${usd:,.2f}"
    assert len(spend.all("path", "spend")) == 3  # vision, nlp, speech

    # cloud and on-prem: a legend entry each, two colours, their bars in them
    sites = dom.one("svg", id="site-chart")
    axis_matches(sites, "x1")
    legend = {e.attrs["data-series"]: e for e in sites.all("g", "legend-entry")}
    assert set(legend) == {"cloud", "onprem"}
    fill = {k: e.one("rect", "swatch").attrs["fill"].lower() for k, e in legend.items()}
    assert fill == {"cloud": CLOUD_COLOUR, "onprem": ONPREM_COLOUR} and len(set(fill.values())) == 2
    assert legend["cloud"].full_text == "cloud spend"
    assert legend["onprem"].full_text == "on-prem chargeback"
    bars = sites.all("rect", "bar")
    by_series = Counter(b.attrs["data-series"] for b in bars)
    assert by_series == {"cloud": 3, "onprem": 1}  # 3 cloud sites, onprem
    for b in bars:
        assert b.attrs["fill"].lower() == fill[b.attrs["data-series"]]
    onprem = next(s for s in r["sites"] if s["site"] == "onprem")
    assert float(next(b for b in bars if b.attrs["data-series"] == "onprem"
                      ).attrs["data-usd"]) == onprem["onprem_usd"] > 0

    # the machines table: the instance records, adding up to the ledger's charges
    table = dom.one("table", id="machines")
    heads = [th.full_text for th in table.all("th")]
    assert heads == ["machine", "provider", "region", "instance type", "market", "GPUs",
                     "start (UTC)", "end (UTC)", "seconds", "$/h", "cost $", "team shares"]
    rows = table.one("tbody").all("tr")
    assert [tr.attrs["data-request-id"] for tr in rows] == ["r-1", "r-2", "r-3"]
    ledger: dict[str, float] = {}
    for (team, _, day), (usd, _, _) in budget_book(store).sums().items():
        if day.startswith("2026-11-"):
            ledger[team] = ledger.get(team, 0.0) + usd
    shown: dict[str, float] = {}
    for tr, (_, offer, gpus, price, start, end, _) in zip(rows, MACHINES):
        cells = [td.full_text for td in tr.all("td")]
        site, itype = offer.split("/")
        provider, region, _, market = site.split(":")
        assert cells[1:6] == [provider, region, itype,
                              "spot" if market == "spot" else "on-demand", str(gpus)]
        stop = ts(end) if end else NOV16  # (a running machine: charged to its last hour)
        assert cells[6] == start.replace("T", " ")
        assert cells[7] == (end.replace("T", " ") if end else "2026-11-16 00:00:00 (running)")
        assert cells[8] == f"{stop - ts(start):,.0f}" and float(cells[9]) == price
        cost = price * (stop - ts(start)) / 3600
        assert float(cells[10].replace(",", "")) == pytest.approx(cost, abs=0.005)
        shares = {s.attrs["data-team"]: float(s.attrs["data-usd"])
                  for s in tr.all("span", "share")}
        assert sum(shares.values()) == pytest.approx(float(cells[10].replace(",", "")),
                                                     abs=1e-9)
        for team, usd in shares.items():
            shown[team] = shown.get(team, 0.0) + usd
    assert shown.keys() == ledger.keys() == {"vision", "nlp", "speech"}
    for team, usd in ledger.items():
        assert shown[team] == pytest.approx(usd, abs=0.015), team  # (cents, per machine)
    # r-1: 6h10m of a 4-GPU machine; vision held 2 GPUs 5 h, nlp 2 GPUs 3 h, the idle
    # GPU-seconds split between them evenly (each was launched for 2 GPUs); the shares in
    # cents, the cent left over to the largest remainder, so that they add up to its cost
    whole, idle = 4 * 22200, 4 * 22200 - 2 * 5 * 3600 - 2 * 3 * 3600
    cost = 3.672 * 22200 / 3600
    r1 = {s.attrs["data-team"]: float(s.attrs["data-usd"]) for s in rows[0].all("span", "share")}
    assert r1 == {"vision": pytest.approx(cost * (36000 + idle / 2) / whole, abs=0.01),
                  "nlp": pytest.approx(cost * (21600 + idle / 2) / whole, abs=0.01)}
    assert sum(r1.values()) == pytest.approx(round(cost, 2), abs=1e-9)
    assert not any("machines listed account for" in n for n in r["notes"])

    # the screenshot: the right size, not blank, both series' colours and the teams'
    shot = tmp_path / "shot.png"
    done = browse(page, tmp_path, f"--screenshot={shot}")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    size, colours = screenshot_colours(shot)
    assert size == (1000, 1400)
    assert len(colours) > 50

    def near(hexa: str, within: int = 10) -> int:
        want = [int(hexa[i:i + 2], 16) for i in (1, 3, 5)]
        return sum(n for rgb, n in colours.items()
                   if all(abs(c - w) <= within for c, w in zip(rgb, want)))

    assert near(CLOUD_COLOUR, 0) > 500 and near(ONPREM_COLOUR, 0) > 100, \
        (near(CLOUD_COLOUR, 0), near(ONPREM_COLOUR, 0))
    for hexa in PALETTE[:3]:  # the teams' lines, caps and swatches
        assert near(hexa) > 100, (hexa, near(hexa))


def screenshot_colours(png: Path) -> tuple[tuple[int, int], Counter[tuple[int, int, int]]]:
    """(width, height) and a count of each RGB colour: Pillow's where it is installed, else
    :func:`png_rgb`'s."""
    try:
        from PIL import Image
    except ImportError:
        width, height, pixels = png_rgb(png.read_bytes())
        return (width, height), Counter(pixels)
    with Image.open(png) as img:
        counts = img.convert("RGB").getcolors(1 << 24) or []
        return img.size, Counter({rgb: n for n, rgb in counts})


def png_rgb(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """A non-interlaced 8-bit RGB or RGBA PNG (what Chromium writes) decoded with zlib:
    (width, height, each pixel's RGB)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, head = 8, b"", b""
    while pos < len(data):
        n = struct.unpack(">I", data[pos:pos + 4])[0]
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        head, idat = (body, idat) if kind == b"IHDR" else (head, idat + body) \
            if kind == b"IDAT" else (head, idat)
        pos += 12 + n
    width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", head)
    assert depth == 8 and ctype in (2, 6) and not interlace, (depth, ctype, interlace)
    bpp = 3 if ctype == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    prev, pixels = bytearray(stride), []
    for row in range(height):
        f, line = raw[row * (stride + 1)], bytearray(raw[row * (stride + 1) + 1:
                                                         (row + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) \
                    & 255
        pixels += [(line[i], line[i + 1], line[i + 2]) for i in range(0, stride, bpp)]
        prev = line
    return width, height, pixels


def test_the_zlib_decoder_reads_chromiums_screenshot_as_pillow_does(tmp_path: Path) -> None:
    """The fallback decoder (no Pillow) against Pillow, on a small screenshot of the report."""
    pytest.importorskip("PIL", reason="Pillow is the reference the decoder is checked against")
    from PIL import Image

    r, _ = ledger_report()
    page = tmp_path / "report.html"
    page.write_text(to_html(r), encoding="utf-8")
    shot = tmp_path / "small.png"
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
           "--window-size=320,240", f"--screenshot={shot}", page.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    width, height, pixels = png_rgb(shot.read_bytes())
    with Image.open(shot) as img:
        assert (width, height) == img.size == (320, 240)
        assert b"".join(bytes(p) for p in pixels) == img.convert("RGB").tobytes()
