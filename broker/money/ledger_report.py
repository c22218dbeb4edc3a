"""The ledger's read API: spend and GPU-hours by team, site and day, and each team's cap, for
``spillway report`` and anything else that reads money (docs/budgets.md).

Everything here reads :meth:`BudgetBook.sums` (per (team, site, UTC day): dollars, GPU-seconds
used, idle GPU-seconds charged) and :meth:`BudgetBook.status`; it writes nothing::

    book = budget_book(store)                      # broker/store/budgets.py
    rows = spend_rows(book, month="2026-11")       # one row per team, site and day
    by_team = spend_by(book, "team", month="2026-11")   # key -> Totals
    caps = budget_status(book, now)                # what `spillway budget show --json` prints
    machines = machine_charges(book, store.instances(), jobs, gpus_of, "2026-11-01",
                               "2026-12-01")      # the machines behind those dollars

The ledger keeps sums, not a line per machine: :func:`machine_charges` finds the machines
behind them by replaying, for each instance record, the intervals the book says were booked
through the ledger's own split (broker/money/ledger.py), so each machine's team shares are the
dollars the ledger charged for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from broker.store.budgets import BudgetBook

if TYPE_CHECKING:
    from broker.model import Instance, Job

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


@dataclass(frozen=True)
class MachineCharge:
    """One rented machine's charges on a range of days: the billed span in the range
    (``start`` to ``end``, ``seconds`` long: the booked hours, so a machine still running is
    charged up to its last whole hour), its price, and the dollars each team was charged
    (jobs' GPU-seconds, idle time to the teams it was launched for)."""

    request_id: str
    instance_id: str  # the cloud's id once known, else the request id
    offer_id: str  # site/instance type, e.g. aws:us-east-1:us-east-1a:spot/p3.2xlarge
    gpus: int
    price_per_hour: float  # the whole machine's, as recorded at launch
    start: float
    end: float
    seconds: float
    running: bool  # not ended yet
    shares: dict[str, float] = field(default_factory=dict)  # team -> dollars

    @property
    def site(self) -> str:
        return self.offer_id.partition("/")[0]

    @property
    def instance_type(self) -> str:
        return self.offer_id.partition("/")[2]

    @property
    def provider(self) -> str:
        return self.site.split(":", 1)[0]

    @property
    def region(self) -> str:
        parts = self.site.split(":")
        return parts[1] if len(parts) > 2 else ""

    @property
    def market(self) -> str:
        """``spot`` or ``on-demand``."""
        m = self.site.rsplit(":", 1)[-1]
        return "on-demand" if m == "ondemand" else m

    @property
    def usd(self) -> float:
        return math.fsum(self.shares.values())

    def to_dict(self) -> dict[str, Any]:
        def iso(t: float) -> str:
            return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

        return {"request_id": self.request_id, "instance_id": self.instance_id,
                "provider": self.provider, "region": self.region, "site": self.site,
                "instance_type": self.instance_type, "market": self.market,
                "gpus": self.gpus, "start": iso(self.start), "end": iso(self.end),
                "seconds": round(self.seconds, 3), "running": self.running,
                "price_per_hour": self.price_per_hour, "usd": self.usd,
                "shares": dict(sorted(self.shares.items()))}


def machine_charges(book: BudgetBook, records: Iterable[Instance], jobs: Iterable[Job],
                    gpus_of: Callable[[Instance], int], since: str, until: str,
                    interval_s: float = 3600.0) -> list[MachineCharge]:
    """The machines behind the ledger's charges on days [since, until) (YYYY-MM-DD; a
    charge's day is its interval's start's UTC day, as in :func:`spend_rows`): each instance
    record's booked intervals (all of a settled machine's, else up to the book's mark)
    split as :func:`broker.money.ledger.accrue` split them. ``jobs``: every job that ran on the
    machines (the archive's too); ``gpus_of``: a machine's GPU count. Sorted by start."""
    from broker.money.ledger import billing_start, day_of, payers_of, split, uses_by_node

    records = list(records)
    jobs = list(jobs)
    uses = uses_by_node(jobs)
    by_id = {j.id: j for j in jobs}
    settled = book.settled()
    out = []
    for inst in records:
        start = billing_start(inst)
        if start is None:
            continue
        if inst.request_id in settled:
            if inst.ended_at is None:
                continue
            last = math.ceil(inst.ended_at / interval_s) - 1
        else:
            mark = book.charged_upto(inst.request_id)
            if mark is None or mark < 0:
                continue
            last = mark
        stop = inst.ended_at if inst.ended_at is not None else (last + 1) * interval_s
        node_uses = uses.get(inst.node_id, []) if inst.node_id else []
        payers, gpus = payers_of(inst, by_id), gpus_of(inst)
        site = inst.offer_id.partition("/")[0]
        shares: dict[str, float] = {}
        span: list[float] = []
        seconds = 0.0
        for k in range(int(start // interval_s), last + 1):
            a, b = max(start, k * interval_s), min(stop, (k + 1) * interval_s)
            if b <= a or not since <= day_of(a) < until:
                continue
            for p in split(inst.price_per_hour, gpus, a, b, node_uses, payers, site):
                shares[p.team] = shares.get(p.team, 0.0) + p.usd
            span = [span[0] if span else a, b]
            seconds += b - a
        if span:
            out.append(MachineCharge(inst.request_id, inst.id, inst.offer_id, gpus,
                                     inst.price_per_hour, span[0], span[1], seconds,
                                     not inst.ended, shares))
    return sorted(out, key=lambda m: (m.start, m.request_id))
