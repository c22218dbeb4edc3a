"""The spend report as a terminal table (Rich) or CSV; JSON is the report itself and HTML is
:mod:`broker.money.report_html`."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from broker.money.amounts import dollars, money, rate

FORMATS = ("table", "csv", "json", "html")
CELL_KEYS = ("cloud_usd", "onprem_usd", "gpu_hours", "kg_co2e")
TEAM_KEYS = ("cap_usd", "cap_basis", "hard", "reserved_usd", "left_usd", "used_pct",
             "forecast_usd", "forecast_pct")


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v + 0.0:.1f}%"


def utc(iso: str) -> str:
    """``2026-11-03T10:00:00Z`` as ``2026-11-03 10:00:00`` (columns say UTC)."""
    return iso.replace("T", " ").removesuffix("Z")


def seconds(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.3f}"


def title(report: dict[str, Any]) -> str:
    w = report["window"]
    span = f"{w['from']} to {w['to']}, {w['days']} day(s)"
    state = "closed" if w["closed"] else f"{w['elapsed_days']:g} of {w['days']} days elapsed"
    team = f", team {report['team']}" if report.get("team") else ""
    return f"Spend report {w['label']} ({w['kind']}: {span}; {state}{team})"


def caps_table(report: dict[str, Any]) -> Table:
    t = Table(title="Cloud spend against caps", box=None, pad_edge=False, title_justify="left")
    heads = ("TEAM", "CAP $", "BASIS", "SPENT $", "RESERVED $", "LEFT $", "USED",
             "FORECAST $", "FORECAST", "ON-PREM $", "GPU-H", "KGCO2E")
    for h in heads:
        t.add_column(h, justify="left" if h in ("TEAM", "BASIS") else "right")
    for r in report["teams"]:
        basis = r["cap_basis"] + (" hard" if r["hard"] else " soft" if r["hard"] is False
                                  else "")
        over = r["forecast_pct"] is not None and r["forecast_pct"] > 100
        t.add_row(escape(r["team"]), money(r["cap_usd"]), escape(basis.strip() or "no cap"),
                  money(r["cloud_usd"]), money(r["reserved_usd"]), money(r["left_usd"]),
                  pct(r["used_pct"]), money(r["forecast_usd"]),
                  Text(pct(r["forecast_pct"]), style="bold red" if over else ""),
                  money(r["onprem_usd"]), f"{r['gpu_hours']:,.1f}", f"{r['kg_co2e']:,.1f}")
    return t


def rows_table(report: dict[str, Any]) -> Table:
    by = report["by"]
    t = Table(title=f"By {by}", box=None, pad_edge=False, title_justify="left")
    for h in (by.upper(), "CLOUD $", "ON-PREM $", "GPU-H", "KGCO2E"):
        t.add_column(h, justify="left" if h == by.upper() else "right")
    for r in report["rows"]:
        t.add_row(escape(r["key"]), money(r["cloud_usd"]), money(r["onprem_usd"]),
                  f"{r['gpu_hours']:,.1f}", f"{r['kg_co2e']:,.1f}")
    return t


def zones_table(report: dict[str, Any]) -> Table:
    t = Table(title="Emissions by zone", box=None, pad_edge=False, title_justify="left")
    for h in ("ZONE", "KGCO2E", "KWH", "GPU-H"):
        t.add_column(h, justify="left" if h == "ZONE" else "right")
    for z in report["zones"]:
        t.add_row(escape(z["zone"]), f"{z['kg_co2e']:,.1f}", f"{z['energy_kwh']:,.1f}",
                  f"{z['gpu_hours']:,.1f}")
    return t


def machines_table(report: dict[str, Any]) -> Table:
    t = Table(title="Machines behind the cloud spend", box=None, pad_edge=False,
              title_justify="left")
    heads = ("MACHINE", "PROVIDER", "REGION", "TYPE", "MARKET", "GPUS", "START (UTC)",
             "END (UTC)", "SECONDS", "$/H", "COST $", "TEAM SHARES")
    for h in heads:
        t.add_column(h, justify="right" if h in ("GPUS", "SECONDS", "$/H", "COST $")
                     else "left")
    for m in report["machines"]:
        shares = ", ".join(f"{team} {dollars(v)}" for team, v in m["shares"].items())
        t.add_row(escape(m["instance_id"]), escape(m["provider"]), escape(m["region"]),
                  escape(m["instance_type"]), m["market"], str(m["gpus"]), utc(m["start"]),
                  utc(m["end"]) + (" (running)" if m["running"] else ""),
                  seconds(m["seconds"]), rate(m["price_per_hour"]), money(m["usd"]),
                  escape(shares))
    return t


def summary_lines(report: dict[str, Any]) -> list[str]:
    tot = report["totals"]
    lines = [f"Total: cloud {dollars(tot['cloud_usd'])} (forecast "
             f"{dollars(tot['forecast_usd'])} by "
             f"{report['window']['to']}), on-prem chargeback {dollars(tot['onprem_usd'])}, "
             f"{tot['gpu_hours']:,.1f} GPU-h, {tot['kg_co2e']:,.1f} kgCO2e "
             f"({tot['energy_kwh']:,.1f} kWh)",
             f"Forecast: {report['forecast']['how']}"]
    if report["carbon_source"]:
        lines.append(f"Carbon: {report['carbon_source']}")
    return lines + [f"Note: {n}" for n in report["notes"]]


def renderable(report: dict[str, Any]) -> Group:
    """The report as Rich tables and lines (the CLI prints it fitted to the terminal)."""
    parts: list[Any] = [Text(title(report), style="bold"), caps_table(report)]
    if report["by"] != "team":
        parts += [Text(""), rows_table(report)]
    if report["zones"]:
        parts += [Text(""), zones_table(report)]
    if report["machines"]:
        parts += [Text(""), machines_table(report)]
    parts += [Text("")] + [Text(line) for line in summary_lines(report)]
    return Group(*parts)


def to_csv(report: dict[str, Any]) -> str:
    """One row per ``--by`` key (team: with its cap, left, use and forecast), a header
    first; numbers unformatted, for spreadsheets."""
    by = report["by"]
    keys: Sequence[str] = (*CELL_KEYS, *TEAM_KEYS) if by == "team" else CELL_KEYS
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([by, *keys])
    for r in report["rows"]:
        w.writerow([r["key"], *("" if r.get(k) is None else r.get(k) for k in keys)])
    return buf.getvalue()
