"""The spend report as one self-contained HTML file: inline CSS and inline SVG charts drawn
here (no script, no font, no image or style from anywhere else; a Content-Security-Policy
forbids any fetch), so it can be mailed, archived and opened offline.

Charts, each an ``<svg>`` with classes a test (or a stylesheet) can find; a money axis's
gridlines are ``g.tick`` with the ``data-value`` they are drawn at and a ``text.tick-label``
saying it (broker/money/amounts.py):

- ``#spend-chart``: cumulative cloud spend per day, one ``path.spend`` per team with spend or a
  cap, its cap as a ``line.cap`` (``data-usd``) labelled by a ``text.cap-label`` (``vision cap
  $1,000.00``), and its forecast to the window's end as a ``path.forecast``;
- ``#site-chart``: per site, its cloud spend and its on-prem chargeback as ``rect.bar`` of two
  colours (``data-series`` cloud or onprem), named by a legend (``g.legend-entry``);
- ``#zone-chart``: emissions by carbon zone, one ``rect.bar`` per zone;

then ``table#machines``: the machines behind the cloud spend, their hours, price and how
their cost was split between teams.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

from broker.money.amounts import dollars, money, money_ticks, rate
from broker.money.report_render import pct, seconds, summary_lines, title, utc

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
           "#e377c2", "#7f7f7f", "#bcbd22")
CLOUD_COLOUR, ONPREM_COLOUR = "#4e79a7", "#edc948"  # the site chart's two series
ZONE_COLOUR = "#59a14f"  # the emission bars (teams' colours are the lines')
W, H = 760, 300
ML, MR, MT, MB = 72, 24, 16, 40
CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}table{border-collapse:collapse}
table{font-size:13px}td,th{padding:3px 7px;border-bottom:1px solid #ddd;text-align:right;
white-space:nowrap}
td:first-child,th:first-child{text-align:left}.over{color:#c00;font-weight:bold}
svg{background:#fff;border:1px solid #eee}.legend span{margin-right:14px}
.sw{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
.note{color:#555}td.shares{text-align:left}.share{margin-right:10px}
tfoot td{font-weight:bold;border-top:1px solid #999}
#machines td:nth-child(-n+5),#machines th:nth-child(-n+5){text-align:left}"""


def _f(v: float) -> str:
    return f"{v:.1f}"


def _tick(v: float, label: str, line: str, text: str) -> str:
    """One gridline and its label, grouped with the value it is drawn at."""
    return f'<g class="tick" data-value="{v!r}">{line}<text class="tick-label" {text}>' \
           f'{escape(label)}</text></g>'


def _legend_entry(x: float, y: float, series: str, colour: str, label: str) -> str:
    return (f'<g class="legend-entry" data-series="{series}"><rect class="swatch" x="{x}" '
            f'y="{y}" width="12" height="12" fill="{colour}"/><text x="{x + 16}" '
            f'y="{y + 11}" font-size="12">{escape(label)}</text></g>')


def _cap_labels(caps: Sequence[tuple[float, str, str, str]], y: Any) -> list[str]:
    """Each cap's label (``vision cap $1,000.00``) at the chart's right end above its line,
    moved up where it would overlap the one below it: (cap, team, colour, label)."""
    out, last = [], float("inf")
    for cap, team, colour, label in sorted(caps, key=lambda c: c[0]):
        ty = min(y(cap) - 4, last - 13)
        last = ty
        out.append(f'<text class="cap-label" data-team="{team}" x="{W - MR - 4}" '
                   f'y="{_f(ty)}" font-size="11" text-anchor="end" fill="{colour}">'
                   f'{label}</text>')
    return out


