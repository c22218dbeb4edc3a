"""Carbon intensity from CSV series: :class:`CsvCarbonSource`.

Two file formats are read (the ones in ``../shared/data/carbon_*``); the format is told by the
header:

- **Electricity Maps** yearly downloads (``<ZONE>_<YEAR>_hourly.csv``): ``Datetime (UTC)``,
  ``Zone Id``, ``Carbon Intensity gCO₂eq/kWh (direct)`` and ``(LCA)`` among others. The zone is
  the ``Zone Id`` column; ``column="direct"`` (operational emissions, the default) or ``"lca"``
  (life-cycle) picks the intensity.
- **Let's Wait Awhile** (Wiesner et al., Middleware'21; ``ger_ci.csv``, ``gb_ci.csv``,
  ``fr_ci.csv``): ``Time``, ``Carbon Intensity``. The zone comes from the file name
  (``ger`` -> ``DE``, ``gb`` -> ``GB``, ``fr`` -> ``FR``, :data:`LWA_ZONES`) unless a mapping
  is given. Its timestamps carry no time zone; they are read as UTC (ENTSO-E publishes UTC).

A series is a step function: a sample's value holds until the next sample. Several files of one
zone (several years) are merged.

**Year shift** (for the simulator, whose traces are from other years): :meth:`CsvCarbonSource.
shifted` moves every series from its own year onto ``to_year``. With ``align="weekday"`` (the
default) the move is a whole number of weeks, the one nearest to the calendar difference, so
Mondays stay Mondays (weekday demand shapes intensity) and dates land within 3 days of the same
calendar date; ``align="calendar"`` moves by the exact calendar difference (same date and hour,
weekdays not kept). A shifted source *wraps*: a time outside a series is folded back into it by
whole weeks, so a trace longer than the series, or crossing the new year, still gets values.

**Forecast**: the series itself (a perfect forecast), or with white noise: ``forecast_error=
0.05`` adds to every sample an independent normal error with standard deviation 5% of the
series' mean (the error model of "Let's Wait Awhile"), drawn once per zone from ``seed`` so the
same forecast is seen on every call; values are kept at 0 or above. :meth:`intensity` is always
the true series.
"""

from __future__ import annotations

import bisect
import csv
import datetime as dt
import gzip
import io
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from providers.carbon.base import CarbonDataError

WEEK = 7 * 86400.0
#: Electricity Maps' 2022 hourly series of US-CAL-CISO, ES, NO and BR, shipped (ODbL 1.0,
#: "Electricity Maps"; data/NOTICE.md): the simulator's default carbon series.
SHIPPED_2022 = Path(__file__).resolve().parent / "data" / "electricitymaps_2022_hourly.csv.gz"
LWA_ZONES: Mapping[str, str] = {"ger": "DE", "de": "DE", "gb": "GB", "fr": "FR",
                                 "cal": "US-CAL-CISO"}
_EM_TIME = "Datetime (UTC)"
_EM_ZONE = "Zone Id"
_EM_COLUMNS = {"direct": "Carbon Intensity gCO₂eq/kWh (direct)",
               "lca": "Carbon Intensity gCO₂eq/kWh (LCA)"}
_LWA_TIME, _LWA_VALUE = "Time", "Carbon Intensity"
Align = Literal["weekday", "calendar"]


