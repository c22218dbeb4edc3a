"""The spend report (``spillway report``): spend against caps, a forecast to the end of the
window, GPU-hours, on-prem chargeback and emissions, by team, site or day. Pure: the store is
read by :mod:`broker.money.report_data`, and this module only adds up what it is given.

- **Cloud spend** is the ledger's: the charges of rented machines, one per machine per UTC
  hour, split between teams by GPU-seconds (broker/money/ledger.py). It is what caps count.
- **On-prem chargeback** is each on-prem run's GPU-hours x the amortised price, plus its energy
  at the site's electricity price where one is set (``EnergySettings.onprem_cost_usd``). It is
  reported beside the cloud spend, never counted against a cap (caps hold cloud money).
- **GPU-hours and emissions** come from the runs (each attempt of each job on each node,
  on-prem and cloud), clipped to the window and split at UTC midnights; emissions are the
  energy model's (broker/energy/model.py) in the zone of the run's site.
- **Caps**: a budget over the window's own kind is its amount; a monthly or weekly budget over
  another window is prorated by days (a day is 1/days-in-its-month of a monthly cap, 1/7 of a
  weekly one); a total budget counts all spend to date. Money reserved counts against what is
  left only while the window is current.
- **Forecast** to the window's end: ``mean`` (spend so far / time elapsed x the window's
  length) or ``linear`` (a least-squares line through the daily spend of the whole days
  elapsed, projected over the days left; ``mean`` until two whole days have passed).
"""

from __future__ import annotations

import calendar
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timezone
from typing import Any

from broker.money.amounts import cents, dollars, no_negative_zero, split_cents
from broker.money.ledger_report import MachineCharge
from broker.money.report_window import DAY_S, ReportError, Window
from broker.store.budgets import Budget

BY = ("team", "site", "day")
FORECASTS = ("mean", "linear")
UNKNOWN_ZONE = "unknown"


@dataclass(frozen=True)
class Charge:
    """The ledger's sum for one team, site and UTC day."""

    team: str
    site: str
    day: str
    usd: float


@dataclass(frozen=True)
class Run:
    """``gpus`` GPUs of ``model`` held by a job of ``team`` at ``site`` over [start, end)."""

    team: str
    site: str
    model: str
    gpus: float
    start: float
    end: float


#: (site, gpus, model, start, end) -> (zone, kgCO2e or None when unknown, kWh)
Emit = Callable[[str, float, str, float, float], tuple[str, float | None, float]]
#: (site, gpus, model, start, end) -> on-prem chargeback dollars
Chargeback = Callable[[str, float, str, float, float], float]


@dataclass(frozen=True)
class Inputs:
    window: Window
    now: float
    charges: Sequence[Charge] = ()
    runs: Sequence[Run] = ()
    budgets: Mapping[str, Budget] = field(default_factory=dict)
    reserved: Mapping[str, float] = field(default_factory=dict)  # team -> dollars now
    spent_total: Mapping[str, float] = field(default_factory=dict)  # team -> all-time dollars
    team: str | None = None  # only this team
    carbon_source: str = ""  # said in the report
    notes: Sequence[str] = ()
    machines: Sequence[MachineCharge] = ()  # the machines behind the charges


@dataclass
class Cell:
    cloud_usd: float = 0.0
    onprem_usd: float = 0.0
    gpu_hours: float = 0.0
    kg: float = 0.0
    kwh: float = 0.0
    unknown_gpu_hours: float = 0.0  # GPU-hours in no known carbon zone

    def add(self, other: Cell) -> None:
        for k in ("cloud_usd", "onprem_usd", "gpu_hours", "kg", "kwh", "unknown_gpu_hours"):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def row(self) -> dict[str, Any]:
        return {"cloud_usd": cents(self.cloud_usd), "onprem_usd": cents(self.onprem_usd),
                "gpu_hours": round(self.gpu_hours, 3), "kg_co2e": round(self.kg, 3)}


def is_onprem(site: str) -> bool:
    return site.split(":", 1)[0] == "onprem"


