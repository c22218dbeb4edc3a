"""Budgets and the spend report through `spillway api` over TLS, on the server and fixtures of
test_api_server.py: finance sets its teams' caps and cannot see another team's (404, the same
words whether it has one or not), a user reads its team's budget but may not set it or read
reports, the report holds a finance token's teams only, the history names the token's holder,
and `spillway budget` / `spillway report` work over https with a token."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from broker.cli import app
from broker.client import Client
from broker.config.core import Config
from broker.errors import SpecError, SpillwayError
from broker.money.report import day_of
from broker.security.tokens import Refused, TokenStore
from broker.store.budgets import Part, budget_book
from tests.integration import test_api_server as api_tests
from tests.integration.api_harness import ApiServer
from tests.integration.test_api_server import token

pytestmark = pytest.mark.integration

# that module's fixtures (its database, its server over TLS, its tokens, a client per token)
url, server, tokens, as_user = (api_tests.url, api_tests.server, api_tests.tokens,
                                api_tests.as_user)


def http(server: ApiServer, tok: str, method: str, path: str,
         body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """(status, JSON body) of one raw call: the status the client's errors do not carry."""
    req = urllib.request.Request(server.url + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {tok}",
                                          "Content-Type": "application/json"})
    ctx = ssl.create_default_context(cafile=str(server.ca))
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def charge(url: str, parts: list[tuple[str, float]]) -> None:
    """Ledger charges today for (team, dollars), as the reconciler books them."""
    direct = Client(url, Config())
    now = time.time()
    book = budget_book(direct.store)
    for i, (team, usd) in enumerate(parts):
        assert book.charge(f"req-{team}-{now}", i, [Part(team, usd, 3600.0, 0.0,
                                                          "aws:us-east-1:spot", day_of(now))],
                           now)
    direct.close()


def test_finance_sets_its_teams_budget_and_cannot_see_another_teams(
        server: ApiServer, as_user: Callable[[str], Client], tokens: TokenStore) -> None:
    fay_tok, fred_tok = (token(tokens, "fay", role="finance", team="ta"),
                         token(tokens, "fred", role="finance", team="tb"))
    fay, fred = as_user(fay_tok)._remote, as_user(fred_tok)._remote
    got = fay.set_budget("ta", 100.0, "month", True, [50, 80])
    assert (got["team"], got["amount"], got["left"], got["alerts"]) == ("ta", 100.0, 100.0,
                                                                        [50.0, 80.0])
    fred.set_budget("tb", 40.0, "week", False, [100])
    assert [b["team"] for b in fay.budgets()] == ["ta"]  # tb is left out of the list
    for method, body in (("GET", None), ("PUT", {"amount": 1}), ("DELETE", None)):
        status, doc = http(server, fay_tok, method, "/v1/budgets/tb", body)
        assert status == 404, (method, doc)
        assert "no budget of team 'tb' that your token may see" in doc["error"]
        assert ("or role admin, would" if method != "GET" else "or role operator or admin,"
                ) in doc["error"]
        # the same words for a team with no budget at all: nothing tells them apart
        assert http(server, fay_tok, method, "/v1/budgets/tz", body)[1]["error"] == \
            doc["error"].replace("'tb'", "'tz'")
    assert http(server, fay_tok, "GET", "/v1/budgets/tb/history")[0] == 404
    assert http(server, fay_tok, "GET", "/v1/budgets?team=tb")[0] == 404
    assert fred.budgets("tb")[0]["amount"] == 40.0  # untouched
    fay.set_budget("ta", 150.0, "month", True, [50, 80, 100])
    hist = fay.budget_history("ta")
    assert [(h["action"], h["who"]) for h in hist] == [("set", "fay (finance, team ta)")] * 2
    assert (hist[1]["before"]["amount"], hist[1]["after"]["amount"]) == (100.0, 150.0)
    op = as_user(token(tokens, "omar", role="operator", team=""))._remote
    assert [b["team"] for b in op.budgets()] == ["ta", "tb"]  # every team's
    with pytest.raises(Refused, match="setting budgets needs a token with role finance or "
                                      "admin"):
        op.set_budget("ta", 1.0, "month", True, [])
    admin = as_user(token(tokens, "ada", role="admin", team=""))._remote
    assert admin.remove_budget("tb")["by"] == "ada (admin)"
    assert [h["who"] for h in admin.budget_history("tb")] == ["fred (finance, team tb)",
                                                              "ada (admin)"]
    status, doc = http(server, fred_tok, "DELETE", "/v1/budgets/tb")
    assert status == 404 and "team 'tb' has no budget" in doc["error"]


def test_a_user_reads_its_teams_budget_but_may_not_set_it_or_read_reports(
        url: str, server: ApiServer, as_user: Callable[[str], Client],
        tokens: TokenStore) -> None:
    as_user(token(tokens, "fin", role="finance", team="tu"))._remote.set_budget(
        "tu", 10.0, "month", True, [50])
    charge(url, [("tu", 2.5)])
    ursula = as_user(token(tokens, "ursula", team="tu"))._remote
    mine = ursula.budgets("tu")[0]
    assert (mine["spent"], mine["left"]) == (2.5, 7.5)
    assert [b["team"] for b in ursula.budgets()] == ["tu"]
    with pytest.raises(Refused, match="setting budgets needs a token with role finance"):
        ursula.set_budget("tu", 1e6, "month", False, [])
    with pytest.raises(Refused, match="reading reports needs a token with role finance"):
        ursula.report({})
    with pytest.raises(SpillwayError, match="no budget of team 'ta' that your token"):
        ursula.budgets("ta")


