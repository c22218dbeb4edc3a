"""The spend report as one self-contained HTML file: inline CSS and inline SVG charts drawn
here (no script, no font, no image or style from anywhere else; a Content-Security-Policy
forbids any fetch), so it can be mailed, archived and opened offline.

Charts, each an ``<svg>`` with classes a test (or a stylesheet) can find:

- ``#spend-chart``: cumulative cloud spend per day, one ``path.spend`` per team with spend or a
  cap, its cap as a ``line.cap`` and its forecast to the window's end as a ``path.forecast``;
- ``#site-chart``: spend by site, one ``rect.bar`` per site (cloud spend, or on-prem
  chargeback);
- ``#zone-chart``: emissions by carbon zone, one ``rect.bar`` per zone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

from broker.report_render import money, pct, summary_lines, title

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
           "#e377c2", "#7f7f7f", "#bcbd22")
SITE_COLOUR, ZONE_COLOUR = "#4e79a7", "#59a14f"  # the bars (teams' colours are the lines')
W, H = 760, 300
ML, MR, MT, MB = 72, 24, 16, 40
CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}table{border-collapse:collapse}
table{font-size:13px}td,th{padding:3px 7px;border-bottom:1px solid #ddd;text-align:right;
white-space:nowrap}
td:first-child,th:first-child{text-align:left}.over{color:#c00;font-weight:bold}
svg{background:#fff;border:1px solid #eee}.legend span{margin-right:14px}
.sw{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
.note{color:#555}"""


def nice_step(top: float, ticks: int = 4) -> float:
    """A round step (1, 2 or 5 x a power of ten) that cuts [0, top] into about ``ticks``."""
    raw = max(top, 1e-9) / ticks
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _f(v: float) -> str:
    return f"{v:.1f}"


def spend_chart(report: dict[str, Any]) -> str:
    """Cumulative spend per team by day, with cap lines and forecasts."""
    days = report["days"]
    teams = [r for r in report["teams"] if r["cap_usd"] is not None or r["cloud_usd"] > 0]
    n = len(days)
    elapsed = min(float(report["window"]["elapsed_days"]), n)
    top = max([1.0] + [r["cap_usd"] or 0.0 for r in teams] + [r["forecast_usd"] for r in teams]
              + [d["cumulative"].get(r["team"], 0.0) for d in days for r in teams])
    step = nice_step(top * 1.05)
    top = step * math.ceil(top * 1.05 / step)
    pw, ph = W - ML - MR, H - MT - MB

    def x(day: float) -> float:
        return ML + pw * day / max(n, 1)

    def y(v: float) -> float:
        return MT + ph * (1 - v / top)

    out = [f'<svg id="spend-chart" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" role="img" aria-label="cumulative spend against cap">']
    v = 0.0
    while v <= top + 1e-9:
        out.append(f'<line class="grid" x1="{ML}" x2="{W - MR}" y1="{_f(y(v))}" '
                   f'y2="{_f(y(v))}" stroke="#eee"/><text x="{ML - 6}" y="{_f(y(v) + 4)}" '
                   f'font-size="11" text-anchor="end">${v:,.0f}</text>')
        v += step
    every = max(1, math.ceil(n / 8))
    for i in range(0, n, every):
        out.append(f'<text x="{_f(x(i + 0.5))}" y="{H - MB + 16}" font-size="11" '
                   f'text-anchor="middle">{escape(days[i]["day"][5:])}</text>')
    out.append(f'<line x1="{ML}" x2="{ML}" y1="{MT}" y2="{H - MB}" stroke="#999"/>'
               f'<line x1="{ML}" x2="{W - MR}" y1="{H - MB}" y2="{H - MB}" stroke="#999"/>')
    for k, r in enumerate(teams):
        color, team = PALETTE[k % len(PALETTE)], r["team"]
        label = escape(team, quote=True)
        if r["cap_usd"] is not None:
            out.append(f'<line class="cap" data-team="{label}" x1="{ML}" x2="{W - MR}" '
                       f'y1="{_f(y(r["cap_usd"]))}" y2="{_f(y(r["cap_usd"]))}" '
                       f'stroke="{color}" stroke-dasharray="6 4"><title>{label} cap '
                       f'${r["cap_usd"]:,.2f}</title></line>')
        pts = [(x(0), y(0))]
        for i, d in enumerate(days):
            if i >= elapsed:
                break
            pts.append((x(min(i + 1.0, elapsed)), y(d["cumulative"].get(team, 0.0))))
        path = "M" + " L".join(f"{_f(a)},{_f(b)}" for a, b in pts)
        out.append(f'<path class="spend" data-team="{label}" d="{path}" fill="none" '
                   f'stroke="{color}" stroke-width="2"><title>{label} spent '
                   f'${r["cloud_usd"]:,.2f}</title></path>')
        if 0 < elapsed < n:
            ax, ay = pts[-1]
            out.append(f'<path class="forecast" data-team="{label}" d="M{_f(ax)},{_f(ay)} '
                       f'L{_f(x(n))},{_f(y(r["forecast_usd"]))}" fill="none" '
                       f'stroke="{color}" stroke-dasharray="2 3"><title>{label} forecast '
                       f'${r["forecast_usd"]:,.2f}</title></path>')
    out.append("</svg>")
    legend = "".join(f'<span><i class="sw" style="background:{PALETTE[k % len(PALETTE)]}"></i>'
                     f'{escape(r["team"])}</span>' for k, r in enumerate(teams))
    return "".join(out) + f'<div class="legend">{legend} (solid: spent; dashed: cap; dotted: ' \
                          "forecast)</div>"


