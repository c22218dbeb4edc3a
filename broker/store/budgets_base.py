"""Team budgets in the store: the cap model, its validation, and the budget book's interface
(reservations, spend per window, alerts, a history of changes). broker/store/budgets.py
re-exports it with the factory of the book beside a store.

broker/store/budgets.py describes budgets and the book.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

WINDOWS = ("month", "week", "total")
DEFAULT_ALERTS = (50.0, 80.0, 100.0)
EPS = 1e-6  # dollars: float slack in the cap comparisons
HISTORY_CAP = 10_000  # changes kept


class BudgetError(ValueError):
    """A budget that is not valid: the message names the field, what was wrong, what is
    allowed."""


@dataclass(frozen=True)
class Budget:
    team: str
    amount: float  # dollars per window
    window: str = "month"
    hard: bool = True
    alerts: tuple[float, ...] = DEFAULT_ALERTS  # percent of the amount

    def __post_init__(self) -> None:
        if not isinstance(self.team, str) or not self.team.strip() or len(self.team) > 64 \
                or any(c.isspace() or c == "|" for c in self.team):
            raise BudgetError(f"team: {self.team!r} is not allowed; a name of 1-64 characters "
                              "without spaces or '|'")
        if isinstance(self.amount, bool) or not isinstance(self.amount, (int, float)) \
                or not math.isfinite(self.amount) or self.amount < 0:
            raise BudgetError(f"amount: {self.amount!r} is not allowed; a number of dollars "
                              ">= 0")
        if self.window not in WINDOWS:
            raise BudgetError(f"window: {self.window!r} is not allowed; one of "
                              f"{', '.join(WINDOWS)}")
        alerts = tuple(self.alerts)
        for a in alerts:
            if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) \
                    or not 0 < a <= 1000:
                raise BudgetError(f"alerts: {a!r} is not allowed; percents in (0, 1000], "
                                  "e.g. 50,80,100")
        object.__setattr__(self, "amount", float(self.amount))
        object.__setattr__(self, "alerts", tuple(sorted({float(a) for a in alerts})))

    def to_dict(self) -> dict[str, Any]:
        return {"team": self.team, "amount": self.amount, "window": self.window,
                "hard": self.hard, "alerts": list(self.alerts)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Budget:
        return cls(str(d["team"]), d["amount"], str(d.get("window", "month")),
                   bool(d.get("hard", True)), tuple(d.get("alerts", DEFAULT_ALERTS)))


def parse_alerts(text: str) -> tuple[float, ...]:
    """``"50,80,100"`` -> (50.0, 80.0, 100.0); BudgetError naming the bad part."""
    out = []
    for part in text.split(","):
        try:
            out.append(float(part.strip().rstrip("%")))
        except ValueError:
            raise BudgetError(f"alerts: {part.strip()!r} is not a number; percents such as "
                              "50,80,100") from None
    return tuple(out)


def window_ids(now: float) -> dict[str, str]:
    """The id of the window of each kind that holds ``now`` (UTC)."""
    t = datetime.fromtimestamp(now, timezone.utc)
    year, week, _ = t.isocalendar()
    return {"month": f"{t.year:04d}-{t.month:02d}", "week": f"{year:04d}-W{week:02d}",
            "total": "total"}


@dataclass(frozen=True)
class Reservation:
    """Money set aside for one instance (``key``: its request id) and one team."""

    key: str
    team: str
    amount: float
    left: float  # not yet turned into spend
    at: float


@dataclass(frozen=True)
class Refusal:
    """Why :meth:`BudgetBook.reserve` refused: the team's hard cap and its numbers."""

    team: str
    spent: float
    reserved: float
    need: float
    cap: float

    @property
    def over_by(self) -> float:
        return self.spent + self.reserved + self.need - self.cap


@dataclass(frozen=True)
class Part:
    """One team's share of one interval of one instance (broker/money/ledger.py)."""

    team: str
    usd: float
    gpu_s: float  # GPU-seconds its jobs used
    idle_s: float  # idle GPU-seconds charged to it (it caused the launch)
    site: str
    day: str  # UTC date of the interval, YYYY-MM-DD