def test_bad_budgets_and_report_options_name_each_field(
        as_user: Callable[[str], Client], tokens: TokenStore) -> None:
    fin = as_user(token(tokens, "finn", role="finance", team="tf"))._remote
    with pytest.raises(SpecError) as e:
        fin.call("PUT", "/v1/budgets/tf", {"amount": -1, "window": "year", "bogus": 1})
    assert {f.field for f in e.value.errors} == {"amount", "window", "bogus"}
    with pytest.raises(SpecError) as e:
        fin.set_budget("tf", 5.0, "month", True, [0])
    assert [f.field for f in e.value.errors] == ["alerts"]
    with pytest.raises(SpecError) as e:
        fin.call("PUT", "/v1/budgets/tf", {"amount": True, "hard": "yes"})
    assert {f.field for f in e.value.errors} == {"amount", "hard"}
    for query, field in (("month=9999-12", "month"), ("week=2026-W60", "week"),
                         ("from=2026-11-09&to=2026-11-01", "to"), ("from=2026-11-01", "to")):
        with pytest.raises(SpecError) as e:
            fin.call("GET", f"/v1/reports?{query}")
        assert [f.field for f in e.value.errors] == [field], query
    with pytest.raises(SpecError) as e:
        fin.report({"month": "2026-13", "by": "team"})
    assert [f.field for f in e.value.errors] == ["month"]
    with pytest.raises(SpecError) as e:
        fin.call("GET", "/v1/reports?by=zone&format=pdf")
    assert {f.field for f in e.value.errors} == {"by", "format"}
    assert fin.budgets("tf") == [{"team": "tf", "window_id": fin.budgets("tf")[0]["window_id"],
                                  "spent": 0.0, "reserved": 0.0}]  # nothing was set


def test_the_report_holds_only_the_finance_tokens_teams(
        url: str, server: ApiServer, as_user: Callable[[str], Client],
        tokens: TokenStore) -> None:
    charge(url, [("rpt-x", 10.0), ("rpt-y", 20.0), ("rpt-z", 40.0)])
    fin_tok = tokens.create("rita", "finance", ["rpt-x", "rpt-z"], time.time(), by="test")[0]
    fin = as_user(fin_tok)._remote
    fin.set_budget("rpt-x", 100.0, "month", True, [50])
    data = fin.report({"by": "team"})
    assert [r["team"] for r in data["teams"]] == ["rpt-x", "rpt-z"]
    assert data["totals"]["cloud_usd"] == 50.0 and data["teams"][0]["cap_usd"] == 100.0
    assert {k for d in data["days"] for k in d["spend"]} == {"rpt-x", "rpt-z"}
    for fmt, by, seen in (("csv", "site", "aws:us-east-1:spot,50.0,"), ("html", "team", "rpt-z")):
        req = urllib.request.Request(f"{server.url}/v1/reports?format={fmt}&by={by}",
                                     headers={"Authorization": f"Bearer {fin_tok}"})
        with urllib.request.urlopen(req, context=ssl.create_default_context(
                cafile=str(server.ca)), timeout=60) as r:
            text = r.read().decode()
            assert r.headers["content-type"].startswith(f"text/{fmt}")
        assert seen in text and "rpt-y" not in text
    status, doc = http(server, fin_tok, "GET", "/v1/reports?team=rpt-y")
    assert status == 404 and "no report of team 'rpt-y'" in doc["error"]
    assert [r["team"] for r in fin.report({"team": "rpt-z"})["teams"]] == ["rpt-z"]
    op = as_user(token(tokens, "otis", role="operator", team=""))._remote
    every = {r["team"] for r in op.report({"by": "team"})["teams"]}
    assert {"rpt-x", "rpt-y", "rpt-z"} <= every


def test_budget_and_report_commands_speak_https_with_a_token(
        server: ApiServer, tokens: TokenStore, tmp_path: Path) -> None:
    env = {"SPILLWAY_URL": server.url,
           "SPILLWAY_TOKEN": token(tokens, "fiona", role="finance", team="tc"),
           "SPILLWAY_CA_FILE": str(server.ca), "SPILLWAY_REDIS_URL": None,
           "HOME": str(tmp_path), "COLUMNS": "200"}
    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(app, list(args), env=env)

    res = run("budget", "set", "tc", "--monthly", "500", "--soft")
    assert res.exit_code == 0 and "soft cap $500.00 per month" in res.stdout, res.output
    res = run("budget", "show", "--json")
    assert [(b["team"], b["amount"], b["hard"]) for b in json.loads(res.stdout)] == [
        ("tc", 500.0, False)]
    res = run("budget", "history")
    assert res.exit_code == 0 and "by fiona (finance, team tc)" in res.stdout, res.output
    res = run("budget", "set", "td", "--monthly", "1")
    assert res.exit_code == 1 and "no budget of team 'td' that your token" in res.stderr
    res = run("report", "--format", "json")
    assert res.exit_code == 0, res.output
    assert [t["team"] for t in json.loads(res.stdout)["teams"]] == ["tc"]
    res = run("report", "--format", "csv", "--out", str(tmp_path / "r.csv"))
    assert res.exit_code == 0 and "tc" in (tmp_path / "r.csv").read_text(), res.output
    res = run("report")
    assert res.exit_code == 0 and "tc" in res.stdout, res.output
    res = run("report", "--month", "nope")
    assert res.exit_code == 2 and "month" in res.stderr, res.output
    res = run("budget", "rm", "tc")
    assert res.exit_code == 0 and "budget removed" in res.stdout, res.output
