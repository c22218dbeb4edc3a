"""``spillway bench carbon-shift``: the machine-learning scenario of "Let's Wait Awhile"
(Wiesner et al., Middleware'21, scenario II), replayed through the carbon defer policy.

The scenario, as the authors' simulator builds it (github.com/dos-group/lets-wait-awhile,
``simulate.py`` and ``strategy.py``; docs/carbon-shifting.md has the details):

- 3,387 jobs over the 262 weekdays of 2020: a multinomial count per weekday, then per day
  sorted submission times drawn uniformly from 09:00-16:30 in half-hour steps, then durations
  drawn uniformly from 4-89.5 h in half-hour steps, all from numpy's ``default_rng(seed)``
  (seed 0 in the paper). Every job draws the same power, and jobs never compete for capacity.
- Carbon intensity in half-hour steps: the value at each :00 and :30 of the series (Germany's
  series has 15-minute samples; the authors keep every second one), held for 30 minutes.
- Deadlines: ``next-workday``: a job whose baseline run ends after 17:00 must end by 09:00 the
  next day (Friday's: Saturday 09:00, as the authors' code has it and their figures need),
  one that ends on a Saturday or Sunday by Monday 09:00, one that ends before 09:00 by 09:00
  that day, else it runs at once; ``semi-weekly``: by the next Monday or Thursday 09:00.
- The baseline runs each job at its submission. The result is the share of the baseline's
  emissions avoided.

Each job is decided by :func:`policies.carbon.defer.plan` (the policy the scheduling cycle runs),
from the forecast at its submission; the replay follows the plan it returns (re-deciding
later with the same forecast gives the same rest of the plan: tests/unit/test_defer.py). The
optimum (``optimum_pct``) is computed apart, on the true series with numpy, as a check.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from broker.errors import ConfigError
from policies.carbon.defer import Deferral, plan, smoothing_for

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy comes with the carbon extra (and dev)
    np = None  # type: ignore[assignment]

STEP = 1800.0
EPOCH = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
T0 = EPOCH.timestamp()
FILES = {"DE": "ger_ci.csv", "GB": "gb_ci.csv", "FR": "fr_ci.csv"}
Deadline = Literal["next-workday", "semi-weekly"]
DEADLINES: tuple[str, ...] = ("next-workday", "semi-weekly")
# the paper's figures (Wiesner et al., Middleware'21, section 5.2 and Figure 9): percent of
# emissions avoided, perfect forecast: (country, deadline, interruptible) -> pct
PAPER_OPTIMUM = {
    ("DE", "next-workday", False): 5.92, ("DE", "next-workday", True): 8.04,
    ("DE", "semi-weekly", False): 14.15, ("DE", "semi-weekly", True): 18.48,
    ("GB", "next-workday", False): 6.66, ("GB", "next-workday", True): 9.23,
    ("GB", "semi-weekly", False): 14.85, ("GB", "semi-weekly", True): 20.09,
    ("FR", "next-workday", False): 4.87, ("FR", "next-workday", True): 6.26,
    ("FR", "semi-weekly", False): 11.25, ("FR", "semi-weekly", True): 13.95,
}
# ... and with 5% forecast error, where the paper reports them
PAPER_5PCT = {("DE", "next-workday", False): 5.91, ("DE", "next-workday", True): 7.93}


@dataclass(frozen=True)
class Setup:
    country: str = "DE"
    deadline: Deadline = "next-workday"
    interruptible: bool = False
    forecast_error: float = 0.0
    seed: int = 0  # the job generation's seed (0: the paper's jobs)
    noise_seed: int = 0  # the first forecast-error seed
    repeats: int = 10  # forecast-error draws averaged (the paper: 10)
    spatial: bool = False
    jobs: int = 3387
    days: int | None = None  # only the jobs submitted in the first N days (a small slice)
    smooth: int | None = None  # slots the policy averages (None: its rule for the error)
    through_sim: bool = False  # every decision by the simulator's cycles (bench/carbon_sim.py)


def _need_numpy() -> Any:
    if np is None:
        raise ConfigError("the carbon-shift bench needs numpy: pip install 'spillway[carbon]'")
    return np


def scenario_jobs(n: int = 3387, seed: int = 0) -> list[tuple[float, float]]:
    """(submission, duration) in unix seconds of the paper's jobs, in submission order."""
    npy = _need_numpy()
    rng = npy.random.default_rng(seed)
    starts = npy.arange(9 * 60, 17 * 60, 30)  # minutes of the day: 09:00 .. 16:30
    durations = npy.arange(4 * 60, 90 * 60, 30)  # minutes: 4 h .. 89.5 h
    days = [EPOCH + dt.timedelta(days=i) for i in range(366)]
    weekdays = [d for d in days if d.weekday() < 5]
    counts = dict(zip(weekdays, rng.multinomial(n, [1 / len(weekdays)] * len(weekdays))))
    submits: list[float] = []
    for day in days:  # every day, weekends with no jobs, as the authors draw them
        for minute in npy.sort(rng.choice(starts, size=int(counts.get(day, 0)))):
            submits.append(day.timestamp() + 60.0 * int(minute))
    lengths = rng.choice(durations, size=n)
    return [(s, 60.0 * int(m)) for s, m in zip(submits, lengths)]


