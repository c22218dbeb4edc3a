"""The spend report's aggregation (broker/money/report.py) and its window options
(broker/money/report_window.py), table-driven on hand-made charges, runs and budgets."""

from __future__ import annotations

import io
import json
import re
from datetime import datetime, timezone

import pytest
from rich.console import Console

from broker.money.ledger_report import MachineCharge
from broker.money.report import (
    Charge,
    Inputs,
    Run,
    build,
    day_pieces,
    forecast,
    machines_of,
    prorated_cap,
)
from broker.money.report_window import ReportError, Window, parse_window
from broker.store.budgets import Budget

AWS = "aws:us-east-1:us-east-1a:spot"
GCP = "gcp:europe-west4:europe-west4-a:ondemand"


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def emit(site: str, gpus: float, model: str, a: float, b: float
         ) -> tuple[str, float | None, float]:
    """1 kWh and 0.5 kg per GPU-hour; zone by provider, none for 'unknown'."""
    kwh = gpus * (b - a) / 3600.0
    zone = {"onprem": "DE", "aws": "US-MIDA-PJM", "gcp": "NL"}.get(site.split(":")[0], "")
    return zone, (0.5 * kwh if zone else None), kwh


def chargeback(site: str, gpus: float, model: str, a: float, b: float) -> float:
    return gpus * (b - a) / 3600.0 * 2.0  # $2 per on-prem GPU-hour


NOV = parse_window("2026-11", None, None, None, 0)
CLOSED = ts("2026-12-05T00:00:00")


def run(team: str, site: str, start: str, end: str, gpus: float = 1) -> Run:
    return Run(team, site, "A100-80GB", gpus, ts(start), ts(end))


def report(charges: list[Charge] = (), runs: list[Run] = (),  # type: ignore[assignment]
           budgets: dict[str, Budget] | None = None, now: float = CLOSED,
           window: Window = NOV, by: str = "team", method: str = "mean",
           **kw: object) -> dict:  # type: ignore[type-arg]
    inputs = Inputs(window, now, charges, runs, budgets or {}, **kw)  # type: ignore[arg-type]
    return build(inputs, emit, chargeback, by, method)


# -- windows -----------------------------------------------------------------------------------


@pytest.mark.parametrize("args,label,first,last", [
    (("2026-11", None, None, None), "2026-11", "2026-11-01", "2026-11-30"),
    (("2024-02", None, None, None), "2024-02", "2024-02-01", "2024-02-29"),
    (("2026-12", None, None, None), "2026-12", "2026-12-01", "2026-12-31"),
    ((None, "2026-W47", None, None), "2026-W47", "2026-11-16", "2026-11-22"),
    ((None, "2026w01", None, None), "2026-W01", "2025-12-29", "2026-01-04"),
    ((None, None, "2026-11-03", "2026-11-03"), "2026-11-03..2026-11-03", "2026-11-03",
     "2026-11-03"),
    ((None, None, None, None), "2026-11", "2026-11-01", "2026-11-30"),  # now's month
])
def test_windows(args: tuple[str | None, ...], label: str, first: str, last: str) -> None:
    w = parse_window(*args, now=ts("2026-11-20T10:00:00"))  # type: ignore[arg-type]
    assert (w.label, w.first.isoformat(), w.last.isoformat()) == (label, first, last)
    assert w.end - w.start == len(w.days) * 86400.0 and w.days[0] == first


@pytest.mark.parametrize("args,field,allowed", [
    (("2026-13", None, None, None), "--month", "YYYY-MM"),
    (("Nov", None, None, None), "--month", "YYYY-MM"),
    ((None, "2026-W54", None, None), "--week", "weeks 01 to 53 in 2026"),
    ((None, "47", None, None), "--week", "YYYY-Www"),
    ((None, None, "2026-11-31", "2026-12-01"), "--from", "YYYY-MM-DD"),
    ((None, None, "2026-11-05", "2026-11-01"), "--to", "on or after --from"),
    ((None, None, "2026-11-05", None), "--to", "--from and --to together"),
    (("2026-11", "2026-W47", None, None), "window", "one of --month, --week"),
    (("9999-12", None, None, None), "--month", "before 9999-12-31"),  # no midnight after it
    ((None, None, "9999-12-01", "9999-12-31"), "--to", "before 9999-12-31"),
])
def test_bad_windows_name_the_option(args: tuple[str | None, ...], field: str,
                                     allowed: str) -> None:
    with pytest.raises(ReportError) as e:
        parse_window(*args, now=0)  # type: ignore[arg-type]
    assert e.value.field == field and allowed in e.value.allowed


