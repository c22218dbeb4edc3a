"""On-prem prices: the amortised price of a GPU-hour, and electricity that changes by the hour.

- The **amortised price** (``onprem_price_per_gpu_hour`` in the configuration, $0.81 by
  default: docs/catalog.md derives it) is what chargeback bills per on-prem GPU-hour and what
  cloud offers are compared with.
- An **electricity price** is a :class:`TimeOfUseTariff` (named periods, each with its days of
  the week, its hours in the site's local time and its $/kWh; the first period that matches an
  instant wins, so list the exceptions first and end with a catch-all) or a
  :class:`PriceSeries` (``time,usd_per_kwh`` rows, a step function, read from a CSV file).
  ``cost(kw, start, end)`` integrates a constant draw over a window, so deferrable work on-prem
  can be placed when power is cheap.

Pure, apart from reading a series file; time is unix seconds.
"""

from __future__ import annotations

import bisect
import csv
import datetime as dt
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_HHMM = re.compile(r"^([01]\d|2[0-4]):([0-5]\d)$")


class ElectricityPrice(Protocol):
    def price_at(self, t: float) -> float:
        """$/kWh at unix time ``t``."""
        ...

    def cost(self, kw: float, start: float, end: float) -> float:
        """$ of drawing ``kw`` from ``start`` to ``end``."""
        ...


def _minutes(text: str, where: str) -> int:
    m = _HHMM.match(str(text).strip())
    if not m or (m.group(1) == "24" and m.group(2) != "00"):
        raise ValueError(f"{where}: {text!r} is not a time of day; use HH:MM (00:00 to 24:00)")
    return int(m.group(1)) * 60 + int(m.group(2))


@dataclass(frozen=True)
class Period:
    """``usd_per_kwh`` on ``days`` from ``start`` to ``end`` (minutes after local midnight;
    ``end`` <= ``start`` wraps past midnight)."""

    name: str
    usd_per_kwh: float
    days: frozenset[int] = frozenset(range(7))
    start: int = 0
    end: int = 24 * 60

    def holds(self, local: dt.datetime) -> bool:
        minute = local.hour * 60 + local.minute
        if self.start < self.end:
            return local.weekday() in self.days and self.start <= minute < self.end
        # wraps midnight: the evening belongs to today, the morning to the day before
        if minute >= self.start:
            return local.weekday() in self.days
        return minute < self.end and (local.weekday() - 1) % 7 in self.days

    @classmethod
    def parse(cls, raw: object, where: str) -> Period:
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: must be a mapping {{name, usd_per_kwh, days, from, to}}")
        unknown = sorted(set(map(str, raw)) - {"name", "usd_per_kwh", "days", "from", "to"})
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}; allowed: name, usd_per_kwh, "
                             "days, from, to")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.name: {name!r} must be a non-empty string")
        price = raw.get("usd_per_kwh")
        if isinstance(price, bool) or not isinstance(price, (int, float)) \
                or not math.isfinite(price) or price < 0:
            raise ValueError(f"{where}.usd_per_kwh: {price!r} is not allowed; use dollars per "
                             "kWh >= 0")
        days = raw.get("days", list(DAYS))
        if isinstance(days, str):
            days = [days]
        if not isinstance(days, list) or not days or any(d not in DAYS for d in days):
            raise ValueError(f"{where}.days: {days!r} is not allowed; use a list of "
                             f"{', '.join(DAYS)}")
        return cls(name, float(price), frozenset(DAYS.index(d) for d in days),
                   _minutes(raw.get("from", "00:00"), f"{where}.from"),
                   _minutes(raw.get("to", "24:00"), f"{where}.to"))


class _Integrating:
    """``cost`` by summing ``price_at`` over the instants the price may change."""

    def _changes(self, start: float, end: float) -> list[float]:
        raise NotImplementedError

    def price_at(self, t: float) -> float:
        raise NotImplementedError

    def cost(self, kw: float, start: float, end: float) -> float:
        if end <= start or kw <= 0:
            return 0.0
        cuts = [start, *(t for t in self._changes(start, end) if start < t < end), end]
        return kw * math.fsum(self.price_at(a) * (b - a) / 3600.0 for a, b in pairwise(cuts))