def bar_chart(chart_id: str, rows: Sequence[tuple[str, float, str]], unit: str,
              colour: str) -> str:
    """Horizontal bars: (label, value, tooltip) each, one ``rect.bar`` per row."""
    lw, bh, gap = 300, 18, 8
    height = MT + len(rows) * (bh + gap) + 8
    top = max([v for _, v, _ in rows] + [1e-9])
    pw = W - lw - 100
    out = [f'<svg id="{chart_id}" xmlns="http://www.w3.org/2000/svg" width="{W}" '
           f'height="{height}" viewBox="0 0 {W} {height}" role="img">']
    for i, (label, value, tip) in enumerate(rows):
        yy = MT + i * (bh + gap)
        width = pw * value / top if top > 0 else 0.0
        out.append(f'<text x="{lw - 8}" y="{yy + 13}" font-size="12" text-anchor="end">'
                   f'{escape(short(label))}</text><rect class="bar" x="{lw}" y="{yy}" '
                   f'width="{_f(max(width, 1.0 if value > 0 else 0.0))}" height="{bh}" '
                   f'fill="{colour}"><title>{escape(tip)}</title></rect>'
                   f'<text x="{_f(lw + width + 6)}" y="{yy + 13}" font-size="12">'
                   f'{escape(unit.format(value))}</text>')
    out.append("</svg>")
    return "".join(out)


def short(label: str, most: int = 44) -> str:
    """A label cut to ``most`` characters from the left (a site id's end says most)."""
    return label if len(label) <= most else "\u2026" + label[-(most - 1):]


def _table(heads: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in heads)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def teams_html(report: dict[str, Any]) -> str:
    rows = []
    for r in report["teams"]:
        over = r["forecast_pct"] is not None and r["forecast_pct"] > 100
        fpct = pct(r["forecast_pct"])
        rows.append([escape(r["team"]), money(r["cap_usd"]),
                     escape(r["cap_basis"] or "no cap"), money(r["cloud_usd"]),
                     money(r["reserved_usd"]), money(r["left_usd"]), pct(r["used_pct"]),
                     money(r["forecast_usd"]),
                     f'<span class="over">{fpct}</span>' if over else fpct,
                     money(r["onprem_usd"]), f"{r['gpu_hours']:,.1f}",
                     f"{r['kg_co2e']:,.1f}"])
    return _table(("team", "cap $", "basis", "spent $", "reserved $", "left $", "used",
                   "forecast $", "forecast", "on-prem $", "GPU-h", "kgCO2e"), rows)


def to_html(report: dict[str, Any]) -> str:
    sites = [(s["site"], s["cloud_usd"] + s["onprem_usd"],
              f"{s['site']}: cloud ${s['cloud_usd']:,.2f}, on-prem chargeback "
              f"${s['onprem_usd']:,.2f}, {s['gpu_hours']:,.1f} GPU-h") for s in report["sites"]]
    zones = [(z["zone"], z["kg_co2e"], f"{z['zone']}: {z['kg_co2e']:,.1f} kgCO2e, "
              f"{z['energy_kwh']:,.1f} kWh, {z['gpu_hours']:,.1f} GPU-h")
             for z in report["zones"]]
    by = report["by"]
    by_rows = [[escape(r["key"]), money(r["cloud_usd"]), money(r["onprem_usd"]),
                f"{r['gpu_hours']:,.1f}", f"{r['kg_co2e']:,.1f}"] for r in report["rows"]]
    empty = '<p class="note">nothing in this window</p>'
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'\">",
        f"<title>{escape(title(report))}</title><style>{CSS}</style></head><body>",
        f"<h1>{escape(title(report))}</h1>",
        "".join(f'<p class="note">{escape(line)}</p>' for line in summary_lines(report)),
        "<h2>Cloud spend against caps</h2>", spend_chart(report), teams_html(report),
        "<h2>Spend by site</h2>",
        bar_chart("site-chart", sites, "${:,.2f}", SITE_COLOUR) if sites else empty,
        "<h2>Emissions by zone</h2>",
        bar_chart("zone-chart", zones, "{:,.1f} kg", ZONE_COLOUR) if zones else empty,
    ]
    if by != "team":
        parts += [f"<h2>By {escape(by)}</h2>",
                  _table((by, "cloud $", "on-prem $", "GPU-h", "kgCO2e"), by_rows)]
    parts.append(f'<p class="note">generated {escape(report["generated_at"])} by spillway '
                 "report</p></body></html>")
    return "\n".join(parts) + "\n"