def test_bad_grouping_and_method() -> None:
    with pytest.raises(ReportError, match="--by"):
        report(by="zone")
    with pytest.raises(ReportError, match="--forecast"):
        report(method="prophet")


# -- sums --------------------------------------------------------------------------------------


def test_a_month_with_no_spend() -> None:
    r = report(budgets={"vision": Budget("vision", 1000.0)})
    assert r["totals"] == {"cloud_usd": 0.0, "onprem_usd": 0.0, "gpu_hours": 0.0,
                           "kg_co2e": 0.0, "forecast_usd": 0.0, "energy_kwh": 0.0,
                           "machines_usd": 0.0}
    [row] = r["teams"]
    assert (row["cap_usd"], row["left_usd"], row["used_pct"]) == (1000.0, 1000.0, 0.0)
    assert r["sites"] == [] and r["zones"] == [] and len(r["days"]) == 30
    assert report(by="day")["rows"][0] == {"key": "2026-11-01", "cloud_usd": 0.0,
                                           "onprem_usd": 0.0, "gpu_hours": 0.0, "kg_co2e": 0.0}


CHARGES = [
    Charge("vision", AWS, "2026-10-31", 500.0),  # before the window
    Charge("vision", AWS, "2026-11-01", 10.0),  # its first day
    Charge("vision", GCP, "2026-11-01", 5.0),
    Charge("nlp", AWS, "2026-11-15", 20.0),
    Charge("vision", AWS, "2026-11-30", 30.0),  # its last day
    Charge("nlp", AWS, "2026-12-01", 700.0),  # after it
]


@pytest.mark.parametrize("by,expected", [
    ("team", {"nlp": 20.0, "vision": 45.0}),
    ("site", {AWS: 60.0, GCP: 5.0}),
    ("day", {"2026-11-01": 15.0, "2026-11-15": 20.0, "2026-11-30": 30.0}),
])
def test_charges_inside_the_window_by_team_site_and_day(by: str,
                                                       expected: dict[str, float]) -> None:
    r = report(CHARGES, by=by)
    got = {row["key"]: row["cloud_usd"] for row in r["rows"] if row["cloud_usd"]}
    assert got == expected
    assert r["totals"]["cloud_usd"] == 65.0
    if by == "day":
        assert len(r["rows"]) == 30  # every day, spent or not


def test_team_filter() -> None:
    r = report(CHARGES, team="nlp", by="site")
    assert [(x["key"], x["cloud_usd"]) for x in r["rows"]] == [(AWS, 20.0)]
    assert [t["team"] for t in r["teams"]] == ["nlp"]


def test_runs_are_clipped_to_the_window_and_split_at_midnight() -> None:
    runs = [run("vision", "onprem", "2026-10-31T22:00:00", "2026-11-01T02:00:00", gpus=2),
            run("vision", AWS, "2026-11-30T23:00:00", "2026-12-01T05:00:00"),
            run("nlp", "unknown", "2026-11-10T00:00:00", "2026-11-10T03:00:00")]
    r = report(runs=runs, by="day")
    days = {x["key"]: x for x in r["rows"] if x["gpu_hours"]}
    assert days["2026-11-01"] == {"key": "2026-11-01", "cloud_usd": 0.0, "onprem_usd": 8.0,
                                  "gpu_hours": 4.0, "kg_co2e": 2.0}
    assert days["2026-11-30"]["gpu_hours"] == 1.0 and days["2026-11-30"]["onprem_usd"] == 0
    assert days["2026-11-10"]["kg_co2e"] == 0.0  # no zone: not counted, and said
    assert r["totals"]["gpu_hours"] == 8.0 and r["totals"]["kg_co2e"] == 2.5
    assert {z["zone"]: z["kg_co2e"] for z in r["zones"]} == {"DE": 2.0, "US-MIDA-PJM": 0.5,
                                                             "unknown": 0.0}
    assert any("3.00 GPU-hours" in n for n in r["notes"])
    by_site = {s["site"]: (s["zone"], s["onprem_usd"]) for s in r["sites"]}
    assert by_site == {"onprem": ("DE", 8.0), AWS: ("US-MIDA-PJM", 0.0),
                       "unknown": ("", 0.0)}


def test_a_run_still_open_counts_up_to_now() -> None:
    now = ts("2026-11-10T12:00:00")
    r = report(runs=[run("vision", "onprem", "2026-11-10T00:00:00", "2026-11-10T23:00:00")],
               now=now)
    assert r["totals"]["gpu_hours"] == 12.0


def test_day_pieces() -> None:
    assert [d for d, _, _ in day_pieces(ts("2026-11-01T23:00:00"),
                                        ts("2026-11-03T00:00:01"))] == \
        ["2026-11-01", "2026-11-02", "2026-11-03"]


