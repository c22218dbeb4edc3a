"""The window of a spend report: a UTC calendar month, an ISO week, or a range of whole days.

``--month 2026-11`` is 2026-11-01 00:00 UTC to 2026-12-01 00:00 UTC; ``--week 2026-W47`` is
Monday 2026-11-16 to Monday 2026-11-23 (ISO 8601 weeks, as the budget book's week ids);
``--from 2026-11-03 --to 2026-11-09`` holds both days (the end is exclusive at the next
midnight). Every window is made of whole UTC days, so a ledger charge (one UTC hour of one
machine) never straddles its edge. Bad input raises :class:`ReportError` naming the option.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

DAY_S = 86400.0
MAX_DAYS = 3660  # a custom range of at most ten years


class ReportError(ValueError):
    """A report option that is not valid: ``field`` names it, ``allowed`` says what is."""

    def __init__(self, field: str, problem: str, allowed: str = "") -> None:
        super().__init__(f"{field}: {problem}" + (f" (allowed: {allowed})" if allowed else ""))
        self.field, self.problem, self.allowed = field, problem, allowed


@dataclass(frozen=True)
class Window:
    """``kind`` (month, week or range), its ``label`` (2026-11, 2026-W47, 2026-11-03..
    2026-11-09) and its first and last day (inclusive)."""

    kind: str
    label: str
    first: date
    last: date

    @property
    def start(self) -> float:
        return _epoch(self.first)

    @property
    def end(self) -> float:
        """Exclusive: midnight after the last day."""
        return _epoch(self.last + timedelta(days=1))

    @property
    def days(self) -> list[str]:
        n = (self.last - self.first).days + 1
        return [(self.first + timedelta(days=i)).isoformat() for i in range(n)]

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def elapsed_s(self, now: float) -> float:
        """How much of the window has passed at ``now`` (0 before it, all of it after)."""
        return min(max(now - self.start, 0.0), self.seconds)

    def holds(self, now: float) -> bool:
        return self.start <= now < self.end


def _epoch(d: date) -> float:
    return datetime(d.year, d.month, d.day, tzinfo=timezone.utc).timestamp()


def _day(text: str, field: str) -> date:
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise ReportError(field, f"{text!r} is not a date", "YYYY-MM-DD, e.g. 2026-11-03") \
            from None


def month_window(text: str) -> Window:
    m = re.fullmatch(r"(\d{4})-(\d{2})", text.strip())
    if not m or not 1 <= int(m.group(2)) <= 12 or int(m.group(1)) < 1970:
        raise ReportError("--month", f"{text!r} is not a month", "YYYY-MM, e.g. 2026-11")
    year, month = int(m.group(1)), int(m.group(2))
    first = date(year, month, 1)
    nxt = date(year + month // 12, month % 12 + 1, 1)
    return Window("month", f"{year:04d}-{month:02d}", first, nxt - timedelta(days=1))


def week_window(text: str) -> Window:
    m = re.fullmatch(r"(\d{4})-?W(\d{2})", text.strip().upper())
    if not m or int(m.group(1)) < 1970:
        raise ReportError("--week", f"{text!r} is not an ISO week", "YYYY-Www, e.g. 2026-W47")
    year, week = int(m.group(1)), int(m.group(2))
    try:
        first = date.fromisocalendar(year, week, 1)
    except ValueError:
        weeks = date(year, 12, 28).isocalendar()[1]
        raise ReportError("--week", f"{year} has no week {week}",
                          f"weeks 01 to {weeks:02d} in {year}") from None
    return Window("week", f"{year:04d}-W{week:02d}", first, first + timedelta(days=6))


def range_window(start: str, end: str) -> Window:
    first, last = _day(start, "--from"), _day(end, "--to")
    if last < first:
        raise ReportError("--to", f"{last} is before --from {first}",
                          "a day on or after --from")
    if (last - first).days + 1 > MAX_DAYS:
        raise ReportError("--to", f"{(last - first).days + 1} days is too long",
                          f"at most {MAX_DAYS} days")
    return Window("range", f"{first}..{last}", first, last)


def parse_window(month: str | None, week: str | None, start: str | None, end: str | None,
                 now: float) -> Window:
    """The window the options name: exactly one of a month, a week or a --from/--to range
    (both days given); none: the month holding ``now``. ReportError names the option whose
    window ends past the dates Python has (year 9999's last days)."""
    try:
        window = _window(month, week, start, end, now)
        _ = window.end  # (the midnight after its last day must exist)
    except ReportError:
        raise
    except (ValueError, OverflowError):
        field = "--month" if month is not None else "--week" if week is not None else "--to"
        raise ReportError(field, "is out of range", "a date before 9999-12-31") from None
    return window


def _window(month: str | None, week: str | None, start: str | None, end: str | None,
            now: float) -> Window:
    given = [n for n, v in (("--month", month), ("--week", week)) if v is not None]
    if start is not None or end is not None:
        given.append("--from/--to")
    if len(given) > 1:
        raise ReportError("window", f"{' and '.join(given)} given together",
                          "one of --month, --week, or --from with --to")
    if month is not None:
        return month_window(month)
    if week is not None:
        return week_window(week)
    if start is not None or end is not None:
        if start is None or end is None:
            missing = "--from" if start is None else "--to"
            raise ReportError(missing, "missing", "--from and --to together, YYYY-MM-DD")
        return range_window(start, end)
    t = datetime.fromtimestamp(now, timezone.utc)
    return month_window(f"{t.year:04d}-{t.month:02d}")
