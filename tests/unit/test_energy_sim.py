"""Simulator accounting: carbon_kg and cost_per_gpu_hour from run pieces, zones and stand-ins,
the year shift onto the trace's dates; and a short simulation that reports them."""

from __future__ import annotations

import datetime as dt

import pytest

from broker.config.energy import parse_energy
from broker.energy.model import EnergyModel
from broker.sim.energy import RunPiece, SimEnergy, stand_in
from providers.carbon.csv import CsvCarbonSource, Series


def ts(*args: int) -> float:
    return dt.datetime(*args, tzinfo=dt.timezone.utc).timestamp()


def flat(zone: str, g: float, year: int = 2022) -> Series:
    start = ts(year, 1, 3)  # a Monday
    return Series(zone, tuple(start + 3600.0 * h for h in range(24 * 14)), (g,) * (24 * 14))


def test_stand_ins() -> None:
    have = ["BR", "ES", "NO", "US-CAL-CISO"]
    assert stand_in("US-MIDA-PJM", have) == "US-CAL-CISO"
    assert stand_in("NO-NO2", have) == "NO" and stand_in("DE", have) == "ES"
    assert stand_in("ES", have) == "ES"


def test_pieces_are_charged_by_site_zone_and_price() -> None:
    src = CsvCarbonSource([flat("US-CAL-CISO", 200.0), flat("ES", 100.0)])
    energy = parse_energy({"node_overhead": {"A100": 0.0}, "pue": {"aws": 1.0}, "sites": {
        "onprem": {"carbon_zone": "ES", "pue": 1.0, "price_per_gpu_hour": 1.0,
                   "electricity": {"periods": [{"name": "flat", "usd_per_kwh": 0.5}]}}}})
    origin = ts(2017, 9, 4)  # a Monday; the series are moved onto 2017
    acct = SimEnergy.for_trace(origin, src, energy)
    pieces = [RunPiece(0.0, 3600.0, 2, "A100-80GB", "onprem"),  # 0.8 kW for 1 h in ES
              RunPiece(0.0, 7200.0, 1, "A100-80GB", "aws:us-east-1:spot"),  # PJM: stand-in
              RunPiece(10.0, 10.0, 8, "A100-80GB", "onprem")]  # empty: ignored
    m = acct.metrics(pieces, cloud_cost_usd=6.0)
    # ES 0.8 kWh x 100 g + PJM (as CAISO) 0.8 kWh x 200 g
    assert m["carbon"]["by_zone_kg"] == {"ES": 0.08, "US-MIDA-PJM": 0.16}
    assert m["carbon_kg"] == pytest.approx(0.24)
    assert m["carbon"]["stand_ins"] == {"US-MIDA-PJM": "US-CAL-CISO"}
    # on-prem: 2 GPU-h x $1 + 0.8 kWh x $0.5; cloud $6; over 4 GPU-hours
    assert m["carbon"]["onprem_cost_usd"] == pytest.approx(2.4)
    assert m["cost_per_gpu_hour"] == pytest.approx((2.4 + 6.0) / 4)
    assert SimEnergy.for_trace(origin, src).metrics([])["cost_per_gpu_hour"] is None


def test_the_shift_follows_the_series_onto_the_trace() -> None:
    start = ts(2022, 1, 3)
    day, night = (300.0,) * 12, (100.0,) * 12
    src = CsvCarbonSource([Series("US-CAL-CISO", tuple(start + 3600.0 * h for h in range(336)),
                                  (day + night) * 14)])
    acct = SimEnergy.for_trace(ts(2017, 1, 2), src, parse_energy({}),
                               price_per_gpu_hour=0.0)
    first = acct.source.series["US-CAL-CISO"].start  # type: ignore[attr-defined]
    assert dt.datetime.fromtimestamp(first, dt.timezone.utc).weekday() == 0  # still Monday
    kw = EnergyModel().power_kw(1, "V100-32GB") * 1.55
    origin_offset = first - acct.origin  # where the series' first hour lands in trace time
    m = acct.metrics([RunPiece(origin_offset, origin_offset + 3600, 1, "V100-32GB", "onprem")])
    assert m["carbon_kg"] == pytest.approx(kw * 300 / 1000, abs=1e-3)  # the day value, 300


@pytest.mark.slow
def test_a_short_simulation_reports_carbon_and_cost() -> None:
    from broker.sim.run import SimRequest, simulate

    res = simulate(SimRequest(policies=("fcfs",), busiest_days=0.25, target_load=1.0))[0]
    m = res.metrics
    assert m["carbon_kg"] > 0 and m["carbon"]["by_zone_kg"].keys() == {"US-CAL-CISO"}
    assert m["cost_per_gpu_hour"] == pytest.approx(0.81)  # on-prem only, no tariff
    ran = sum(r.gpus * (r.end_s - r.first_start_s) for r in res.records
              if r.end_s is not None and r.first_start_s is not None and not r.preemptions)
    assert m["carbon"]["gpu_hours"] >= ran / 3600 - 0.01