# -- caps --------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget,window,cap,basis", [
    (Budget("t", 3000.0, "month"), ("2026-11", None, None, None), 3000.0, "monthly"),
    (Budget("t", 700.0, "week"), (None, "2026-W47", None, None), 700.0, "weekly"),
    (Budget("t", 3000.0, "month"), (None, "2026-W47", None, None), 700.0, "prorated"),
    (Budget("t", 700.0, "week"), ("2026-11", None, None, None), 3000.0, "prorated"),
    # a range over two months: 2 days of a 30-day month, 3 of a 31-day one
    (Budget("t", 3100.0, "month"), (None, None, "2026-11-29", "2026-12-03"),
     3100.0 * (2 / 30 + 3 / 31), "prorated"),
    (Budget("t", 50.0, "total"), ("2026-11", None, None, None), 50.0, "total"),
])
def test_caps_over_windows(budget: Budget, window: tuple[str | None, ...], cap: float,
                          basis: str) -> None:
    got, how = prorated_cap(budget, parse_window(*window, now=0))  # type: ignore[arg-type]
    assert got == pytest.approx(cap) and how.startswith(basis)


def test_spend_against_caps() -> None:
    budgets = {"vision": Budget("vision", 100.0, "month"),
               "nlp": Budget("nlp", 50.0, "total", hard=False)}
    now = ts("2026-11-16T00:00:00")  # 15 of 30 days
    r = report([Charge("vision", AWS, "2026-11-02", 40.0), Charge("nlp", AWS, "2026-11-03",
                                                                   10.0)],
               budgets=budgets, now=now, reserved={"vision": 5.0, "nlp": 1.0},
               spent_total={"nlp": 30.0})
    rows = {x["team"]: x for x in r["teams"]}
    v, n = rows["vision"], rows["nlp"]
    assert (v["cap_usd"], v["cloud_usd"], v["reserved_usd"], v["left_usd"]) == \
        (100.0, 40.0, 5.0, 55.0)
    assert (v["used_pct"], v["forecast_usd"], v["forecast_pct"]) == (40.0, 80.0, 80.0)
    # a total cap counts all spend to date (30), the window's 10 of it forecast to 20
    assert (n["left_usd"], n["used_pct"], n["forecast_pct"], n["hard"]) == \
        (19.0, 60.0, 80.0, False)
    # a past window holds no reservations
    past = {x["team"]: x for x in report(budgets=budgets, reserved={"vision": 5.0},
                                         window=parse_window("2026-10", None, None, None, 0)
                                         )["teams"]}
    assert past["vision"]["reserved_usd"] == 0.0 and past["vision"]["left_usd"] == 100.0


# -- forecasts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("daily,now,method,expected,how", [
    ([10.0] * 5 + [0.0] * 25, "2026-11-06T00:00:00", "mean", 300.0, "mean"),
    ([10.0] * 5 + [0.0] * 25, "2026-11-06T00:00:00", "linear", 300.0, "linear"),
    # a ramp 1, 2, 3, 4 per day: the line goes on rising (5 + 6 + ... + 30 more)
    ([1.0, 2.0, 3.0, 4.0] + [0.0] * 26, "2026-11-05T00:00:00", "linear", 465.0, "linear"),
    ([1.0, 2.0, 3.0, 4.0] + [0.0] * 26, "2026-11-05T00:00:00", "mean", 75.0, "mean"),
    # a fall to nothing stays at nothing (never negative)
    ([4.0, 2.0, 0.0] + [0.0] * 27, "2026-11-04T00:00:00", "linear", 6.0, "linear"),
    ([3.0] + [0.0] * 29, "2026-11-01T12:00:00", "linear", 180.0, "mean daily spend (linear"),
    ([5.0] * 30, "2026-12-02T00:00:00", "mean", 150.0, "closed"),
    ([0.0] * 30, "2026-10-02T00:00:00", "mean", 0.0, "not started"),
])
def test_forecasts(daily: list[float], now: str, method: str, expected: float,
                   how: str) -> None:
    got, said = forecast(daily, NOV, ts(now), method)
    assert got == pytest.approx(expected) and said.startswith(how)


def test_the_report_says_its_forecast_method() -> None:
    r = report([Charge("vision", AWS, "2026-11-02", 30.0)], now=ts("2026-11-11T00:00:00"))
    assert r["forecast"] == {"method": "mean",
                             "how": "mean daily spend: $3.00/day over 10.00 days"}
    assert r["totals"]["forecast_usd"] == 90.0
    cum = [d["cumulative"]["vision"] for d in r["days"]]
    assert cum[0] == 0.0 and cum[1] == 30.0 and cum[-1] == 30.0


