"""Budget commands: set, show, rm and the history of a team's cap (docs/budgets.md).

With a ``redis://`` URL they use the budget book in the store; with an ``https://`` URL they go
through the API server (broker/api/budgets.py) with the caller's token, which is then named in
the history.
"""

import getpass
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from broker.cli.common import (
    err,
    fail,
    out,
    print_fitted,
    print_json,
    settings,
    spec_error,
    table_width,
)
from broker.cli.root import app

if TYPE_CHECKING:
    from broker.store.budgets import BudgetBook

Opt = typer.Option

budget_app = typer.Typer(help="Team budgets: cost caps enforced before a burst (finance).",
                         no_args_is_help=True)
app.add_typer(budget_app, name="budget")


def _target(ctx: typer.Context) -> tuple[Any, "BudgetBook | None"]:
    """(the API transport, None) for an https:// URL; (None, the book) for Redis."""
    from broker.store.budgets import budget_book

    client = settings(ctx).client()
    if client._remote is not None:
        return client._remote, None
    return None, budget_book(client.store)


def who() -> str:
    """Who changes a budget: the OS user (API tokens will name people later)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


@budget_app.command("set")
def set_(
    ctx: typer.Context,
    team: Annotated[str, typer.Argument(help="The team, as jobs name it (JobSpec.team).")],
    monthly: Annotated[float | None, Opt("--monthly", help="Dollars per calendar month "
                                                         "(UTC).")] = None,
    weekly: Annotated[float | None, Opt("--weekly", help="Dollars per ISO week (UTC).")
                      ] = None,
    total: Annotated[float | None, Opt("--total", help="Dollars for ever.")] = None,
    hard: Annotated[bool, Opt("--hard/--soft", help="Hard: a burst that would pass the cap "
                                                   "is refused. Soft: it bursts, alerts fire "
                                                   "and the team's bursts wait longer.")
                    ] = True,
    alerts: Annotated[str, Opt("--alerts", help="Alert thresholds, percent of the cap.")
                      ] = "50,80,100",
) -> None:
    """Set a team's cap (replaces its previous one; the change is kept in its history)."""
    given = {k: v for k, v in (("month", monthly), ("week", weekly), ("total", total))
             if v is not None}
    if len(given) != 1:
        raise spec_error("window", f"{len(given)} given" if given else "none given",
                         "exactly one of --monthly, --weekly, --total")
    window, amount = next(iter(given.items()))
    from broker.store.budgets import Budget, BudgetError, parse_alerts

    try:
        budget = Budget(team, amount, window, hard, parse_alerts(alerts))
    except BudgetError as e:
        field, _, problem = str(e).partition(": ")
        raise spec_error(field, problem) from None
    remote, book = _target(ctx)
    if remote is not None:
        remote.set_budget(team, budget.amount, budget.window, budget.hard, budget.alerts)
    else:
        assert book is not None
        book.set(budget, who(), time.time())
    kind = "hard" if hard else "soft"
    out.print(f"team {team}: {kind} cap ${budget.amount:,.2f} per {window}, alerts at "
              f"{', '.join(f'{a:g}%' for a in budget.alerts)}")


def _cells(s: dict[str, Any]) -> tuple[str, ...]:
    if "amount" not in s:
        return (s["team"], "-", "-", f"{s['spent']:,.2f}", f"{s['reserved']:,.2f}", "-", "-",
                "-")
    fired = ",".join(f"{a:g}%" for a in s["alerts_fired"]) or "-"
    return (s["team"], f"{s['amount']:,.2f}", f"{s['window']} {s['window_id']}",
            f"{s['spent']:,.2f}", f"{s['reserved']:,.2f}", f"{s['left']:,.2f}",
            "hard" if s["hard"] else "soft", fired)


@budget_app.command("show")
def show(
    ctx: typer.Context,
    team: Annotated[str | None, typer.Argument(help="One team (default: every budget).")
                    ] = None,
    as_json: Annotated[bool, Opt("--json", help="Print JSON (a list, one entry per team).")
                       ] = False,
) -> None:
    """Each team's cap, spent and reserved in its current window, what is left, and the
    alerts fired."""
    remote, book = _target(ctx)
    if remote is not None:
        rows = remote.budgets(team)
    else:
        assert book is not None
        now = time.time()
        rows = [book.status(t, now) for t in ([team] if team else sorted(book.budgets()))]
    if as_json:
        print_json(rows)
        return
    if not rows:
        err.print("no budgets set (spillway budget set TEAM --monthly 20000 --hard)")
        return
    table = Table(box=None, pad_edge=False)
    for head in ("TEAM", "CAP $", "WINDOW", "SPENT $", "RESERVED $", "LEFT $", "KIND",
                 "ALERTS"):
        table.add_column(head, justify="right" if head.endswith("$") else "left")
    for r in rows:
        table.add_row(*(escape(c) for c in _cells(r)))
    print_fitted(table, table_width())
    if team and "amount" not in rows[0]:
        err.print(f"team {team} has no budget")


@budget_app.command("rm")
def rm(ctx: typer.Context,
       team: Annotated[str, typer.Argument(help="The team whose cap goes.")]) -> None:
    """Remove a team's cap (its spend and history stay)."""
    remote, book = _target(ctx)
    if remote is not None:
        remote.remove_budget(team)  # (the server's error says when there is none)
    elif book is not None and not book.remove(team, who(), time.time()):
        raise fail(f"team {team} has no budget; `spillway budget show` lists them")
    out.print(f"team {team}: budget removed")


@budget_app.command("history")
def history(
    ctx: typer.Context,
    team: Annotated[str | None, typer.Argument(help="One team (default: all).")] = None,
    as_json: Annotated[bool, Opt("--json", help="Print JSON.")] = False,
) -> None:
    """Every change of the caps: who, when, before and after."""
    remote, book = _target(ctx)
    rows = _remote_history(remote, team) if remote is not None else \
        book.history(team) if book is not None else []
    if as_json:
        print_json(rows)
        return
    for h in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(h["at"]))
        after = h["after"]
        what = (f"{'hard' if after['hard'] else 'soft'} ${after['amount']:,.2f} per "
                f"{after['window']}") if after else "removed"
        out.print(f"{when}Z  {h['team']:<16} {h['action']:<4} {what}  by {h['who']}",
                  markup=False)


def _remote_history(remote: Any, team: str | None) -> list[dict[str, Any]]:
    """One team's history, or (no team) that of every team the token may read: a team-bound
    token's own teams, else every team with a budget now."""
    if team is not None:
        return list(remote.budget_history(team))
    me = remote.whoami()
    teams = me["teams"] if me["role"] in ("user", "finance") else \
        [b["team"] for b in remote.budgets()]
    rows = [h for t in teams for h in remote.budget_history(t)]
    return sorted(rows, key=lambda h: (h["at"], h["team"]))
