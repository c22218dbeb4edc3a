"""The budget book in one process (the simulator, unit tests): the rules of the Redis book
(broker/store/budgets_redis.py) under a lock."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from broker.store.budgets_base import (
    EPS,
    HISTORY_CAP,
    Budget,
    BudgetBook,
    Part,
    Refusal,
    Reservation,
    window_ids,
)


@dataclass
class _Books:
    budgets: dict[str, Budget] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    spent: dict[str, dict[str, float]] = field(default_factory=dict)  # team -> window -> $
    reserved: dict[str, float] = field(default_factory=dict)
    res: dict[str, Reservation] = field(default_factory=dict)  # "key|team" -> reservation
    mark: dict[str, int] = field(default_factory=dict)  # instance -> last interval charged
    done: set[str] = field(default_factory=set)  # instances settled
    applied: set[str] = field(default_factory=set)  # reservation tokens applied
    ledger: dict[str, list[float]] = field(default_factory=dict)  # "team|site|day" -> sums
    alerts: dict[str, dict[str, float]] = field(default_factory=dict)  # team -> "w:pct" -> t


class MemoryBudgets(BudgetBook):
    """The book in one process (the simulator, unit tests), with the Redis book's rules."""

    def __init__(self) -> None:
        self._b = _Books()
        self._lock = threading.Lock()

    def _put(self, budget: Budget | None, team: str, entry: dict[str, Any]) -> None:
        with self._lock:
            if budget is None:
                self._b.budgets.pop(team, None)
            else:
                self._b.budgets[team] = budget
            self._b.history = [*self._b.history, entry][-HISTORY_CAP:]

    def budgets(self) -> dict[str, Budget]:
        return dict(self._b.budgets)

    def history(self, team: str | None = None) -> list[dict[str, Any]]:
        return [h for h in self._b.history if team is None or h["team"] == team]

    def spent(self, team: str) -> dict[str, float]:
        return dict(self._b.spent.get(team, {}))

    def reserved(self) -> dict[str, float]:
        return dict(self._b.reserved)

    def reservations(self) -> list[Reservation]:
        return list(self._b.res.values())

    def reserve(self, parts: Sequence[tuple[str, str, float]], now: float,
                token: str = "") -> Refusal | None:
        with self._lock:
            b = self._b
            token = token or (parts[0][0] if parts else "")
            if not parts or token in b.applied:
                return None
            need: dict[str, float] = {}
            for _, team, usd in parts:
                need[team] = need.get(team, 0.0) + usd
            wids = window_ids(now)
            for team, usd in need.items():
                cap = b.budgets.get(team)
                if cap is None or not cap.hard:
                    continue
                spent = b.spent.get(team, {}).get(wids[cap.window], 0.0)
                res = b.reserved.get(team, 0.0)
                if spent + res + usd > cap.amount + EPS:
                    return Refusal(team, spent, res, usd, cap.amount)
            for key, team, usd in parts:
                k = f"{key}|{team}"
                old = b.res.get(k)
                b.res[k] = Reservation(key, team, usd + (old.amount if old else 0.0),
                                       usd + (old.left if old else 0.0), now)
                b.reserved[team] = b.reserved.get(team, 0.0) + usd
            b.applied.add(token)
            return None

    def charge(self, key: str, interval: int, parts: Sequence[Part], now: float) -> bool:
        with self._lock:
            b = self._b
            if key in b.done or b.mark.get(key, -1) >= interval:
                return False
            b.mark[key] = interval
            wids = window_ids(now)
            for p in parts:
                sums = b.ledger.setdefault(f"{p.team}|{p.site}|{p.day}", [0.0, 0.0, 0.0])
                sums[0] += p.usd
                sums[1] += p.gpu_s
                sums[2] += p.idle_s
                spent = b.spent.setdefault(p.team, {})
                for wid in wids.values():
                    spent[wid] = spent.get(wid, 0.0) + p.usd
                r = b.res.get(f"{key}|{p.team}")
                if r is not None and r.left > 0:
                    use = min(r.left, p.usd)
                    b.res[f"{key}|{p.team}"] = replace(r, left=r.left - use)
                    b.reserved[p.team] = b.reserved.get(p.team, 0.0) - use
            return True

    def settle(self, key: str) -> None:
        with self._lock:
            b = self._b
            for k in [k for k, r in b.res.items() if r.key == key]:
                r = b.res.pop(k)
                b.reserved[r.team] = b.reserved.get(r.team, 0.0) - r.left
            b.done.add(key)

    def settled(self) -> frozenset[str]:
        return frozenset(self._b.done)

    def charged_upto(self, key: str) -> int | None:
        return -1 if key in self._b.done else self._b.mark.get(key)

    def sums(self) -> dict[tuple[str, str, str], tuple[float, float, float]]:
        return {tuple(k.split("|", 2)): (v[0], v[1], v[2])  # type: ignore[misc]
                for k, v in self._b.ledger.items()}

    def _fire(self, team: str, field_: str, now: float) -> bool:
        with self._lock:
            fired = self._b.alerts.setdefault(team, {})
            if field_ in fired:
                return False
            fired[field_] = now
            return True

    def alerts(self, team: str) -> dict[str, float]:
        return dict(self._b.alerts.get(team, {}))