def test_a_web_carbon_source_is_not_called_for_past_windows() -> None:
    from dataclasses import replace

    from broker.config.core import Config
    from broker.config.energy import parse_carbon
    from broker.money.report_data import emitter

    cfg = replace(Config(), carbon=parse_carbon({"source": "electricitymaps", "token": "t",
                                                  "url": "http://127.0.0.1:9"}))
    em, notes = emitter(cfg)
    assert em.source.name == "static yearly averages" and "yearly averages" in notes[0]
    zone, kg, kwh = em("aws:eu-central-1:eu-central-1a:spot", 1, "V100-16GB", 0.0, 3600.0)
    assert (zone, kg) == ("DE", pytest.approx(kwh * 315 / 1000))
    assert em("onprem", 1, "V100-16GB", 0.0, 3600.0)[:2] == ("", None)  # no zone set


def test_html_and_csv_carry_names_as_data() -> None:
    from broker.money.report_html import to_html
    from broker.money.report_render import to_csv

    odd = "x<script>&\"'"
    r = report([Charge(odd, AWS, "2026-11-02", 1.0)], budgets={odd: Budget(odd, 10.0)},
               now=ts("2026-11-10T00:00:00"))
    page = to_html(r)
    assert "<script" not in page and "x&lt;script&gt;&amp;" in page
    assert page.count('class="spend"') == 1 and page.count('class="forecast"') == 1
    assert to_csv(r).splitlines()[1].startswith('"x<script>&""\'",1.0,0.0')


# -- money printed, and the machines behind it ---------------------------------------------------


def machine(rid: str, shares: dict[str, float]) -> MachineCharge:
    return MachineCharge(rid, f"i-{rid}", f"{AWS}/p3.8xlarge", 4, 3.672, ts("2026-11-05"),
                         ts("2026-11-05T06:00:00"), 21600.0, False, shares)


def test_no_money_prints_a_negative_zero() -> None:
    """A reservation used up to a float's rounding leaves -1e-15 reserved: 0.00 everywhere."""
    from broker.money.report_html import to_html
    from broker.money.report_render import renderable, to_csv

    r = report([Charge("vision", AWS, "2026-11-02", 1.0)],
               budgets={"vision": Budget("vision", 1.0)}, now=ts("2026-11-10T00:00:00"),
               reserved={"vision": -1e-15})
    v = r["teams"][0]
    assert (v["reserved_usd"], v["left_usd"]) == (0.0, 0.0)
    assert "-0.0" not in json.dumps(r)
    console = Console(width=250, file=io.StringIO(), no_color=True)
    console.print(renderable(r))
    for text in (console.file.getvalue(), to_html(r), to_csv(r)):  # type: ignore[attr-defined]
        assert not re.search(r"-\$?0\.0", text), text


def test_machines_of_a_team_hold_its_shares_only() -> None:
    ms = [machine("r-1", {"vision": 13.158, "nlp": 9.486}), machine("r-2", {"nlp": 1.0})]
    charges = [Charge("vision", AWS, "2026-11-05", 13.158),
               Charge("nlp", AWS, "2026-11-05", 10.486)]
    r = report(charges, machines=ms)
    assert [m["shares"] for m in r["machines"]] == [{"nlp": 9.48, "vision": 13.16},
                                                    {"nlp": 1.0}]
    assert [m["usd"] for m in r["machines"]] == [22.64, 1.0]
    assert r["machines"][0]["market"] == "spot" and r["totals"]["machines_usd"] == 23.64
    assert not any("machines listed" in n for n in r["notes"])
    r = report(charges, machines=ms, team="vision")
    assert [(m["request_id"], m["shares"], m["usd"]) for m in r["machines"]] == \
        [("r-1", {"vision": 13.16}, 13.16)]
    assert machines_of(ms, {"nlp"})[0].shares == {"nlp": 9.486}
    r = report(charges[:1], machines=ms[1:])  # $13.16 with no machine behind it
    assert any("machines listed account for $1.00 of the $13.16 of cloud spend" in n
               for n in r["notes"])


def test_a_finance_tokens_report_holds_its_teams_shares_of_machines() -> None:
    pytest.importorskip("fastapi")
    from broker.api.reports import only

    inputs = Inputs(NOV, CLOSED, machines=[machine("r-1", {"vision": 2.0, "nlp": 1.0}),
                                           machine("r-2", {"nlp": 1.0})])
    assert [(m.request_id, m.shares) for m in only(inputs, {"vision"}).machines] == \
        [("r-1", {"vision": 2.0})]
