"""The ledger's read API: spend and GPU-hours by team, site and day, and each team's cap, for
``spillway report`` and anything else that reads money (docs/budgets.md).

Everything here reads :meth:`BudgetBook.sums` (per (team, site, UTC day): dollars, GPU-seconds
used, idle GPU-seconds charged) and :meth:`BudgetBook.status`; it writes nothing::

    book = budget_book(store)                      # broker/store/budgets.py
    rows = spend_rows(book, month="2026-11")       # one row per team, site and day
    by_team = spend_by(book, "team", month="2026-11")   # key -> Totals
    caps = budget_status(book, now)                # what `spillway budget show --json` prints
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from broker.store.budgets import BudgetBook

BY = ("team", "site", "day")


@dataclass(frozen=True)
class SpendRow:
    team: str
    site: str  # the offer's site id, e.g. aws:us-east-1:us-east-1a:spot
    day: str  # UTC, YYYY-MM-DD (of the hour charged)
    usd: float
    gpu_hours: float  # GPU-hours the team's jobs used
    idle_gpu_hours: float  # idle GPU-hours charged to it (machines launched for its jobs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Totals:
    usd: float = 0.0
    gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0

    def add(self, row: SpendRow) -> None:
        self.usd += row.usd
        self.gpu_hours += row.gpu_hours
        self.idle_gpu_hours += row.idle_gpu_hours


def spend_rows(book: BudgetBook, month: str | None = None, since: str | None = None,
               until: str | None = None, teams: Sequence[str] | None = None
               ) -> list[SpendRow]:
    """Ledger rows, sorted by day, team, site. ``month`` (YYYY-MM) or ``since``/``until``
    (YYYY-MM-DD, inclusive/exclusive) keep those days; ``teams`` those teams."""
    keep = set(teams) if teams else None
    out = []
    for (team, site, day), (usd, gpu_s, idle_s) in book.sums().items():
        if month is not None and not day.startswith(month + "-"):
            continue
        if (since is not None and day < since) or (until is not None and day >= until):
            continue
        if keep is not None and team not in keep:
            continue
        out.append(SpendRow(team, site, day, usd, gpu_s / 3600.0, idle_s / 3600.0))
    return sorted(out, key=lambda r: (r.day, r.team, r.site))


def spend_by(book: BudgetBook, by: str, **filters: Any) -> dict[str, Totals]:
    """Totals keyed by ``by`` (team, site or day) over :func:`spend_rows` (same filters)."""
    if by not in BY:
        raise ValueError(f"by: {by!r} is not allowed; one of {', '.join(BY)}")
    out: dict[str, Totals] = {}
    for row in spend_rows(book, **filters):
        out.setdefault(getattr(row, by), Totals()).add(row)
    return dict(sorted(out.items()))


def budget_status(book: BudgetBook, now: float) -> list[dict[str, Any]]:
    """Each budgeted team's cap, window, spent and reserved in its current window, what is
    left and the alerts fired (``spillway budget show --json``)."""
    return [book.status(team, now) for team in sorted(book.budgets())]
