"""The energy model, emissions integrated over a run, on-prem electricity prices, the zone of a
site, and the energy/carbon configuration sections."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from broker.config.energy import build_source, parse_carbon, parse_energy
from broker.energy.model import EnergyModel, emissions_kg
from broker.energy.prices import PriceSeries, TimeOfUseTariff
from broker.errors import ConfigError
from providers.carbon.csv import SHIPPED_2022, CsvCarbonSource, Series
from providers.catalog.zones import site_zone


def ts(*args: int) -> float:
    return dt.datetime(*args, tzinfo=dt.timezone.utc).timestamp()


def test_power_figures_and_overrides() -> None:
    m = EnergyModel()
    # 8 x A100 SXM (400 W) with the DGX A100 host share (1.03): 6.5 kW, its maximum power
    assert m.power_kw(8, "A100-80GB") == pytest.approx(6.496)
    assert m.power_kw(1, "T4-16GB") == pytest.approx(0.070 * 1.5)
    assert m.site_pue("onprem") == 1.55 and m.site_pue("gcp:us-east1:us-east1-c:spot") == 1.10
    tuned = EnergyModel(utilisation=0.5, gpu_power_w={"A100-40GB": 250}, node_overhead={
        "A100": 0.0}, pue={"aws:us-east-1": 1.2, "aws": 1.3})
    assert tuned.power_kw(2, "A100-40GB") == pytest.approx(0.25)
    assert tuned.site_pue("aws:us-east-1:spot") == 1.2 and tuned.site_pue("aws:eu:spot") == 1.3
    assert tuned.energy_kwh(2, "A100-40GB", "aws:us-east-1:spot", 7200) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="utilisation 0 is not allowed"):
        EnergyModel(utilisation=0)
    with pytest.raises(ValueError, match=r"pue.onprem: 0.9 is not allowed; use a ratio >= 1"):
        EnergyModel(pue={"onprem": 0.9})


def test_emissions_integrate_the_intensity_over_the_run() -> None:
    start = ts(2022, 1, 3)
    src = CsvCarbonSource([Series("DE", (start, start + 3600), (100.0, 300.0))],
                          forecast_error=0.5, seed=1)
    m = EnergyModel(node_overhead={"V100": 0.0}, pue={"onprem": 1.0})
    # 1 kW (4 x 250 W)... here 1 x 300 W: 0.3 kW for 30 min at 100 and 30 min at 300 g/kWh
    kg = emissions_kg(m, src, "DE", "onprem", start + 1800, start + 5400, 1, "V100-32GB")
    assert kg == pytest.approx(0.3 * (0.5 * 100 + 0.5 * 300) / 1000)  # the true series,
    # not the noisy forecast
    assert emissions_kg(m, src, "DE", "onprem", start, start, 1, "V100-32GB") == 0.0


def test_time_of_use_tariff_and_price_series(tmp_path: Path) -> None:
    tariff = TimeOfUseTariff.parse({"timezone": "Europe/Berlin", "periods": [
        {"name": "peak", "usd_per_kwh": 0.30, "days": ["mon", "tue", "wed", "thu", "fri"],
         "from": "08:00", "to": "20:00"},
        {"name": "night", "usd_per_kwh": 0.10, "from": "22:00", "to": "06:00"},
        {"name": "shoulder", "usd_per_kwh": 0.20}]})
    monday = ts(2022, 1, 3)  # 01:00 in Berlin (UTC+1)
    assert tariff.period_at(monday).name == "night"
    assert tariff.period_at(monday + 7 * 3600).name == "peak"  # 08:00 local
    assert tariff.period_at(monday + 6 * 3600).name == "shoulder"  # 07:00
    assert tariff.period_at(ts(2022, 1, 8, 12)).name == "shoulder"  # Saturday noon
    # 1 kW from 04:00 to 09:00 UTC = 05:00-10:00 local: 1 h night, 2 h shoulder, 2 h peak
    assert tariff.cost(1.0, monday + 4 * 3600, monday + 9 * 3600) == pytest.approx(
        0.1 + 0.4 + 0.6)
    with pytest.raises(ValueError, match=r"periods\[0\].from: '8am' is not a time of day"):
        TimeOfUseTariff.parse({"periods": [{"name": "x", "usd_per_kwh": 1, "from": "8am"}]})
    with pytest.raises(ValueError, match="no tariff period covers"):
        TimeOfUseTariff.parse({"periods": [{"name": "x", "usd_per_kwh": 1, "to": "12:00"}]}
                              ).price_at(ts(2022, 1, 3, 13))
    csv_file = tmp_path / "prices.csv"
    csv_file.write_text("time,usd_per_kwh\n2022-01-03T00:00Z,0.1\n2022-01-03T01:00Z,0.5\n")
    series = PriceSeries.read(csv_file)
    assert series.cost(2.0, ts(2022, 1, 3, 0, 30), ts(2022, 1, 3, 1, 30)) == pytest.approx(0.6)


def test_site_zone() -> None:
    assert site_zone("aws:us-west-1:spot") == "US-CAL-CISO"
    assert site_zone("gcp:us-east1:us-east1-c:ondemand") == "US-CAR-SC"
    assert site_zone("onprem") == ""
    assert site_zone("onprem", {"onprem": "DE"}) == "DE"


def test_energy_and_carbon_sections(tmp_path: Path) -> None:
    settings = parse_energy({"utilisation": 0.8, "pue": {"aws": 1.2}, "sites": {"onprem": {
        "carbon_zone": "ES", "pue": 1.3, "price_per_gpu_hour": 0.9,
        "electricity": {"periods": [{"name": "flat", "usd_per_kwh": 0.12}]}}}})
    assert settings.model.site_pue("onprem") == 1.3 and settings.zones() == {"onprem": "ES"}
    site = settings.sites["onprem"]
    assert site.electricity is not None and site.electricity.price_at(0) == 0.12
    for raw, message in [
        ({"utilisaton": 1}, "config energy.utilisaton: not a setting; did you mean utilisation"),
        ({"utilisation": 2}, "config energy.utilisation: 2 is not allowed"),
        ({"sites": {"onprem": {"pue": 0.5}}}, "config energy.sites.onprem.pue: 0.5 is not "
                                             "allowed; use a ratio >= 1"),
        ({"sites": {"onprem": {"electricity": {"series": str(tmp_path / "x.csv")}}}},
         "config energy.sites.onprem.electricity.series: price series"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_energy(raw)
    carbon = parse_carbon({"source": "csv", "files": [str(SHIPPED_2022)], "shift_to_year": 2017,
                           "forecast_error": 0.05, "seed": 2})
    src = build_source(carbon)
    assert src.zones == ["BR", "ES", "NO", "US-CAL-CISO"] and src.series["ES"].year == 2017
    web = build_source(parse_carbon({"source": "uk-carbon-intensity", "timeout_s": 2}))
    assert web.name == "uk-carbon-intensity" and web.timeout_s == 2
    for raw, message in [
        ({"source": "mystery"}, "config carbon.source: 'mystery' is not one of csv"),
        ({"source": "csv"}, "a csv source needs files"),
        ({"source": "watttime", "token": "x"}, "config carbon.token: not a setting"),
        ({"source": "csv", "dir": "/nowhere"}, None),
    ]:
        if message is None:
            with pytest.raises(ConfigError, match="directory /nowhere does not exist"):
                build_source(parse_carbon(raw))
            continue
        with pytest.raises(ConfigError, match=message):
            parse_carbon(raw)


def test_the_configuration_file_takes_both_sections(tmp_path: Path) -> None:
    from broker.config.core import load_config

    path = tmp_path / "config.yaml"
    path.write_text("energy:\n  sites:\n    onprem: {carbon_zone: DE, pue: 1.2}\n"
                    "carbon:\n  source: electricitymaps\n  token: abc\n  timeout_s: 3\n")
    cfg = load_config(path, env={})
    assert cfg.energy.zones() == {"onprem": "DE"} and cfg.energy.model.site_pue("onprem") == 1.2
    assert cfg.carbon.source == "electricitymaps" and cfg.carbon.timeout_s == 3.0
    assert load_config(None, env={}).carbon.source == ""  # none configured
    path.write_text("energy:\n  sites:\n    onprem: {carbon_zon: DE}\n")
    with pytest.raises(ConfigError, match=r"energy.sites.onprem.carbon_zon: not a setting; "
                                          r"did you mean carbon_zone"):
        load_config(path, env={})
