"""Team budgets in the store: the cap model and the budget book (broker/store/budgets_base.py),
its backends (budgets_memory.py, budgets_redis.py with its Lua in budgets_lua.py), the book
beside a store, and the snapshot's view of it.

A :class:`Budget` is a team's cap: an amount in dollars over a window (``month``: the UTC
calendar month, ``week``: the ISO week, ``total``: for ever), ``hard`` (a burst that would
pass it is refused) or soft (it bursts, alerts fire and the team's bursts wait longer), and
alert thresholds in percent of the amount.

The book is the only place money is committed. :meth:`BudgetBook.reserve` is one atomic
check-and-reserve for a whole launch (Redis: one Lua script), so two cycles, two schedulers or
many concurrent submissions cannot reserve the same last dollar; :meth:`BudgetBook.charge`
books one interval of one instance (broker/money/ledger.py computes it), idempotent by (instance,
interval), and turns the reservation of that instance into spend; :meth:`BudgetBook.settle`
releases what is left of an instance's reservation once it stopped.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from broker.store.budgets_base import (
    DEFAULT_ALERTS,
    EPS,
    HISTORY_CAP,
    WINDOWS,
    Budget,
    BudgetBook,
    BudgetError,
    Part,
    Refusal,
    Reservation,
    dumps,
    parse_alerts,
    window_ids,
)
from broker.store.budgets_memory import MemoryBudgets
from broker.store.budgets_redis import RedisBudgets

if TYPE_CHECKING:
    from broker.cycle.plan import Snapshot
    from broker.store.core import StoreCore

__all__ = ["DEFAULT_ALERTS", "EPS", "HISTORY_CAP", "WINDOWS", "Budget", "BudgetBook",
           "BudgetError", "MemoryBudgets", "Part", "RedisBudgets", "Refusal", "Reservation",
           "budget_book", "dumps", "parse_alerts", "window_ids", "with_budgets"]


def budget_book(store: StoreCore) -> BudgetBook:
    """The book beside ``store``: on its Redis server (under its prefix), or one kept with an
    in-memory store."""
    client = getattr(store, "redis", None)
    if client is not None:
        book = getattr(store, "_budget_book", None)
        if book is None:
            book = RedisBudgets(client, getattr(store, "prefix", "sw:"))
            store._budget_book = book  # type: ignore[attr-defined]
        return book  # type: ignore[no-any-return]
    book = getattr(store, "_budget_book", None)
    if book is None:
        book = MemoryBudgets()
        store._budget_book = book  # type: ignore[attr-defined]
    return book  # type: ignore[no-any-return]


def with_budgets(snap: Snapshot, book: BudgetBook, read: tuple[Any, Any] | None = None
                 ) -> Snapshot:
    """``snap`` with each budgeted team's cap (``budgets``), dollars committed in the cap's
    current window (``spend``: spent + reserved) and the soft caps (``soft_budgets``).
    ``read``: the book's first read, made with the snapshot's (:meth:`BudgetBook.committed`)."""
    caps, spend = book.committed(snap.now, read)
    if not caps:
        return snap
    return replace(snap, budgets={t: b.amount for t, b in caps.items()}, spend=spend,
                   soft_budgets=frozenset(t for t, b in caps.items() if not b.hard))