def deadline_of(submit: float, duration: float, kind: str) -> float:
    """The latest end of a job under ``kind`` (see the module doc), in unix seconds."""
    end = dt.datetime.fromtimestamp(submit + duration, dt.timezone.utc)
    day, hour = end.weekday(), end.hour + end.minute / 60
    nine = end.replace(hour=9, minute=0, second=0, microsecond=0)
    if kind == "next-workday":
        if day == 5:
            due = nine + dt.timedelta(days=2)
        elif day == 6 or hour > 17:
            due = nine + dt.timedelta(days=1)
        elif hour < 9:
            due = nine
        else:
            due = end
    elif kind == "semi-weekly":
        to_thursday = (day == 0 and hour > 9) or day in (1, 2) or (day == 3 and hour <= 9)
        due = nine + dt.timedelta(days=(3 - day) % 7 if to_thursday else (7 - day) % 7)
    else:
        raise ConfigError(f"--deadline {kind!r}: allowed: {', '.join(DEADLINES)}")
    return due.timestamp()


def half_hours(series_times: Sequence[float], values: Sequence[float], start: float,
               end: float) -> Any:
    """A step series' values at every :00 and :30 in ``[start, end)``."""
    npy = _need_numpy()
    grid = start + STEP * npy.arange(int((end - start) // STEP))
    idx = npy.searchsorted(npy.asarray(series_times), grid, side="right") - 1
    return npy.asarray(values, dtype=float)[npy.clip(idx, 0, None)]


def load(data: str | Path, country: str) -> Any:
    """The CSV source of ``country`` in ``data``."""
    from providers.carbon import CsvCarbonSource

    if country not in FILES:
        raise ConfigError(f"--country {country!r}: allowed: {', '.join(FILES)}")
    path = Path(data) / FILES[country]
    if not path.is_file():
        raise ConfigError(f"--data {data}: no {FILES[country]} there (the Let's Wait Awhile "
                          "series: ../shared/data/carbon_letswaitawhile_2020)")
    return CsvCarbonSource.from_files([path])


def _grid_end(sources: dict[str, Any]) -> float:
    return min(s.series[z].end for z, s in sources.items())


def _forecasts(sources: dict[str, Any], error: float, seed: int, end: float
               ) -> dict[str, Any]:
    """Each zone's forecast sampled at the half-hours (the series itself, or noisy)."""
    from providers.carbon import CsvCarbonSource

    out = {}
    for zone, src in sources.items():
        noisy = CsvCarbonSource(list(src.series.values()), forecast_error=error, seed=seed) \
            if error > 0 else src
        steps = noisy.forecast(zone, T0, end)
        out[zone] = half_hours([t for t, _ in steps], [g for _, g in steps], T0, end)
    return out


def _decide(fc: Any, submit: float, work: float, due: float, interruptible: bool,
            smooth: int) -> Deferral | None:
    # the window, and a slot on each side (the policy averages neighbouring slots)
    i = max(0, int((submit - T0) // STEP) - 1)
    j = min(len(fc), math.ceil((due - T0) / STEP) + 1)
    steps = [(T0 + STEP * k, float(g)) for k, g in zip(range(i, j), fc[i:j].tolist())]
    return plan(steps, submit, work, due, due - work, interruptible, STEP, smooth)


def _emissions(true: Any, runs: Sequence[tuple[float, float]]) -> float:
    return float(sum(true[int((a - T0) // STEP):int((b - T0) // STEP)].sum() for a, b in runs))


def replay(true: dict[str, Any], fc: dict[str, Any], home: str,
           jobs: Sequence[tuple[float, float]], s: Setup) -> dict[str, float]:
    """Each job decided by the policy at its submission, in its home zone or (``spatial``)
    the zone it plans cleanest: the baseline's and the shifted emissions, jobs deferred, and
    (``spatial``) jobs moved and the emissions of moving without waiting (each job at its
    submission in the zone forecast cleanest over its run)."""
    base = shifted = moved_only = 0.0
    deferred = moved = 0
    zones = sorted(fc) if s.spatial else [home]
    smooth = s.smooth if s.smooth is not None else smoothing_for(s.forecast_error)
    for submit, work in jobs:
        due = deadline_of(submit, work, s.deadline)
        now_run: tuple[tuple[float, float], ...] = ((submit, submit + work),)
        base += _emissions(true[home], now_run)
        best: tuple[float, str, tuple[tuple[float, float], ...]] | None = None
        for zone in zones:
            d = _decide(fc[zone], submit, work, due, s.interruptible, smooth)
            runs = d.runs if d is not None else now_run
            planned = _emissions(fc[zone], runs)  # what the forecast says of the plan
            if best is None or planned < best[0]:
                best = (planned, zone, runs)
        assert best is not None
        _, zone, runs = best
        deferred += runs[0][0] > submit
        moved += zone != home
        shifted += _emissions(true[zone], runs)
        there = min(zones, key=lambda z: _emissions(fc[z], now_run))
        moved_only += _emissions(true[there], now_run)
    return {"base": base, "shifted": shifted, "deferred": deferred, "moved": moved,
            "moved_only": moved_only}


def optimum(true: Any, jobs: Sequence[tuple[float, float]], kind: str,
            interruptible: bool) -> tuple[float, float]:
    """(baseline, optimal) emissions on the true series, with numpy: each job in its best
    window (or its cleanest slots) before its deadline."""
    npy = _need_numpy()
    cum = npy.concatenate([[0.0], npy.cumsum(true)])
    base = best = 0.0
    for submit, work in jobs:
        a, k = int((submit - T0) // STEP), math.ceil(work / STEP)
        z = int((deadline_of(submit, work, kind) - T0) // STEP)
        base += cum[a + k] - cum[a]
        if interruptible:
            best += float(npy.sort(true[a:z])[:k].sum())
        else:
            starts = npy.arange(a, z - k + 1)
            best += float((cum[starts + k] - cum[starts]).min())
    return float(base), float(best)


def run(data: str | Path, s: Setup) -> dict[str, Any]:
    """The bench's JSON result (see the module doc and docs/carbon-shifting.md)."""
    _need_numpy()
    if s.through_sim and s.spatial:
        raise ConfigError("--through-sim covers temporal shifting only: drop --spatial")
    if not 0 <= s.forecast_error <= 1 or s.repeats < 1:
        raise ConfigError("--forecast-error must be between 0 and 1 (e.g. 0.05) and "
                          "--repeats at least 1")
    countries = sorted(FILES) if s.spatial else [s.country]
    sources = {c: load(data, c) for c in countries}
    end = _grid_end(sources)
    true = {c: half_hours(src.series[c].times, src.series[c].values, T0, end)
            for c, src in sources.items()}
    jobs = scenario_jobs(s.jobs, s.seed)
    if s.days is not None:
        jobs = [j for j in jobs if j[0] < T0 + s.days * 86400]
    draws = range(s.noise_seed, s.noise_seed + s.repeats) if s.forecast_error > 0 else [0]
    base = total = 0.0
    deferred = pauses = misses = moved = 0
    moved_only = 0.0
    for seed in draws:
        fc = _forecasts(sources, s.forecast_error, seed, end)
        if s.through_sim:
            from broker.bench.carbon_sim import simulate

            due = [deadline_of(a, w, s.deadline) for a, w in jobs]
            base, shifted, deferred, pauses, misses = simulate(
                true[s.country], fc[s.country], s.country, jobs, due, s.interruptible,
                s.forecast_error, T0)
        else:
            r = replay(true, fc, s.country, jobs, s)
            base, shifted, deferred = r["base"], r["shifted"], int(r["deferred"])
            moved, moved_only = int(r["moved"]), moved_only + r["moved_only"] / len(draws)
        total += shifted / len(draws)
    out: dict[str, Any] = {
        "country": s.country, "deadline": s.deadline, "interruptible": s.interruptible,
        "forecast_error": s.forecast_error, "seed": s.seed, "spatial": s.spatial,
        "through_sim": s.through_sim, "jobs": len(jobs), "jobs_deferred": deferred,
        "repeats": len(draws) if s.forecast_error > 0 else 0,
        "baseline_kg_per_kw": round(base * STEP / 3600 / 1000, 3),
        "emissions_avoided_pct": round(100 * (1 - total / base), 2),
    }
    if s.through_sim:
        out["pauses"], out["deadline_misses"] = pauses, misses
    if s.spatial:  # what moving alone (each job at once, in the cleanest country) avoids
        out["jobs_moved"] = moved
        out["spatial_only_pct"] = round(100 * (1 - moved_only / base), 2)
    if s.forecast_error == 0:
        b, opt = optimum(true[s.country], jobs, s.deadline, s.interruptible)
        out["temporal_optimum_pct" if s.spatial else "optimum_pct"] = round(100 * (1 - opt / b), 2)
    key = (s.country, s.deadline, s.interruptible)
    if s.days is None and s.jobs == 3387 and s.seed == 0 and not s.spatial:
        paper = PAPER_OPTIMUM if s.forecast_error == 0 else (
            PAPER_5PCT if s.forecast_error == 0.05 else {})
        if key in paper:
            out["paper_pct"] = paper[key]
    return out