def day_of(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d")


def day_pieces(start: float, end: float) -> Iterable[tuple[str, float, float]]:
    """[start, end) cut at UTC midnights: (day, a, b)."""
    a = start
    while a < end:
        b = min(end, (math.floor(a / DAY_S) + 1) * DAY_S)
        yield day_of(a), a, b
        a = b


def cells(inputs: Inputs, emit: Emit, chargeback: Chargeback
          ) -> tuple[dict[tuple[str, str, str], Cell], dict[str, str]]:
    """(team, site, day) -> its sums in the window, and site -> carbon zone."""
    w, days = inputs.window, set(inputs.window.days)
    out: dict[tuple[str, str, str], Cell] = defaultdict(Cell)
    zones: dict[str, str] = {}
    for c in inputs.charges:
        if c.day in days and (inputs.team is None or c.team == inputs.team):
            out[(c.team, c.site, c.day)].cloud_usd += c.usd
    stop = min(w.end, inputs.now)
    for r in inputs.runs:
        if inputs.team is not None and r.team != inputs.team:
            continue
        a, b = max(r.start, w.start), min(r.end, stop)
        if b <= a or r.gpus <= 0:
            continue
        for day, x, y in day_pieces(a, b):
            cell = out[(r.team, r.site, day)]
            hours = r.gpus * (y - x) / 3600.0
            cell.gpu_hours += hours
            zone, kg, kwh = emit(r.site, r.gpus, r.model, x, y)
            zones[r.site] = zone
            cell.kwh += kwh
            if kg is None:
                cell.unknown_gpu_hours += hours
            else:
                cell.kg += kg
            if is_onprem(r.site):
                cell.onprem_usd += chargeback(r.site, r.gpus, r.model, x, y)
    return dict(out), zones


def group(sums: Mapping[tuple[str, str, str], Cell], index: int) -> dict[str, Cell]:
    """Sums by team (0), site (1) or day (2)."""
    out: dict[str, Cell] = defaultdict(Cell)
    for key, cell in sums.items():
        out[key[index]].add(cell)
    return dict(out)


# -- caps and forecasts ----------------------------------------------------------------------


def prorated_cap(budget: Budget, window: Window) -> tuple[float, str]:
    """(the cap over ``window``, how it was found)."""
    per = {"month": "month", "week": "week"}.get(budget.window)
    if per is None:
        return budget.amount, "total, all spend to date"
    if per == window.kind:
        return budget.amount, f"{per}ly" if per == "week" else "monthly"
    if per == "week":
        share = len(window.days) / 7.0
    else:
        share = sum(1.0 / calendar.monthrange(d.year, d.month)[1]
                    for d in (date.fromisoformat(x) for x in window.days))
    return budget.amount * share, f"prorated from {dollars(budget.amount)} per {per}"


def daily_spend(sums: Mapping[tuple[str, str, str], Cell], team: str | None,
                days: Sequence[str]) -> list[float]:
    by_day: dict[str, float] = defaultdict(float)
    for (t, _, day), cell in sums.items():
        if team is None or t == team:
            by_day[day] += cell.cloud_usd
    return [by_day.get(d, 0.0) for d in days]


def forecast(daily: Sequence[float], window: Window, now: float, method: str
             ) -> tuple[float, str]:
    """(spend expected by the window's end, the method used, in words)."""
    spent = math.fsum(daily)
    elapsed = window.elapsed_s(now)
    if elapsed >= window.seconds:
        return spent, "closed: the actual spend"
    if elapsed <= 0:
        return 0.0, "not started"
    whole = int(elapsed // DAY_S)
    if method == "linear" and whole >= 2:
        xs = list(range(whole))
        ys = list(daily[:whole])
        mx, my = sum(xs) / whole, math.fsum(ys) / whole
        var = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0

        def at(i: int) -> float:
            return max(0.0, my + slope * (i - mx))

        part = elapsed / DAY_S - whole  # of today, passed
        rest = (1.0 - part) * at(whole) + sum(at(i) for i in range(whole + 1, len(daily)))
        return spent + rest, f"linear: least-squares line through {whole} whole days"
    rate = spent / elapsed
    how = "mean daily spend" + (" (linear needs 2 whole days)" if method == "linear" else "")
    return spent + rate * (window.seconds - elapsed), \
        f"{how}: {dollars(rate * DAY_S)}/day over {elapsed / DAY_S:.2f} days"


def team_row(team: str, cell: Cell, inputs: Inputs, daily: Sequence[float], method: str
             ) -> dict[str, Any]:
    w, now = inputs.window, inputs.now
    fc, _ = forecast(daily, w, now, method)
    row: dict[str, Any] = {"team": team, **cell.row(), "forecast_usd": cents(fc),
                           "cap_usd": None, "cap_basis": "", "hard": None,
                           "reserved_usd": 0.0, "left_usd": None, "used_pct": None,
                           "forecast_pct": None}
    b = inputs.budgets.get(team)
    if b is None:
        return row
    cap, basis = prorated_cap(b, w)
    current = w.holds(now) or b.window == "total"
    reserved = inputs.reserved.get(team, 0.0) if current else 0.0
    counted = inputs.spent_total.get(team, cell.cloud_usd) if b.window == "total" \
        else cell.cloud_usd
    fc_counted = counted - cell.cloud_usd + fc
    row.update(cap_usd=cents(cap), cap_basis=basis, hard=b.hard,
               reserved_usd=cents(reserved), left_usd=cents(cap - counted - reserved),
               used_pct=round(100.0 * counted / cap, 1) if cap > 0 else None,
               forecast_pct=round(100.0 * fc_counted / cap, 1) if cap > 0 else None)
    return row


# -- the report --------------------------------------------------------------------------------


def build(inputs: Inputs, emit: Emit, chargeback: Chargeback, by: str = "team",
          method: str = "mean") -> dict[str, Any]:
    """The report as plain data (what ``--format json`` prints; the other formats render
    it). Keys: window, by, forecast, totals, teams (spend against caps), rows (by ``by``),
    sites, zones, days (per day: spend by team and cumulative), carbon_source, notes."""
    if by not in BY:
        raise ReportError("--by", f"{by!r} is not a grouping", ", ".join(BY))
    if method not in FORECASTS:
        raise ReportError("--forecast", f"{method!r} is not a method", ", ".join(FORECASTS))
    w, now = inputs.window, inputs.now
    sums, zones = cells(inputs, emit, chargeback)
    by_team = group(sums, 0)
    teams = sorted(set(by_team) | ({t for t in inputs.budgets if inputs.team in (None, t)}))
    team_rows = [team_row(t, by_team.get(t, Cell()), inputs,
                          daily_spend(sums, t, w.days), method) for t in teams]
    total = Cell()
    for c in sums.values():
        total.add(c)
    fc, how = forecast(daily_spend(sums, None, w.days), w, now, method)
    rows: list[dict[str, Any]]
    if by == "team":
        rows = [{"key": r["team"], **{k: v for k, v in r.items() if k != "team"}}
                for r in team_rows]
    else:
        grouped = group(sums, BY.index(by))
        keys = w.days if by == "day" else sorted(grouped)
        rows = [{"key": k, **grouped.get(k, Cell()).row()} for k in keys]
    by_zone: dict[str, Cell] = defaultdict(Cell)
    for (_, site, _), cell in sums.items():
        if cell.gpu_hours > 0:  # (a site with charges and no runs emits nothing here)
            by_zone[zones.get(site, "") or UNKNOWN_ZONE].add(cell)
    notes = list(inputs.notes)
    machines = machines_of(inputs.machines, None if inputs.team is None else {inputs.team})
    on_machines = math.fsum(m.usd for m in machines)
    if abs(on_machines - total.cloud_usd) >= 0.005:
        notes.append(f"the machines listed account for {dollars(on_machines)} of the "
                     f"{dollars(total.cloud_usd)} of cloud spend: the rest was charged for "
                     "machines without an instance record in the store, or priced or split "
                     "differently when it was charged")
    unknown = total.unknown_gpu_hours
    if unknown > 0:
        notes.append(f"{unknown:,.2f} GPU-hours ran where no carbon zone or intensity is known "
                     "(their emissions are not counted): set energy.sites.<site>.carbon_zone "
                     "(docs/carbon.md)")
    return no_negative_zero({
        "window": {"kind": w.kind, "label": w.label, "from": w.first.isoformat(),
                   "to": w.last.isoformat(), "days": len(w.days),
                   "elapsed_days": round(w.elapsed_s(now) / DAY_S, 3),
                   "closed": now >= w.end},
        "generated_at": datetime.fromtimestamp(now, timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ"),
        "by": by, "team": inputs.team,
        "forecast": {"method": method, "how": how},
        "totals": {**total.row(), "forecast_usd": cents(fc), "machines_usd": cents(on_machines),
                   "energy_kwh": round(total.kwh, 1)},
        "teams": team_rows,
        "rows": rows,
        "sites": [{"site": s, "zone": zones.get(s, ""), **c.row()}
                  for s, c in sorted(group(sums, 1).items())],
        "zones": [{"zone": z, "kg_co2e": round(c.kg, 3), "energy_kwh": round(c.kwh, 1),
                   "gpu_hours": round(c.gpu_hours, 3)} for z, c in sorted(by_zone.items())],
        "days": day_series(sums, [r["team"] for r in team_rows], w.days),
        "machines": [machine_row(m) for m in machines],
        "carbon_source": inputs.carbon_source,
        "notes": notes,
    })


def day_series(sums: Mapping[tuple[str, str, str], Cell], teams: Sequence[str],
               days: Sequence[str]) -> list[dict[str, Any]]:
    """Per day: each team's cloud spend that day and cumulative from the window's start."""
    daily = {t: daily_spend(sums, t, days) for t in teams}
    out, running = [], dict.fromkeys(teams, 0.0)
    for i, d in enumerate(days):
        for t in teams:
            running[t] += daily[t][i]
        out.append({"day": d, "spend": {t: cents(daily[t][i]) for t in teams},
                    "cumulative": {t: cents(running[t]) for t in teams}})
    return out


def machines_of(machines: Iterable[MachineCharge], teams: set[str] | None
                ) -> list[MachineCharge]:
    """``machines`` with only the shares of ``teams`` (None: all), and those with none of
    theirs left out."""
    if teams is None:
        return list(machines)
    out = []
    for m in machines:
        shares = {t: v for t, v in m.shares.items() if t in teams}
        if shares:
            out.append(replace(m, shares=shares))
    return out


def machine_row(m: MachineCharge) -> dict[str, Any]:
    """A machine as the report's ``machines`` rows hold it: dollars in cents, the shares
    adding up to the machine's dollars."""
    return {**m.to_dict(), "usd": cents(m.usd), "shares": split_cents(m.usd, m.shares)}
