"""Hypothesis-made requests at the budget and report routes (broker/api/budgets.py,
reports.py), through the app of test_api_fuzz.py on a real Redis: bad bodies, wrong types,
unknown fields, odd team names and path tricks, report options out of range, every role and
bad tokens: never a 500, never a traceback in a reply, every error one JSON shape, every 422
naming its fields."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability import test_api_fuzz as fuzz

pytestmark = pytest.mark.slow

app_and_tokens = fuzz.app_and_tokens  # (that module's app on its database, a token per role)

ROUTES = [("GET", "/v1/budgets"), ("GET", "/v1/budgets/{team}"), ("PUT", "/v1/budgets/{team}"),
          ("DELETE", "/v1/budgets/{team}"), ("GET", "/v1/budgets/{team}/history"),
          ("PATCH", "/v1/budgets/{team}"), ("POST", "/v1/reports"), ("GET", "/v1/reports")]
teams = st.one_of(fuzz.path_ids, st.sampled_from(["a", "b", "a.b", "A_1", "history", "x" * 65]))
DATES = ["2026-11", "2026-W47", "2026-W60", "2026-11-03", "2026-02-30", "9999-12", "9999-W52",
         "9999-12-31", "0001-01-01", "1969-12", "2026-11-09", "99999-01"]
values = st.one_of(st.text(max_size=12), st.sampled_from(
    [*DATES, "team", "site", "day", "json", "csv", "html", "table", "mean", "linear", "a", "b"]))
dates = st.one_of(st.sampled_from(DATES), st.sampled_from(DATES), st.sampled_from(DATES),
                  st.text(max_size=12))
windows: st.SearchStrategy[dict[str, str]] = st.one_of(
    st.just({}), st.fixed_dictionaries({"month": dates}), st.fixed_dictionaries({"week": dates}),
    st.fixed_dictionaries({"from": dates, "to": dates}))
queries = st.one_of(
    st.builds(lambda w, more: {**w, **more}, windows, st.dictionaries(
        st.sampled_from(["team", "by", "format", "forecast", "x"]), values, max_size=2)),
    st.dictionaries(st.sampled_from(["team", "month", "week", "from", "to", "by", "format",
                                     "forecast", "x"]), values, max_size=4))
fields = st.sampled_from(["amount", "window", "hard", "alerts", "team", "bogus"])
amounts = st.one_of(fuzz.json_values, st.floats(), st.sampled_from([0, 5, 20000, -1, 1e308]))
bodies = st.one_of(
    st.builds(lambda d: json.dumps(d).encode(), st.dictionaries(fields, amounts, max_size=5)),
    st.builds(lambda a, w, h, al: json.dumps({"amount": a, "window": w, "hard": h,
                                              "alerts": al}).encode(),
              amounts, st.sampled_from(["month", "week", "total", "year", None]),
              st.sampled_from([True, False, "yes", 1]),
              st.lists(st.one_of(st.floats(allow_nan=False), st.integers(-5, 2000)),
                       max_size=25)),
    st.binary(max_size=64), st.just(b""), st.just(fuzz.HUGE.replace(b"spec", b"amount")),
)


FUZZ = settings(max_examples=400, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
WHO = ["user", "finance", "operator", "admin", "bad", "none"]


# the answers each fuzz test must reach, and those it reached in this process
KINDS = {"budgets": {200, 401, 403, 404, 405, 413, 422}, "reports": {200, 401, 403, 404, 422}}
SEEN_BY: dict[str, set[int]] = {}


@pytest.fixture(scope="module", autouse=True)
def reached_every_kind_of_answer() -> Iterator[None]:
    """At the module's end: each fuzz test that ran here reached every kind of answer it
    should. (A fixture's end, not a test of its own: under pytest-xdist a module's tests may
    run on different workers, in any order.)"""
    yield
    for name, seen in SEEN_BY.items():
        assert KINDS[name] <= seen, (name, sorted(seen))


def check(app: Any, toks: dict[str, str], method: str, path: str, query: dict[str, str],
          body: bytes, who: str, test: str) -> None:
    qs = "&".join(f"{quote(k)}={quote(v)}" for k, v in query.items())
    status, raw = asyncio.run(fuzz._call(app, method, path, qs,
                                         body if method in ("PUT", "POST") else b"",
                                         toks[who]))
    fuzz.check_answer(status, raw)
    SEEN_BY.setdefault(test, set()).add(status)


@FUZZ
@given(route=st.sampled_from(ROUTES), team=teams, query=queries, body=bodies,
       who=st.sampled_from(WHO))
def test_no_budget_request_gets_a_500(app_and_tokens: tuple[Any, dict[str, str]],
                                      route: tuple[str, str], team: str,
                                      query: dict[str, str], body: bytes, who: str) -> None:
    app, toks = app_and_tokens
    check(app, toks, route[0], route[1].replace("{team}", team), query, body, who, "budgets")


@FUZZ
@given(query=queries, who=st.sampled_from(["finance", "operator", "admin", *WHO]))
def test_no_report_request_gets_a_500(app_and_tokens: tuple[Any, dict[str, str]],
                                      query: dict[str, str], who: str) -> None:
    app, toks = app_and_tokens
    check(app, toks, "GET", "/v1/reports", query, b"", who, "reports")