def spend_chart(report: dict[str, Any]) -> str:
    """Cumulative spend per team by day, with cap lines (labelled) and forecasts."""
    days = report["days"]
    teams = [r for r in report["teams"] if r["cap_usd"] is not None or r["cloud_usd"] > 0]
    n = len(days)
    elapsed = min(float(report["window"]["elapsed_days"]), n)
    most = max([0.0] + [r["cap_usd"] or 0.0 for r in teams] + [r["forecast_usd"] for r in teams]
               + [d["cumulative"].get(r["team"], 0.0) for d in days for r in teams])
    ticks = money_ticks(most * 1.05, 5)
    top = ticks[-1].value
    pw, ph = W - ML - MR, H - MT - MB

    def x(day: float) -> float:
        return ML + pw * day / max(n, 1)

    def y(v: float) -> float:
        return MT + ph * (1 - v / top)

    out = [f'<svg id="spend-chart" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" role="img" aria-label="cumulative spend against cap">']
    for t in ticks:
        at = _f(y(t.value))
        out.append(_tick(t.value, t.label, f'<line class="grid" x1="{ML}" x2="{W - MR}" '
                         f'y1="{at}" y2="{at}" stroke="#eee"/>',
                         f'x="{ML - 6}" y="{_f(y(t.value) + 4)}" font-size="11" '
                         'text-anchor="end"'))
    every = max(1, math.ceil(n / 8))
    for i in range(0, n, every):
        out.append(f'<text x="{_f(x(i + 0.5))}" y="{H - MB + 16}" font-size="11" '
                   f'text-anchor="middle">{escape(days[i]["day"][5:])}</text>')
    out.append(f'<line x1="{ML}" x2="{ML}" y1="{MT}" y2="{H - MB}" stroke="#999"/>'
               f'<line x1="{ML}" x2="{W - MR}" y1="{H - MB}" y2="{H - MB}" stroke="#999"/>')
    caps = []
    for k, r in enumerate(teams):
        color, team = PALETTE[k % len(PALETTE)], r["team"]
        label = escape(team, quote=True)
        if r["cap_usd"] is not None:
            cap = r["cap_usd"]
            caps.append((cap, label, color, f"{label} cap {dollars(cap)}"))
            out.append(f'<line class="cap" data-team="{label}" data-usd="{cap!r}" '
                       f'x1="{ML}" x2="{W - MR}" y1="{_f(y(cap))}" y2="{_f(y(cap))}" '
                       f'stroke="{color}" stroke-dasharray="6 4"><title>{label} cap '
                       f'{dollars(cap)}</title></line>')
        pts = [(x(0), y(0))]
        for i, d in enumerate(days):
            if i >= elapsed:
                break
            pts.append((x(min(i + 1.0, elapsed)), y(d["cumulative"].get(team, 0.0))))
        path = "M" + " L".join(f"{_f(a)},{_f(b)}" for a, b in pts)
        out.append(f'<path class="spend" data-team="{label}" d="{path}" fill="none" '
                   f'stroke="{color}" stroke-width="2"><title>{label} spent '
                   f'{dollars(r["cloud_usd"])}</title></path>')
        if 0 < elapsed < n:
            ax, ay = pts[-1]
            out.append(f'<path class="forecast" data-team="{label}" d="M{_f(ax)},{_f(ay)} '
                       f'L{_f(x(n))},{_f(y(r["forecast_usd"]))}" fill="none" '
                       f'stroke="{color}" stroke-dasharray="2 3"><title>{label} forecast '
                       f'{dollars(r["forecast_usd"])}</title></path>')
    out += _cap_labels(caps, y)
    out.append("</svg>")
    legend = "".join(f'<span class="legend-entry" data-team="{escape(r["team"], quote=True)}">'
                     f'<i class="sw" style="background:{PALETTE[k % len(PALETTE)]}"></i>'
                     f'{escape(r["team"])}</span>' for k, r in enumerate(teams))
    return "".join(out) + f'<div class="legend">{legend} (solid: spent; dashed: cap; dotted: ' \
                          "forecast)</div>"