@dataclass(frozen=True)
class Series:
    """One zone's intensity samples: ``times`` (unix seconds, increasing) and ``values``
    (gCO2e/kWh). ``wrap``: fold a time outside the series back into it by whole weeks."""

    zone: str
    times: tuple[float, ...]
    values: tuple[float, ...]
    wrap: bool = False

    def __post_init__(self) -> None:
        if not self.times or len(self.times) != len(self.values):
            raise CarbonDataError(f"carbon series {self.zone!r}: needs at least one sample and "
                                  "as many values as times")

    @property
    def step(self) -> float:
        """The length of the last sample (the spacing of the last two; 1 h for one sample)."""
        return self.times[-1] - self.times[-2] if len(self.times) > 1 else 3600.0

    @property
    def start(self) -> float:
        return self.times[0]

    @property
    def end(self) -> float:
        """Where the series stops covering: one step past its last sample."""
        return self.times[-1] + self.step

    @property
    def mean(self) -> float:
        return math.fsum(self.values) / len(self.values)

    @property
    def year(self) -> int:
        """The calendar year of the series' middle sample (a 2020 series with a few days of
        2019 and 2021 around it is a 2020 series)."""
        mid = self.times[len(self.times) // 2]
        return dt.datetime.fromtimestamp(mid, dt.timezone.utc).year

    def _fold(self, at: float) -> float:
        if self.start <= at < self.end:
            return at
        period = math.floor((self.end - self.start) / WEEK) * WEEK
        if not self.wrap or period <= 0:
            raise CarbonDataError(
                f"carbon series {self.zone!r} covers {_iso(self.start)} to {_iso(self.end)}; "
                f"{_iso(at)} is outside it (shift the series onto the trace's year with "
                "CsvCarbonSource.shifted, which also wraps)")
        return self.start + (at - self.start) % period

    def _index(self, at: float) -> int:
        return max(0, bisect.bisect_right(self.times, at) - 1)

    def at(self, at: float) -> float:
        return self.values[self._index(self._fold(at))]

    def steps(self, start: float, end: float) -> list[tuple[float, float]]:
        """Steps covering ``[start, end)``, the first at ``start`` (wrapping where allowed)."""
        out = [(start, self.at(start))]
        t = start
        while True:
            folded = self._fold(t)
            i = self._index(folded)
            nxt = self.times[i + 1] if i + 1 < len(self.times) else self.end
            t = t + (nxt - folded)
            if t >= end:
                return out
            out.append((t, self.at(t)))

    def shifted(self, seconds: float, wrap: bool = True) -> Series:
        return replace(self, times=tuple(t + seconds for t in self.times), wrap=wrap)

    def noisy(self, relative_sd: float, seed: int) -> Series:
        """The series with white noise of standard deviation ``relative_sd`` x its mean added
        to each sample (kept at 0 or above), drawn from ``seed`` and the zone."""
        rng = random.Random(f"{seed}:{self.zone}")
        sd = relative_sd * self.mean
        return replace(self, values=tuple(max(0.0, v + rng.gauss(0.0, sd)) for v in self.values))


def year_offset(from_year: int, to_year: int, align: Align = "weekday") -> float:
    """Seconds to add to move a series from ``from_year`` onto ``to_year``: the calendar
    difference of their 1 January, or (``"weekday"``) the nearest whole number of weeks."""
    if align not in ("weekday", "calendar"):
        raise CarbonDataError(f"align {align!r} is not allowed: use 'weekday' or 'calendar'")
    days = (dt.date(to_year, 1, 1) - dt.date(from_year, 1, 1)).days
    if align == "weekday":
        days = 7 * round(days / 7)
    return days * 86400.0


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M")


def _parse_time(text: str, path: Path, line: int) -> float:
    try:
        stamp = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CarbonDataError(
            f"{path}:{line}: time {text!r} is not 'YYYY-MM-DD HH:MM:SS'") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.timezone.utc)
    return stamp.timestamp()


