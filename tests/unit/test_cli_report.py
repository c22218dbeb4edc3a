"""``spillway report`` on a real Redis: a month of real records (an on-prem job, a cloud
machine billed by the ledger for another team's job, its node since forgotten, budgets of both
kinds) reported in each format, and bad options refused naming the option."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.cli import app
from broker.cycle.plan import Plan, Start
from broker.model import Allocation, Gpu, Instance, InstanceState, JobSpec, Node
from broker.money.ledger import accrue_store
from broker.store import open_store
from broker.store.base import BaseStore
from broker.store.budgets import Budget, Part, budget_book
from broker.store.events import Exited, Started
from tests.conftest import flushed_db

DB = 11  # the budget CLI test's database: each test flushes it before and after
CLOUD = "aws:eu-central-1:eu-central-1a:spot"
GCP = "gcp:europe-west4:europe-west4-a:ondemand"
CONFIG = "energy:\n  sites:\n    onprem: {carbon_zone: DE}\n"


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


DEC5 = ts("2026-12-05T00:00:00")


def node(node_id: str, model: str, count: int, site: str) -> Node:
    gpus = tuple(Gpu(f"{node_id}-g{i}", i, model, 80.0) for i in range(count))
    return Node(node_id, gpus, site=site, incarnation="i1")


def run_job(store: BaseStore, team: str, gpus: int, node_id: str, start: float,
            end: float) -> str:
    job = store.submit(JobSpec(command="true", gpus=gpus, team=team), start - 60)
    gpu_ids = tuple(f"{node_id}-g{i}" for i in range(gpus))
    applied = store.apply(Plan(starts=(Start(job.id, job.attempt, job.version,
                                             (Allocation(node_id, gpu_ids),)),)), start)
    assert [j.id for j in applied.started] == [job.id]
    store.report(job.id, job.attempt, Started(0), start)
    store.report(job.id, job.attempt, Exited(0, 0), end)
    return job.id


def seed(url: str) -> None:
    """November 2026: vision runs 2 A100s on-prem for 10 h on the 2nd and is charged $40 on
    GCP on the 20th; nlp runs 1 V100 for 3 h on the 3rd on a spot machine at $1/h that the
    ledger bills (the machine given back and its node forgotten since)."""
    store = open_store(url)
    book = budget_book(store)
    book.set(Budget("vision", 1000.0, "month"), "test", ts("2026-10-01T00:00:00"))
    book.set(Budget("nlp", 10.0, "week", hard=False), "test", ts("2026-10-01T00:00:00"))
    t0, t1 = ts("2026-11-02T08:00:00"), ts("2026-11-03T10:00:00")
    store.heartbeat(node("n1", "A100-80GB", 8, "onprem"), 1e9, t0)
    run_job(store, "vision", 2, "n1", t0, t0 + 10 * 3600)
    store.heartbeat(node("c1", "V100-16GB", 1, CLOUD), 60.0, t1)
    job = run_job(store, "nlp", 1, "c1", t1, t1 + 3 * 3600)
    store.record_instances([Instance("r-1", f"{CLOUD}/p3.2xlarge", requested_at=t1 - 60,
                                     price_per_hour=1.0, for_jobs=(job,))])
    store.move_instance("r-1", InstanceState.BOOTING, t1, "listed")
    store.move_instance("r-1", InstanceState.READY, t1, "registered", node_id="c1")
    store.move_instance("r-1", InstanceState.TERMINATED, t1 + 3 * 3600, "idle")
    accrue_store(store, book, t1 + 4 * 3600)
    store.expire(t1 + 4 * 3600)
    assert store.forget_node("c1")
    book.charge("r-2", 0, [Part("vision", 40.0, 3600.0, 0.0, GCP, "2026-11-20")],
                ts("2026-11-20T05:00:00"))


@pytest.fixture
def url(redis_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    for var in ("SPILLWAY_REDIS_URL", "SPILLWAY_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    (tmp_path / "config.yaml").write_text(CONFIG)
    for u in flushed_db(redis_url, DB):
        seed(u)
        yield u


def cli(url: str, tmp: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["--redis-url", url, "--config", str(tmp / "config.yaml"),
                                      "report", "--now", str(DEC5), *args],
                                catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


# the energy model's figures (docs/carbon.md): A100 400 W x (1 + 1.03) x PUE 1.55 on-prem,
# V100 300 W x (1 + 0.46) x PUE 1.15 on AWS; both in DE (315 g/kWh, its yearly average)
ONPREM_KG = 2 * 0.400 * 2.03 * 1.55 * 10 * 315 / 1000
CLOUD_KG = 1 * 0.300 * 1.46 * 1.15 * 3 * 315 / 1000


def test_json(url: str, tmp_path: Path) -> None:
    code, out, _ = cli(url, tmp_path, "--month", "2026-11", "--format", "json")
    assert code == 0
    r = json.loads(out)
    teams = {t["team"]: t for t in r["teams"]}
    v, n = teams["vision"], teams["nlp"]
    assert (v["cap_usd"], v["cloud_usd"], v["left_usd"], v["used_pct"]) == \
        (1000.0, 40.0, 960.0, 4.0)
    assert v["onprem_usd"] == pytest.approx(2 * 10 * 0.81) and v["gpu_hours"] == 20.0
    assert v["kg_co2e"] == pytest.approx(ONPREM_KG, abs=1e-3)
    assert (n["cloud_usd"], n["gpu_hours"], n["hard"]) == (3.0, 3.0, False)
    assert n["cap_usd"] == pytest.approx(10.0 * 30 / 7, abs=0.01)
    assert n["cap_basis"] == "prorated from $10.00 per week"
    assert n["kg_co2e"] == pytest.approx(CLOUD_KG, abs=1e-3)
    sites = {s["site"]: s for s in r["sites"]}
    assert sites[CLOUD]["zone"] == "DE" and sites[CLOUD]["gpu_hours"] == 3.0  # (node gone)
    assert sites[GCP]["cloud_usd"] == 40.0 and sites["onprem"]["onprem_usd"] == 16.2
    assert [z["zone"] for z in r["zones"]] == ["DE"]
    assert r["window"]["closed"] and r["forecast"]["how"] == "closed: the actual spend"
    assert r["carbon_source"] == "static yearly averages"
    # the machine behind nlp's $3 (its node forgotten; r-2's $40 has no instance record)
    [m] = r["machines"]
    assert {k: m[k] for k in ("request_id", "provider", "region", "instance_type", "market",
                              "gpus", "start", "end", "seconds", "price_per_hour", "usd",
                              "shares", "running")} == {
        "request_id": "r-1", "provider": "aws", "region": "eu-central-1",
        "instance_type": "p3.2xlarge", "market": "spot", "gpus": 1,
        "start": "2026-11-03T10:00:00Z", "end": "2026-11-03T13:00:00Z", "seconds": 10800.0,
        "price_per_hour": 1.0, "usd": 3.0, "shares": {"nlp": 3.0}, "running": False}
    assert r["totals"]["machines_usd"] == 3.0
    assert any("machines listed account for $3.00 of the $43.00" in n for n in r["notes"])


def test_csv_by_site_and_a_team(url: str, tmp_path: Path) -> None:
    code, out, _ = cli(url, tmp_path, "--month", "2026-11", "--by", "site", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and list(rows[0]) == ["site", "cloud_usd", "onprem_usd", "gpu_hours",
                                           "kg_co2e"]
    assert {r["site"]: float(r["cloud_usd"]) for r in rows} == {CLOUD: 3.0, GCP: 40.0,
                                                                "onprem": 0.0}
    code, out, _ = cli(url, tmp_path, "--week", "2026-W45", "--team", "nlp", "--format",
                       "csv")
    [row] = list(csv.DictReader(io.StringIO(out)))
    assert (row["team"], row["cap_usd"], row["cap_basis"], row["used_pct"]) == \
        ("nlp", "10.0", "weekly", "30.0")


def test_table_by_day(url: str, tmp_path: Path) -> None:
    code, out, _ = cli(url, tmp_path, "--from", "2026-11-01", "--to", "2026-11-07", "--by",
                       "day")
    assert code == 0
    assert "Spend report 2026-11-01..2026-11-07 (range: 2026-11-01 to 2026-11-07, 7 day(s)" \
        in out
    assert re.search(r"2026-11-02\s+0\.00\s+16\.20\s+20\.0\s+7\.9", out), out
    assert re.search(r"2026-11-03\s+3\.00\s+0\.00\s+3\.0\s+0\.5", out), out
    assert "Forecast: closed: the actual spend" in out and "prorated from $1,000.00" in out


def test_html_to_a_file(url: str, tmp_path: Path) -> None:
    page = tmp_path / "nov.html"
    code, out, err = cli(url, tmp_path, "--month", "2026-11", "--format", "html", "--out",
                         str(page))
    assert code == 0 and out == "" and "wrote the html report of 2026-11" in err
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.count('class="spend"') == 2
    assert html.count('class="cap"') == 2 and html.count('class="bar"') == 3 + 1
    assert not re.search(r"""(src|href)\s*=|<script|@import|url\(""", html)


@pytest.mark.parametrize("args,field,allowed", [
    (("--by", "zone"), "--by", "team, site, day"),
    (("--format", "pdf"), "--format", "table, csv, json, html"),
    (("--forecast", "ml"), "--forecast", "mean, linear"),
    (("--month", "2026-13"), "--month", "YYYY-MM"),
    (("--week", "2026-W60"), "--week", "weeks 01 to 53"),
    (("--from", "2026-11-01"), "--to", "--from and --to together"),
    (("--month", "2026-11", "--week", "2026-W45"), "window", "one of --month"),
    (("--team", "visoin"), "--team", "nlp, vision"),
])
def test_bad_options_name_the_field(url: str, tmp_path: Path, args: tuple[str, ...],
                                    field: str, allowed: str) -> None:
    code, out, err = cli(url, tmp_path, *args)
    flat = " ".join(err.split())
    assert code == 2 and out == "" and "Traceback" not in err
    assert field in flat and allowed in flat, err


def test_unwritable_out_file(url: str, tmp_path: Path) -> None:
    code, _, err = cli(url, tmp_path, "--format", "csv", "--out",
                       str(tmp_path / "no" / "such" / "dir.csv"))
    assert code == 1 and "--out: cannot write" in err


def test_emissions_from_a_csv_carbon_source(url: str, tmp_path: Path) -> None:
    """With a CSV source (the shipped 2022 series moved onto 2026) the on-prem run's
    emissions follow the hourly series of its zone; a zone the series lack (DE, the AWS
    machine's) falls back to its yearly average, and the report says so."""
    from broker.config.energy import CarbonSettings, build_source
    from broker.energy.model import EnergyModel
    from providers.carbon.base import integrate
    from providers.carbon.csv import SHIPPED_2022

    carbon = f"carbon: {{source: csv, files: ['{SHIPPED_2022}'], shift_to_year: 2026}}\n"
    (tmp_path / "config.yaml").write_text(CONFIG.replace("DE", "ES") + carbon)
    code, out, _ = cli(url, tmp_path, "--month", "2026-11", "--format", "json")
    assert code == 0
    r = json.loads(out)
    src = build_source(CarbonSettings("csv", {"files": [str(SHIPPED_2022)],
                                              "shift_to_year": 2026}))
    a = ts("2026-11-02T08:00:00")
    grams_h = integrate(src.actual("ES", a, a + 36000), a, a + 36000) / 3600  # g/kWh x h
    kw = EnergyModel().power_kw(2, "A100-80GB") * 1.55
    zones = {z["zone"]: z["kg_co2e"] for z in r["zones"]}
    assert zones["ES"] == pytest.approx(kw * grams_h / 1000, abs=1e-3)
    assert zones["ES"] != pytest.approx(kw * 10 * 167 / 1000, abs=0.01)  # not the average
    assert zones["DE"] == pytest.approx(CLOUD_KG, abs=1e-3)
    assert any("no data for zone(s) DE" in n for n in r["notes"])
