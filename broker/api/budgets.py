"""Budget routes: each team's cap, spent, reserved and left; set, remove, and the history of
changes (docs/budgets.md).

``finance`` reads and writes the budgets of the teams its token is given, ``operator`` reads
every team's, ``admin`` reads and writes every team's, and a ``user`` reads its own team's
(what it has spent and has left). A team the token may not see answers 404 with the same
words whether it has a budget or not (see :class:`TeamNotFound`), and is left out of lists.
Every change is recorded in the budget history with the token's holder, role and teams.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from broker.api import auth
from broker.api.deps import principal, state
from broker.errors import FieldError, SpecError, SpillwayError
from broker.security.tokens import TokenRecord
from broker.store.budgets import DEFAULT_ALERTS, Budget, BudgetBook, BudgetError, budget_book

router = APIRouter(prefix="/v1/budgets", tags=["budgets"])

Who = Annotated[TokenRecord, Depends(principal)]
TEAM_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"  # (a JobSpec's team: broker/model/spec.py)
Team = Annotated[str, Path(pattern=TEAM_PATTERN, description="A team, as jobs name it")]


class TeamNotFound(SpillwayError):
    """A team the token may not see (HTTP 404): the same words whether it exists or not."""

    def __init__(self, team: str, who: TokenRecord, action: str, what: str = "budget"
                 ) -> None:
        self.team = team
        every = " or ".join(r for r in auth.ALLOWED[action] if r not in auth.TEAM_SCOPED)
        super().__init__(f"no {what} of team {team!r} that your token may see; yours "
                         f"({who.user}, role {who.role}) is for team "
                         f"{', '.join(who.teams) or '-'} (a token of team {team!r}, or role "
                         f"{every}, would be needed)")


class InvalidInput(SpecError):
    """Bad input to a budget or report route (HTTP 422), each field named; not a job spec."""

    def __init__(self, errors: Sequence[FieldError], what: str = "budget") -> None:
        self.errors = tuple(errors)
        SpillwayError.__init__(self, f"invalid {what} ({len(self.errors)} problem(s)): "
                                     + "; ".join(str(e) for e in self.errors))


class NoBudget(SpillwayError):
    """A team (the token may see) without a cap, where one is needed (HTTP 404)."""

    def __init__(self, team: str) -> None:
        super().__init__(f"team {team!r} has no budget; GET /v1/budgets lists them")


class BudgetBody(BaseModel):
    """A team's cap (as ``spillway budget set``)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # ("5" and true are no amounts)
    amount: float = Field(ge=0, allow_inf_nan=False, description="Dollars per window")
    window: Literal["month", "week", "total"] = Field(
        default="month", description="month: the UTC calendar month; week: the ISO week; "
                                     "total: for ever")
    hard: bool = Field(default=True, description="true: a burst that would pass the cap is "
                                                 "refused; false (soft): it bursts and alerts")
    alerts: list[float] = Field(default=list(DEFAULT_ALERTS), max_length=20,
                                description="Alert thresholds, percent of the amount")


def scoped(who: TokenRecord, action: str, team: str, what: str = "budget") -> str:
    """``team`` if ``who`` may do ``action`` on it: Refused (403, naming the role) for a role
    that may not, TeamNotFound (404) for a team-bound token of other teams."""
    auth.require(who, action)
    if who.role in auth.TEAM_SCOPED and team not in who.teams:
        raise TeamNotFound(team, who, action, what)
    return team


def book(request: Request) -> BudgetBook:
    return budget_book(state(request).client.store)


@router.get("", summary="Each budget: cap, spent and reserved in its window, left, alerts")
def list_budgets(who: Who, request: Request,
                 team: Annotated[str | None, Query(pattern=TEAM_PATTERN)] = None
                 ) -> list[dict[str, Any]]:
    """Every budget the token may see (a team-bound token: its teams'), or ``team``'s
    alone (even without a cap: its spend)."""
    b, now = book(request), time.time()
    if team is not None:
        return [b.status(scoped(who, "budgets.read", team), now)]
    auth.require(who, "budgets.read")
    teams = sorted(t for t in b.budgets()
                   if who.role not in auth.TEAM_SCOPED or t in who.teams)
    return [b.status(t, now) for t in teams]


@router.get("/{team}", summary="One team's cap, spent, reserved, left and alerts fired")
def get_budget(team: Team, who: Who, request: Request) -> dict[str, Any]:
    """No ``amount`` (nor ``left``) when the team has no cap."""
    return book(request).status(scoped(who, "budgets.read", team), time.time())


def _budget(team: str, body: BudgetBody) -> Budget:
    try:
        return Budget(team, body.amount, body.window, body.hard, tuple(body.alerts))
    except BudgetError as e:
        field, _, problem = str(e).partition(": ")
        raise InvalidInput([FieldError(field, problem)]) from None


@router.put("/{team}", summary="Set a team's cap (replaces its previous one)")
def set_budget(team: Team, body: BudgetBody, who: Who, request: Request) -> dict[str, Any]:
    """The change is kept in the team's history with the token's holder; the reply is the
    team's budget as ``GET`` shows it."""
    budget = _budget(scoped(who, "budgets.write", team), body)
    b, now = book(request), time.time()
    b.set(budget, who.actor, now)
    return b.status(team, now)


@router.delete("/{team}", summary="Remove a team's cap (its spend and history stay)")
def remove_budget(team: Team, who: Who, request: Request) -> dict[str, Any]:
    b, now = book(request), time.time()
    if not b.remove(scoped(who, "budgets.write", team), who.actor, now):
        raise NoBudget(team)
    return {"team": team, "removed": True, "by": who.actor}


@router.get("/{team}/history", summary="Every change of the team's cap: who, when, before "
                                       "and after")
def history(team: Team, who: Who, request: Request) -> list[dict[str, Any]]:
    return book(request).history(scoped(who, "budgets.read", team))


NOT_FOUND = (TeamNotFound, NoBudget)  # (the app answers these 404)