def site_chart(sites: Sequence[dict[str, Any]]) -> str:
    """Per site, its cloud spend and its on-prem chargeback as bars of two colours (a legend
    names them) on a money axis: ``rect.bar`` with ``data-series`` cloud or onprem."""
    lw, bh, gap, top_pad = 300, 18, 8, 34
    height = top_pad + len(sites) * (bh + gap) + 30
    ticks = money_ticks(max([s["cloud_usd"] + s["onprem_usd"] for s in sites] + [0.0]), 4)
    top = ticks[-1].value
    pw = W - lw - 110
    bottom = top_pad + len(sites) * (bh + gap)

    def x(v: float) -> float:
        return lw + pw * v / top

    out = [f'<svg id="site-chart" xmlns="http://www.w3.org/2000/svg" width="{W}" '
           f'height="{height}" viewBox="0 0 {W} {height}" role="img" '
           'aria-label="cloud spend and on-prem chargeback by site">',
           _legend_entry(lw, 8, "cloud", CLOUD_COLOUR, "cloud spend"),
           _legend_entry(lw + 130, 8, "onprem", ONPREM_COLOUR, "on-prem chargeback")]
    for t in ticks:
        gx = _f(x(t.value))
        out.append(_tick(t.value, t.label, f'<line class="grid" x1="{gx}" x2="{gx}" '
                         f'y1="{top_pad - 4}" y2="{bottom}" stroke="#eee"/>',
                         f'x="{gx}" y="{bottom + 16}" font-size="11" text-anchor="middle"'))
    for i, s in enumerate(sites):
        yy = top_pad + i * (bh + gap)
        out.append(f'<text x="{lw - 8}" y="{yy + 13}" font-size="12" text-anchor="end">'
                   f'{escape(short(s["site"]))}</text>')
        at, said = 0.0, []
        for series, colour, usd, what in (("cloud", CLOUD_COLOUR, s["cloud_usd"], "cloud"),
                                          ("onprem", ONPREM_COLOUR, s["onprem_usd"],
                                           "on-prem")):
            if usd <= 0:
                continue
            width = max(x(at + usd) - x(at), 1.0)
            out.append(f'<rect class="bar" data-series="{series}" data-usd="{usd!r}" '
                       f'x="{_f(x(at))}" y="{yy}" width="{_f(width)}" height="{bh}" '
                       f'fill="{colour}"><title>{escape(s["site"])}: {what} '
                       f'{dollars(usd)}</title></rect>')
            at += usd
            said.append(f"{dollars(usd)} {what}")
        out.append(f'<text x="{_f(x(at) + 6)}" y="{yy + 13}" font-size="12">'
                   f'{escape(", ".join(said) or "$0.00")}</text>')
    out.append("</svg>")
    return "".join(out)


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


MACHINE_HEADS = ("machine", "provider", "region", "instance type", "market", "GPUs",
                 "start (UTC)", "end (UTC)", "seconds", "$/h", "cost $", "team shares")


def machines_html(report: dict[str, Any]) -> str:
    """``table#machines``: a row per machine behind the cloud spend (``tr`` with
    ``data-request-id``), its team shares as ``span.share`` with ``data-team`` and
    ``data-usd``; a footer with the machines' total against the cloud spend."""
    rows = []
    for m in report["machines"]:
        usd = m["usd"]
        shares = "".join(
            f'<span class="share" data-team="{escape(t, quote=True)}" data-usd="{v!r}">'
            f'{escape(t)} {dollars(v)}'
            f'{f" ({100 * v / usd:.0f}%)" if usd > 0 else ""}</span>'
            for t, v in m["shares"].items())
        end = utc(m["end"]) + (" (running)" if m["running"] else "")
        cells = [escape(m["instance_id"]), escape(m["provider"]), escape(m["region"]),
                 escape(m["instance_type"]), escape(m["market"]), str(m["gpus"]),
                 utc(m["start"]), end, seconds(m["seconds"]), rate(m["price_per_hour"]),
                 money(usd)]
        rows.append(f'<tr data-request-id="{escape(m["request_id"], quote=True)}">'
                    + "".join(f"<td>{c}</td>" for c in cells)
                    + f'<td class="shares">{shares}</td></tr>')
    head = "".join(f"<th>{escape(h)}</th>" for h in MACHINE_HEADS)
    tot = report["totals"]
    foot = (f'<tfoot><tr><td colspan="10">{len(rows)} machine(s); cloud spend in this window '
            f'{dollars(tot["cloud_usd"])}</td><td>{money(tot["machines_usd"])}</td><td></td>'
            "</tr></tfoot>")
    return (f'<table id="machines"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}'
            f"</tbody>{foot}</table>")


def to_html(report: dict[str, Any]) -> str:
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
        "<h2>Cloud spend and on-prem chargeback by site</h2>",
        site_chart(report["sites"]) if report["sites"] else empty,
        "<h2>Emissions by zone</h2>",
        bar_chart("zone-chart", zones, "{:,.1f} kg", ZONE_COLOUR) if zones else empty,
    ]
    if by != "team":
        parts += [f"<h2>By {escape(by)}</h2>",
                  _table((by, "cloud $", "on-prem $", "GPU-h", "kgCO2e"), by_rows)]
    parts += ["<h2>Machines behind the cloud spend</h2>",
              '<p class="note">each rented machine\'s hours charged in this window, and how '
              "its cost was split between teams (by their jobs' GPU-seconds; idle time to the "
              "teams it was launched for), in cents that add up to the machine's cost</p>",
              machines_html(report) if report["machines"] else empty]
    parts.append(f'<p class="note">generated {escape(report["generated_at"])} by spillway '
                 "report</p></body></html>")
    return "\n".join(parts) + "\n"