class TimeOfUseTariff(_Integrating):
    """Named periods in the site's time zone (an IANA name such as ``Europe/Berlin``)."""

    def __init__(self, periods: Sequence[Period], timezone: str = "UTC") -> None:
        if not periods:
            raise ValueError("a time-of-use tariff needs at least one period")
        try:
            self.tz = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"tariff timezone {timezone!r} is not an IANA time zone (e.g. "
                             "Europe/Berlin, America/New_York, UTC)") from None
        self.periods = tuple(periods)

    def period_at(self, t: float) -> Period:
        local = dt.datetime.fromtimestamp(t, self.tz)
        for period in self.periods:
            if period.holds(local):
                return period
        raise ValueError(f"no tariff period covers {local:%a %H:%M} ({self.tz}); end the "
                         "list with a period for every day and hour")

    def price_at(self, t: float) -> float:
        return self.period_at(t).usd_per_kwh

    def _changes(self, start: float, end: float) -> list[float]:
        # the price can change only where a period starts or ends: those minutes of every
        # local day that the window touches
        edges = sorted({p.start for p in self.periods} | {p.end % 1440 for p in self.periods})
        out: list[float] = []
        day = dt.datetime.fromtimestamp(start, self.tz).date() - dt.timedelta(days=1)
        last = dt.datetime.fromtimestamp(end, self.tz).date()
        while day <= last:
            for minute in edges:
                local = dt.datetime.combine(day, dt.time(minute // 60, minute % 60),
                                            tzinfo=self.tz)
                out.append(local.timestamp())
            day += dt.timedelta(days=1)
        return sorted(out)

    @classmethod
    def parse(cls, raw: object, where: str = "tariff") -> TimeOfUseTariff:
        if not isinstance(raw, dict) or not isinstance(raw.get("periods"), list):
            raise ValueError(f"{where}: must be a mapping with periods: [{{name, usd_per_kwh, "
                             "days, from, to}, ...] and timezone")
        tz = raw.get("timezone", "UTC")
        return cls([Period.parse(p, f"{where}.periods[{i}]")
                    for i, p in enumerate(raw["periods"])], str(tz))


class PriceSeries(_Integrating):
    """$/kWh as a step function of time (each row holds until the next)."""

    def __init__(self, times: Sequence[float], prices: Sequence[float]) -> None:
        if not times or len(times) != len(prices):
            raise ValueError("a price series needs at least one row, and a price per time")
        self.times, self.prices = list(times), list(prices)

    def price_at(self, t: float) -> float:
        return self.prices[max(0, bisect.bisect_right(self.times, t) - 1)]

    def _changes(self, start: float, end: float) -> list[float]:
        return self.times

    @classmethod
    def read(cls, path: str | Path) -> PriceSeries:
        """``time,usd_per_kwh`` rows (ISO 8601 times, UTC unless they say otherwise)."""
        p = Path(path)
        try:
            with p.open(newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
        except OSError as e:
            raise ValueError(f"price series {p}: {e.strerror or e}") from None
        out: list[tuple[float, float]] = []
        for n, row in enumerate(rows, start=2):
            try:
                stamp = dt.datetime.fromisoformat(str(row["time"]).replace("Z", "+00:00"))
                price = float(row["usd_per_kwh"])
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{p}:{n}: needs time (ISO 8601) and usd_per_kwh (a number "
                                 ">= 0) columns") from None
            if not math.isfinite(price) or price < 0:
                raise ValueError(f"{p}:{n}: usd_per_kwh {price} must be >= 0")
            if stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=dt.timezone.utc)
            out.append((stamp.timestamp(), price))
        out.sort()
        return cls([t for t, _ in out], [v for _, v in out])