def _parse_value(text: str, path: Path, line: int) -> float:
    try:
        value = float(text)
    except ValueError:
        raise CarbonDataError(f"{path}:{line}: intensity {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise CarbonDataError(f"{path}:{line}: intensity {value} must be a number >= 0")
    return value


def _zone_from_name(path: Path, zones: Mapping[str, str]) -> str:
    stem = path.name.lower().removesuffix(".gz").removesuffix(".csv")
    key = re.split(r"[_\-.]", stem)[0]
    if stem in zones:
        return zones[stem]
    if key in zones:
        return zones[key]
    raise CarbonDataError(f"{path}: cannot tell its zone from the file name; known prefixes: "
                          f"{', '.join(sorted(zones))} (pass zones={{'{key}': 'ZONE'}})")


def read_file(path: str | Path, column: str = "direct",
              zones: Mapping[str, str] | None = None) -> dict[str, list[tuple[float, float]]]:
    """The samples of one CSV file, by zone: ``{zone: [(t, gCO2e/kWh), ...]}``."""
    path = Path(path)
    if column not in _EM_COLUMNS:
        raise CarbonDataError(f"column {column!r} is not allowed: use 'direct' or 'lca'")
    names = {**LWA_ZONES, **{k.lower(): v for k, v in (zones or {}).items()}}
    try:
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = list(reader.fieldnames or [])
        rows = list(reader)
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as e:
        raise CarbonDataError(f"carbon file {path}: {getattr(e, 'strerror', None) or e}") \
            from None
    out: dict[str, list[tuple[float, float]]] = {}
    if _EM_TIME in header and _EM_COLUMNS[column] in header:
        for n, row in enumerate(rows, start=2):
            zone = (row.get(_EM_ZONE) or "").strip() or _zone_from_name(path, names)
            zone = names.get(zone.lower(), zone)
            out.setdefault(zone, []).append((_parse_time(row[_EM_TIME], path, n),
                                             _parse_value(row[_EM_COLUMNS[column]], path, n)))
    elif _LWA_TIME in header and _LWA_VALUE in header:
        zone = _zone_from_name(path, names)
        out[zone] = [(_parse_time(row[_LWA_TIME], path, n), _parse_value(row[_LWA_VALUE], path, n))
                     for n, row in enumerate(rows, start=2)]
    else:
        raise CarbonDataError(
            f"{path}: header {header} is neither an Electricity Maps download ({_EM_TIME!r}, "
            f"{_EM_COLUMNS[column]!r}) nor a Let's Wait Awhile file ({_LWA_TIME!r}, "
            f"{_LWA_VALUE!r})")
    if not any(out.values()):
        raise CarbonDataError(f"{path}: no samples")
    return out


class CsvCarbonSource:
    """A :class:`~providers.carbon.base.CarbonSource` over CSV series (see the module doc)."""

    def __init__(self, series: Iterable[Series], forecast_error: float = 0.0, seed: int = 0,
                 name: str = "csv") -> None:
        self.name = name
        self.series: dict[str, Series] = {s.zone: s for s in series}
        if not self.series:
            raise CarbonDataError("a CSV carbon source needs at least one series")
        if not (math.isfinite(forecast_error) and 0.0 <= forecast_error <= 1.0):
            raise CarbonDataError(f"forecast_error {forecast_error} must be between 0 and 1 "
                                  "(a fraction of the series' mean, e.g. 0.05)")
        self.forecast_error = forecast_error
        self.seed = seed
        self._forecast = ({z: s.noisy(forecast_error, seed) for z, s in self.series.items()}
                          if forecast_error > 0 else self.series)

    @classmethod
    def from_files(cls, paths: Sequence[str | Path], column: str = "direct",
                   zones: Mapping[str, str] | None = None, forecast_error: float = 0.0,
                   seed: int = 0) -> CsvCarbonSource:
        """Read files of either format; files of one zone (several years) are merged, and a
        time given twice keeps the later file's value."""
        merged: dict[str, dict[float, float]] = {}
        for path in paths:
            for zone, samples in read_file(path, column, zones).items():
                merged.setdefault(zone, {}).update(samples)
        series = [Series(zone, tuple(sorted(s)), tuple(s[t] for t in sorted(s)))
                  for zone, s in merged.items()]
        return cls(series, forecast_error, seed)

    @classmethod
    def from_dir(cls, directory: str | Path, years: Iterable[int] | None = None,
                 column: str = "direct", zones: Mapping[str, str] | None = None,
                 forecast_error: float = 0.0, seed: int = 0) -> CsvCarbonSource:
        """Every ``*.csv`` in ``directory``; ``years`` keeps only Electricity Maps files of
        those years (``<ZONE>_<YEAR>_hourly.csv``) and the files without a year in the name."""
        root = Path(directory)
        if not root.is_dir():
            raise CarbonDataError(f"carbon data directory {root} does not exist")
        wanted = {int(y) for y in years} if years is not None else None
        paths = []
        for p in sorted([*root.glob("*.csv"), *root.glob("*.csv.gz")]):
            m = re.search(r"_(\d{4})_", p.name)
            if wanted is None or m is None or int(m.group(1)) in wanted:
                paths.append(p)
        if not paths:
            raise CarbonDataError(f"no carbon CSV files in {root}"
                                  + (f" for years {sorted(wanted)}" if wanted else ""))
        return cls.from_files(paths, column, zones, forecast_error, seed)

    @property
    def zones(self) -> list[str]:
        return sorted(self.series)

    def mean(self, zone: str) -> float:
        """The series' mean intensity: its static yearly average."""
        return self._series(zone).mean

    def shifted(self, to_year: int, align: Align = "weekday") -> CsvCarbonSource:
        """A copy with every series moved from its own year onto ``to_year`` (wrapping)."""
        series = [s.shifted(year_offset(s.year, to_year, align)) for s in self.series.values()]
        return CsvCarbonSource(series, self.forecast_error, self.seed, self.name)

    def _series(self, zone: str, table: Mapping[str, Series] | None = None) -> Series:
        found = (table or self.series).get(zone)
        if found is None:
            raise CarbonDataError(f"no carbon series for zone {zone!r}; this source has "
                                  f"{', '.join(self.zones)}")
        return found

    def intensity(self, zone: str, at: float) -> float:
        return self._series(zone).at(at)

    def actual(self, zone: str, start: float, end: float) -> list[tuple[float, float]]:
        """The true series as steps covering ``[start, end)`` (no forecast error): what the
        grid emitted, for accounting."""
        if end < start:
            raise CarbonDataError(f"window end {end} is before its start {start}")
        return self._series(zone).steps(start, max(end, start))

    def forecast(self, zone: str, start: float, end: float) -> list[tuple[float, float]]:
        if end < start:
            raise CarbonDataError(f"forecast window end {end} is before its start {start}")
        return self._series(zone, self._forecast).steps(start, max(end, start))
