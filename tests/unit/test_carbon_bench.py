"""``spillway bench carbon-shift``: the Let's Wait Awhile scenario, its deadlines, a small slice
replayed through the defer policy, and (slow) one country against the paper's figure."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import pytest

from broker.bench.carbon import Setup, deadline_of, run, scenario_jobs
from broker.errors import ConfigError

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "carbon_letswaitawhile_2020"
needs_data = pytest.mark.skipif(not (DATA / "ger_ci.csv").is_file(),
                                reason="the Let's Wait Awhile series are not here")


def ts(*args: int) -> float:
    return dt.datetime(*args, tzinfo=dt.timezone.utc).timestamp()


@pytest.mark.parametrize(("submit", "hours", "kind", "due"), [
    # next workday: ends 10:00 Wed -> no slack
    (ts(2020, 1, 8, 9), 1, "next-workday", ts(2020, 1, 8, 10)),
    # ends 17:00 sharp: still in the workday
    (ts(2020, 1, 8, 9), 8, "next-workday", ts(2020, 1, 8, 17)),
    # ends 17:30 Wed -> Thu 09:00
    (ts(2020, 1, 8, 9), 8.5, "next-workday", ts(2020, 1, 9, 9)),
    # ends Fri 18:00 -> Sat 09:00 (the authors' rule, which their figures need)
    (ts(2020, 1, 10, 9), 9, "next-workday", ts(2020, 1, 11, 9)),
    # ends Sat -> Mon 09:00; ends Sun -> Mon 09:00
    (ts(2020, 1, 10, 9), 20, "next-workday", ts(2020, 1, 13, 9)),
    (ts(2020, 1, 10, 9), 40, "next-workday", ts(2020, 1, 13, 9)),
    # ends Tue 03:00 -> Tue 09:00
    (ts(2020, 1, 13, 9), 18, "next-workday", ts(2020, 1, 14, 9)),
    # semi-weekly: Mon after 09:00 .. Thu 09:00 -> Thursday; else -> Monday
    (ts(2020, 1, 6, 9), 2, "semi-weekly", ts(2020, 1, 9, 9)),
    (ts(2020, 1, 8, 9), 24, "semi-weekly", ts(2020, 1, 9, 9)),
    (ts(2020, 1, 9, 9), 1, "semi-weekly", ts(2020, 1, 13, 9)),
    (ts(2020, 1, 10, 9), 60, "semi-weekly", ts(2020, 1, 13, 9)),
])
def test_deadlines(submit: float, hours: float, kind: str, due: float) -> None:
    assert deadline_of(submit, hours * 3600, kind) == due


def test_the_scenario_jobs() -> None:
    jobs = scenario_jobs()
    assert len(jobs) == 3387
    days = set()
    for submit, work in jobs:
        t = dt.datetime.fromtimestamp(submit, dt.timezone.utc)
        days.add(t.date())
        assert t.year == 2020 and t.weekday() < 5 and t.minute in (0, 30)
        assert 9 <= t.hour + t.minute / 60 <= 16.5
        assert 4 * 3600 <= work <= 89.5 * 3600 and work % 1800 == 0
    assert len(days) <= 262 and [j[0] for j in jobs] == sorted(j[0] for j in jobs)
    assert scenario_jobs(seed=1) != jobs


@needs_data
@pytest.mark.parametrize("interruptible", [False, True])
def test_a_slice_reaches_the_optimum_with_a_perfect_forecast(interruptible: bool) -> None:
    out = run(DATA, Setup("GB", "semi-weekly", interruptible, jobs=3387, days=14))
    assert 0 < out["jobs"] < 200 and out["jobs_deferred"] > 0
    assert out["emissions_avoided_pct"] == out["optimum_pct"] > 0
    assert "paper_pct" not in out  # a slice is not the paper's scenario


@needs_data
def test_a_noisy_forecast_costs_something_and_spatial_adds() -> None:
    s = Setup("DE", "next-workday", True, days=14)
    perfect = run(DATA, s)["emissions_avoided_pct"]
    noisy = run(DATA, Setup("DE", "next-workday", True, forecast_error=0.2, repeats=2,
                            days=14))
    assert noisy["repeats"] == 2 and "optimum_pct" not in noisy
    assert noisy["emissions_avoided_pct"] < perfect
    assert run(DATA, Setup("DE", "next-workday", True, spatial=True, days=14)
               )["emissions_avoided_pct"] > perfect


@needs_data
@pytest.mark.parametrize("interruptible", [False, True])
def test_through_the_simulator_the_same(interruptible: bool) -> None:
    """The simulator's cycles (deferrals, and pauses of checkpointed jobs) reach what the
    bench's replay of the same policy reaches, on a slice."""
    s = Setup("GB", "next-workday", interruptible, days=7)
    sim = run(DATA, replace(s, through_sim=True))
    assert sim["jobs_deferred"] > 0 and (sim["pauses"] > 0) is interruptible
    assert sim["deadline_misses"] == 0
    assert sim["emissions_avoided_pct"] == run(DATA, s)["emissions_avoided_pct"]


def test_bad_input_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--country 'XX': allowed: DE, GB, FR"):
        run(tmp_path, Setup("XX"))
    with pytest.raises(ConfigError, match=r"no ger_ci\.csv there"):
        run(tmp_path, Setup("DE"))
    with pytest.raises(ConfigError, match="--through-sim covers temporal shifting only"):
        run(tmp_path, Setup("DE", spatial=True, through_sim=True))
    with pytest.raises(ConfigError, match="--deadline 'weekly'"):
        deadline_of(0, 3600, "weekly")


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize(("interruptible", "paper"), [(False, 5.92), (True, 8.04)])
def test_germany_next_workday_reaches_the_paper(interruptible: bool, paper: float) -> None:
    out = run(DATA, Setup("DE", "next-workday", interruptible))
    assert out["optimum_pct"] == paper == out["paper_pct"]
    assert abs(out["emissions_avoided_pct"] - paper) <= 0.1
