"""The spend report over HTTP: ``GET /v1/reports`` is ``spillway report`` (docs/reports.md) as
JSON, CSV or a self-contained HTML page.

``finance`` reads the report of the teams its token is given: every other team's charges,
runs, caps, reservations and shares of machines are left out before the sums are made, so
totals, sites, zones, days and machines hold its teams' figures only. ``operator`` and
``admin`` read every team's; a ``user`` is refused (the message names the roles that may).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response

from broker.api import auth
from broker.api.budgets import TEAM_PATTERN, InvalidInput, scoped
from broker.api.deps import principal, state
from broker.errors import FieldError
from broker.money.report import Inputs, build, machines_of
from broker.money.report_data import fallback_note, gather
from broker.money.report_html import to_html
from broker.money.report_render import to_csv
from broker.money.report_window import ReportError, parse_window
from broker.security.tokens import TokenRecord

router = APIRouter(prefix="/v1/reports", tags=["reports"])

Who = Annotated[TokenRecord, Depends(principal)]
Month = Annotated[str | None, Query(max_length=16, description="YYYY-MM (default: this "
                                                               "month)")]
Week = Annotated[str | None, Query(max_length=16, description="YYYY-Www")]
Day = Annotated[str | None, Query(max_length=16, description="YYYY-MM-DD")]


def only(inputs: Inputs, teams: set[str]) -> Inputs:
    """``inputs`` with nothing of any team outside ``teams``."""
    return replace(inputs,
                   charges=[c for c in inputs.charges if c.team in teams],
                   runs=[r for r in inputs.runs if r.team in teams],
                   budgets={t: b for t, b in inputs.budgets.items() if t in teams},
                   reserved={t: v for t, v in inputs.reserved.items() if t in teams},
                   spent_total={t: v for t, v in inputs.spent_total.items() if t in teams},
                   machines=machines_of(inputs.machines, teams))


def report_data(who: TokenRecord, request: Request, month: str | None, week: str | None,
                start: str | None, end: str | None, by: str, forecast: str,
                team: str | None) -> dict[str, Any]:
    """The report as ``build`` makes it, of the teams ``who`` may read."""
    auth.require(who, "reports.read")
    if team is not None:
        scoped(who, "reports.read", team, what="report")
    api, now = state(request), time.time()
    try:
        window = parse_window(month, week, start, end, now)
        inputs, em = gather(api.client.store, api.client.config, window, now, team)
        if who.role in auth.TEAM_SCOPED:
            inputs = only(inputs, set(who.teams))
        data = build(inputs, em, em.chargeback, by, forecast)
    except ReportError as e:
        allowed = e.allowed
        if e.field == "--team" and who.role in auth.TEAM_SCOPED:
            allowed = ", ".join(who.teams)  # (not the names of teams it may not read)
        raise InvalidInput([FieldError(e.field.removeprefix("--"), e.problem, allowed)],
                           "report options") from None
    data["notes"] += fallback_note(em)
    return data


@router.get("", summary="Spend against caps, forecast, GPU-hours, chargeback and emissions",
            response_model=None,
            responses={200: {"content": {"application/json": {}, "text/csv": {},
                                         "text/html": {}},
                             "description": "The report (as `spillway report --format`)"}})
def report(who: Who, request: Request, month: Month = None, week: Week = None,
           from_: Annotated[str | None, Query(alias="from", max_length=16,
                                              description="First day, YYYY-MM-DD (with to)")
                            ] = None,
           to: Day = None,
           by: Literal["team", "site", "day"] = "team",
           format_: Annotated[Literal["json", "csv", "html"], Query(alias="format")] = "json",
           forecast: Literal["mean", "linear"] = "mean",
           team: Annotated[str | None, Query(pattern=TEAM_PATTERN)] = None) -> Response:
    """One of ``month``, ``week`` or ``from`` and ``to``; a finance token's report holds its
    teams only."""
    data = report_data(who, request, month, week, from_, to, by, forecast, team)
    if format_ == "csv":
        return Response(to_csv(data), media_type="text/csv; charset=utf-8")
    if format_ == "html":
        return Response(to_html(data), media_type="text/html; charset=utf-8")
    return JSONResponse(data)