class BudgetBook(ABC):
    """Budgets, reservations, spend and the ledger's sums; see the module docstring."""

    # -- budgets -----------------------------------------------------------------------------

    @abstractmethod
    def _put(self, budget: Budget | None, team: str, entry: dict[str, Any]) -> None: ...

    @abstractmethod
    def budgets(self) -> dict[str, Budget]: ...

    @abstractmethod
    def history(self, team: str | None = None) -> list[dict[str, Any]]: ...

    def set(self, budget: Budget, who: str, now: float) -> None:
        old = self.budgets().get(budget.team)
        self._put(budget, budget.team, {"team": budget.team, "action": "set", "who": who,
                                        "at": now, "before": old.to_dict() if old else None,
                                        "after": budget.to_dict()})

    def remove(self, team: str, who: str, now: float) -> bool:
        old = self.budgets().get(team)
        if old is None:
            return False
        self._put(None, team, {"team": team, "action": "rm", "who": who, "at": now,
                               "before": old.to_dict(), "after": None})
        return True

    # -- money -------------------------------------------------------------------------------

    @abstractmethod
    def spent(self, team: str) -> dict[str, float]:
        """Window id -> dollars charged to ``team`` in it."""

    @abstractmethod
    def reserved(self) -> dict[str, float]:
        """Team -> dollars reserved and not yet spent or released."""

    @abstractmethod
    def reservations(self) -> list[Reservation]: ...

    @abstractmethod
    def reserve(self, parts: Sequence[tuple[str, str, float]], now: float,
                token: str = "") -> Refusal | None:
        """Reserve (instance key, team, dollars) for each part, all or none: None if done
        (or done before: idempotent by ``token``, default the first part's key), else the
        first hard cap that spent + reserved + the team's parts would pass."""

    @abstractmethod
    def charge(self, key: str, interval: int, parts: Sequence[Part], now: float) -> bool:
        """Book one interval of instance ``key`` (intervals in increasing order); False if it
        was booked before. Each part's dollars become spend in every window holding ``now``
        (the interval's start) and use up the team's reservation for ``key``."""

    @abstractmethod
    def settle(self, key: str) -> None:
        """Release what is left of ``key``'s reservations; mark it settled (idempotent)."""

    @abstractmethod
    def settled(self) -> frozenset[str]:
        """The instance keys settled."""

    @abstractmethod
    def charged_upto(self, key: str) -> int | None:
        """The last interval booked for instance ``key`` (None: none); -1 once settled."""

    @abstractmethod
    def sums(self) -> dict[tuple[str, str, str], tuple[float, float, float]]:
        """(team, site, day) -> (dollars, GPU-seconds used, idle GPU-seconds charged)."""

    @abstractmethod
    def _fire(self, team: str, field_: str, now: float) -> bool:
        """Record an alert once; True if it is new."""

    @abstractmethod
    def alerts(self, team: str) -> dict[str, float]:
        """``"<window id>:<percent>"`` -> when it fired."""

    def fire_alerts(self, team: str, now: float) -> list[float]:
        """Record the thresholds the team's spend has reached in its current window; the
        thresholds newly reached."""
        b = self.budgets().get(team)
        if b is None or b.amount <= 0:
            return []
        wid = window_ids(now)[b.window]
        pct = 100.0 * self.spent(team).get(wid, 0.0) / b.amount
        return [a for a in b.alerts if pct + EPS >= a and self._fire(team, f"{wid}:{a:g}", now)]

    def committed(self, now: float, read: tuple[Any, Any] | None = None
                  ) -> tuple[dict[str, Budget], dict[str, float]]:
        """Every budget, and each budgeted team's dollars spent in its cap's current window
        plus reserved (what a snapshot needs). ``read``: what a backend read of them with the
        snapshot, if it did (Redis: :meth:`RedisBudgets.queue_committed`)."""
        del read
        caps = self.budgets()
        reserved = self.reserved()
        wids = window_ids(now)
        return caps, {t: self.spent(t).get(wids[b.window], 0.0) + reserved.get(t, 0.0)
                      for t, b in caps.items()}

    def status(self, team: str, now: float) -> dict[str, Any]:
        """What ``spillway budget show`` prints of one team."""
        b = self.budgets().get(team)
        wid = window_ids(now)[b.window if b else "month"]
        spent = self.spent(team).get(wid, 0.0)
        reserved = self.reserved().get(team, 0.0)
        out: dict[str, Any] = {"team": team, "window_id": wid, "spent": round(spent, 4),
                               "reserved": round(reserved, 4)}
        if b is not None:
            out.update(b.to_dict())
            out["left"] = round(b.amount - spent - reserved, 4)
            out["alerts_fired"] = sorted(float(k.split(":")[1]) for k in self.alerts(team)
                                         if k.startswith(wid + ":"))
        return out


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)
