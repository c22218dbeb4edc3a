"""CsvCarbonSource: both CSV formats, zones, the year shift, wrapping, the noisy forecast."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from providers.carbon import CarbonDataError, CarbonSource, CsvCarbonSource, mean_intensity
from providers.carbon.base import integrate
from providers.carbon.csv import year_offset

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
EM_HEADER = ("Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),"
             "Carbon Intensity gCO₂eq/kWh (LCA),Low Carbon Percentage,Renewable Percentage,"
             "Data Source,Data Estimated,Data Estimation Method\n")


def ts(*args: int) -> float:
    return dt.datetime(*args, tzinfo=dt.timezone.utc).timestamp()


def em_file(tmp_path: Path, zone: str = "ES", year: int = 2022, hours: int = 24 * 21) -> Path:
    p = tmp_path / f"{zone}_{year}_hourly.csv"
    start = ts(year, 1, 1)
    rows = [f"{dt.datetime.fromtimestamp(start + h * 3600, dt.timezone.utc):%Y-%m-%d %H:%M:%S},"
            f"Spain,Spain,{zone},{100 + h % 24},{200 + h % 24},70,40,entsoe.eu,false,\n"
            for h in range(hours)]
    p.write_text(EM_HEADER + "".join(rows), encoding="utf-8")
    return p


def lwa_file(tmp_path: Path, name: str = "ger_ci.csv") -> Path:
    p = tmp_path / name
    p.write_text("Time,Carbon Intensity\n2020-03-02 00:00:00,300.0\n2020-03-02 00:15:00,310.0\n"
                 "2020-03-02 00:30:00,320.0\n2020-03-02 00:45:00,330.0\n")
    return p


def test_both_formats_and_zones(tmp_path: Path) -> None:
    src = CsvCarbonSource.from_files([em_file(tmp_path), lwa_file(tmp_path),
                                      lwa_file(tmp_path, "gb_ci.csv")])
    assert isinstance(src, CarbonSource)
    assert src.zones == ["DE", "ES", "GB"]
    assert src.intensity("ES", ts(2022, 1, 1, 5, 30)) == 105.0
    assert src.intensity("DE", ts(2020, 3, 2, 0, 20)) == 310.0
    lca = CsvCarbonSource.from_files([em_file(tmp_path)], column="lca")
    assert lca.intensity("ES", ts(2022, 1, 1, 5)) == 205.0
    named = CsvCarbonSource.from_files([lwa_file(tmp_path, "xx_ci.csv")], zones={"xx": "PL"})
    assert named.zones == ["PL"]


def test_forecast_steps_cover_the_window(tmp_path: Path) -> None:
    src = CsvCarbonSource.from_files([lwa_file(tmp_path)])
    start = ts(2020, 3, 2, 0, 10)
    steps = src.forecast("DE", start, ts(2020, 3, 2, 0, 40))
    assert steps == [(start, 300.0), (ts(2020, 3, 2, 0, 15), 310.0), (ts(2020, 3, 2, 0, 30), 320.0)]
    # 5 min at 300, 15 at 310, 10 at 320
    assert mean_intensity(src, "DE", start, ts(2020, 3, 2, 0, 40)) == pytest.approx(
        (5 * 300 + 15 * 310 + 10 * 320) / 30)
    assert integrate(steps, start, start) == 0.0


def test_errors_name_what_is_wrong(tmp_path: Path) -> None:
    src = CsvCarbonSource.from_files([lwa_file(tmp_path)])
    with pytest.raises(CarbonDataError, match="no carbon series for zone 'FR'; this source has DE"):
        src.intensity("FR", ts(2020, 3, 2))
    with pytest.raises(CarbonDataError, match="outside it"):
        src.intensity("DE", ts(2021, 3, 2))
    bad = tmp_path / "bad.csv"
    bad.write_text("when,what\n1,2\n")
    with pytest.raises(CarbonDataError, match="neither an Electricity Maps"):
        CsvCarbonSource.from_files([bad])
    worse = tmp_path / "ger_ci.csv"
    worse.write_text("Time,Carbon Intensity\n2020-03-02 00:00:00,-3\n")
    with pytest.raises(CarbonDataError, match=r"ger_ci.csv:2: intensity -3.0 must be"):
        CsvCarbonSource.from_files([worse])
    with pytest.raises(CarbonDataError, match="forecast_error"):
        CsvCarbonSource.from_files([lwa_file(tmp_path)], forecast_error=2.0)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CarbonDataError, match="no carbon CSV files"):
        CsvCarbonSource.from_dir(empty, years=[1999])


def test_year_shift_keeps_weekdays_and_wraps(tmp_path: Path) -> None:
    assert year_offset(2022, 2017) % (7 * 86400) == 0
    assert year_offset(2022, 2017, align="calendar") == (dt.date(2017, 1, 1)
                                                         - dt.date(2022, 1, 1)).days * 86400
    src = CsvCarbonSource.from_files([em_file(tmp_path)])  # 3 weeks from Sat 2022-01-01
    shifted = src.shifted(2017)
    first = shifted.series["ES"].start
    assert dt.datetime.fromtimestamp(first, dt.timezone.utc).weekday() == 5  # still a Saturday
    assert abs(first - ts(2017, 1, 1)) <= 3 * 86400
    # wrapping: three weeks later is the same hour of the same weekday
    assert shifted.intensity("ES", first + 3 * 7 * 86400 + 5 * 3600) == 105.0
    steps = shifted.forecast("ES", first + 21 * 86400 - 1800, first + 21 * 86400 + 3600)
    assert [v for _, v in steps] == [123.0, 100.0]
    cal = src.shifted(2017, align="calendar")
    assert cal.series["ES"].start == ts(2017, 1, 1)


def test_noisy_forecast_is_seeded_and_sized(tmp_path: Path) -> None:
    path = em_file(tmp_path, hours=24 * 60)
    a = CsvCarbonSource.from_files([path], forecast_error=0.05, seed=3)
    b = CsvCarbonSource.from_files([path], forecast_error=0.05, seed=3)
    c = CsvCarbonSource.from_files([path], forecast_error=0.05, seed=4)
    start, end = ts(2022, 1, 1), ts(2022, 3, 1)
    fa = a.forecast("ES", start, end)
    assert fa == b.forecast("ES", start, end) != c.forecast("ES", start, end)
    truth = [a.intensity("ES", t) for t, _ in fa]
    errors = [f - t for (_, f), t in zip(fa, truth)]
    mean = a.mean("ES")
    sd = (sum(e * e for e in errors) / len(errors)) ** 0.5
    assert 0.04 * mean < sd < 0.06 * mean  # 1,440 draws: within 20% of 5% of the mean
    assert a.intensity("ES", start) == 100.0  # intensity stays the true series


@pytest.mark.skipif(not (DATA / "carbon_letswaitawhile_2020").is_dir(), reason="no shared data")
def test_the_shared_files_read() -> None:
    lwa = CsvCarbonSource.from_dir(DATA / "carbon_letswaitawhile_2020")
    assert lwa.zones == ["DE", "FR", "GB"]
    assert [round(lwa.mean(z)) for z in lwa.zones] == [315, 57, 218]  # PROVENANCE.md's means
    em = CsvCarbonSource.from_dir(DATA / "carbon_electricitymaps_hourly_2021_2023", years=[2022])
    assert [round(em.mean(z)) for z in em.zones] == [60, 167, 13, 195]


def test_signals_for_a_snapshot(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from providers.carbon import signals

    src = CsvCarbonSource.from_files([lwa_file(tmp_path)])
    start = ts(2020, 3, 2, 0, 10)
    with caplog.at_level("WARNING", logger="spillway.carbon"):
        now_g, ahead = signals(src, ["DE", "FR", ""], start, 1800)
    assert now_g == {"DE": 300.0}
    assert ahead == {"DE": ((start, 300.0), (ts(2020, 3, 2, 0, 15), 310.0),
                            (ts(2020, 3, 2, 0, 30), 320.0))}
    assert "no carbon signal for zone FR from csv" in caplog.text
