"""`spillway api` as a real process over TLS, against a real Redis: teams cannot see each
other's jobs (404), bad tokens are refused, a restart loses nothing, the CLI works through it."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.api.remote import Remote
from broker.cli import app
from broker.client import Client
from broker.config.core import Config
from broker.control.loop import one_cycle
from broker.errors import ConfigError, JobNotFound, NodeNotFound, SpecError
from broker.model import Gpu, Node
from broker.model.state import JobState
from broker.security.tokens import RateLimited, Refused, TokenError, TokenStore
from broker.store.events import Exited, Started
from tests.conftest import flushed_db
from tests.integration.api_harness import ApiServer, api_server

pytestmark = pytest.mark.integration

DB = 9  # this module's own database on the session's Redis
BURST = 20


@pytest.fixture(scope="module")
def url(redis_url: str) -> Iterator[str]:
    yield from flushed_db(redis_url, DB)


@pytest.fixture(scope="module")
def server(url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    # a slow refill: a token's burst is all it gets in this module (the rate-limit test)
    with api_server(url, tmp_path_factory.mktemp("api"), "--submit-rate", "0.001",
                    "--submit-burst", str(BURST)) as srv:
        yield srv


@pytest.fixture(scope="module")
def tokens(url: str) -> TokenStore:
    return TokenStore(Client(url, Config()).store_redis)


def token(tokens: TokenStore, user: str, role: str = "user", team: str = "a",
          expires_s: float | None = None) -> str:
    return tokens.create(user, role, [team] if team else [], time.time(), expires_s,
                         by="test")[0]


@pytest.fixture
def as_user(server: ApiServer, monkeypatch: pytest.MonkeyPatch
            ) -> Iterator[Callable[[str], Client]]:
    """``as_user(token)``: a Client on the API server with that token."""
    monkeypatch.setenv("SPILLWAY_CA_FILE", str(server.ca))
    made: list[Client] = []

    def make(tok: str) -> Client:
        monkeypatch.setenv("SPILLWAY_TOKEN", tok)
        client = Client(server.url, Config(hold_if_infeasible=True))
        made.append(client)
        return client

    yield make
    for c in made:
        c.close()


def test_a_team_cannot_see_cancel_log_or_explain_another_teams_jobs(
        as_user: Callable[[str], Client], tokens: TokenStore) -> None:
    alice, bob = as_user(token(tokens, "alice", team="a")), as_user(token(tokens, "bob",
                                                                             team="b"))
    job = bob.submit(command="sleep 1", name="b-secret")
    assert job.team == "b" and job.history[0].reason == "Submitted by bob (user, team b)"
    for call in (alice.get, alice.cancel, alice.explain, lambda i: list(alice.logs(i)),
                 lambda i: alice.wait(i, timeout=0.1), alice.get):
        with pytest.raises(JobNotFound) as e:
            call(job.id)
        assert str(e.value) == str(JobNotFound(job.id))  # the words of a missing job
    assert job.id not in [j.id for j in alice.list()]
    with pytest.raises(Refused, match="team 'b'"):
        alice.list(team="b")
    with pytest.raises(Refused, match="team 'b'"):
        alice.submit(command="true", team="b")
    assert bob.get(job.id).state is JobState.PENDING  # still there, untouched
    assert bob.explain(job.id).job_id == job.id
    assert list(bob.logs(job.id)) == []
    done = bob.cancel(job.id)
    assert done.history[-1].reason == "Cancelled by bob (user, team b)"
    assert bob.wait(job.id, timeout=5).state is JobState.CANCELLED


def test_another_teams_job_ids_never_appear_in_a_users_replies(
        url: str, as_user: Callable[[str], Client], tokens: TokenStore) -> None:
    hana, ivan = as_user(token(tokens, "hana", team="h")), as_user(token(tokens, "ivan",
                                                                            team="i"))
    theirs, mine = ivan.submit(command="true"), hana.submit(command="true")
    direct = Client(url, Config())
    direct.store.cancel(mine.id, time.time(), reason=f"preempted by {theirs.id} (team i)")
    direct.close()
    # neither its id nor its team: the preempted team reads no more than that
    assert hana.get(mine.id).history[-1].reason == "preempted by a job of another team"
    assert theirs.id not in str(hana.explain(mine.id).to_dict())
    op = as_user(token(tokens, "oscar", role="operator", team=""))
    assert op.get(mine.id).history[-1].reason == f"preempted by {theirs.id} (team i)"


def test_roles_each_refusal_names_the_role_needed(as_user: Callable[[str], Client],
                                                 tokens: TokenStore) -> None:
    user = as_user(token(tokens, "carol", team="a"))
    with pytest.raises(Refused, match="role operator or admin"):
        user.nodes()
    with pytest.raises(Refused, match="role operator or admin"):
        user.drain("n1")
    finance = as_user(token(tokens, "fin", role="finance", team="a"))
    with pytest.raises(Refused, match="role user or operator or admin"):
        finance.list()
    op = as_user(token(tokens, "olga", role="operator", team=""))
    assert op.nodes() == []
    with pytest.raises(NodeNotFound):
        op.drain("no-such-node")
    theirs = user.submit(command="true")
    assert op.get(theirs.id).team == "a"  # an operator sees every team's jobs
    with pytest.raises(Refused, match="role admin"):
        op._remote.call("GET", "/v1/tokens")


def test_expired_and_revoked_tokens_are_refused(as_user: Callable[[str], Client],
                                                tokens: TokenStore) -> None:
    expired = as_user(token(tokens, "old", expires_s=0.001))
    with pytest.raises(TokenError, match="expired"):
        expired.list()
    tok = token(tokens, "leaver")
    client = as_user(tok)
    assert client.list() is not None
    tokens.revoke(tok.split("_")[1], time.time(), by="test")
    with pytest.raises(TokenError, match="revoked"):
        client.list()
    with pytest.raises(TokenError, match="not one this server issued"):
        as_user(tok[:-4] + "AAAA").list()


def test_bad_input_names_the_field_and_submits_are_rate_limited(
        as_user: Callable[[str], Client], tokens: TokenStore) -> None:
    client = as_user(token(tokens, "dave"))
    with pytest.raises(SpecError) as e:
        client.submit(command="true", gpus=99, priority="urgent")
    assert {f.field for f in e.value.errors} >= {"gpus", "priority"}
    with pytest.raises(SpecError) as e:
        client._remote.call("POST", "/v1/jobs", {"spec": {"command": "x"}, "bogus": 1})
    assert [f.field for f in e.value.errors] == ["bogus"]
    with pytest.raises(RateLimited, match="more than the 20") as limited:
        client.submit_many([{"command": "true"}] * (BURST + 1))
    assert limited.value.retry_after == 0  # no Retry-After: waiting would not help
    assert len(client.submit_many([{"command": "true"}] * BURST)) == BURST
    with pytest.raises(RateLimited, match="retry in"):
        client.submit(command="true")


def test_a_restart_with_jobs_in_flight_loses_nothing(
        server: ApiServer, as_user: Callable[[str], Client], tokens: TokenStore) -> None:
    client = as_user(token(tokens, "erin"))
    jobs = client.submit_many([{"command": f"echo {i}"} for i in range(5)])
    client.cancel(jobs[0].id)
    before = {j.id: (j.state, j.version) for j in client.list(state=None)}
    server.restart()
    after = {j.id: (j.state, j.version) for j in client.list(state=None)}  # same token
    assert after == before and {j.id for j in jobs} <= set(after)
    assert client.submit(command="true").state is JobState.PENDING


def test_the_cli_speaks_https_with_spillway_token(server: ApiServer, tokens: TokenStore,
                                                  tmp_path: Path) -> None:
    env = {"SPILLWAY_URL": server.url, "SPILLWAY_TOKEN": token(tokens, "frank", team="c"),
           "SPILLWAY_CA_FILE": str(server.ca), "SPILLWAY_REDIS_URL": None, "HOME": str(tmp_path),
           "SPILLWAY_HOLD_IF_INFEASIBLE": "true", "COLUMNS": "200"}
    runner = CliRunner()
    res = runner.invoke(app, ["submit", "--", "echo", "hi"], env=env)
    assert res.exit_code == 0, res.output
    job_id = res.stdout.strip()
    res = runner.invoke(app, ["queue", "--json"], env=env)
    assert [j["id"] for j in json.loads(res.stdout)] == [job_id]
    res = runner.invoke(app, ["cancel", job_id], env=env)
    assert res.exit_code == 0 and "CANCELLED" in res.stdout
    res = runner.invoke(app, ["nodes"], env=env)
    assert res.exit_code == 1 and "needs a token with role operator" in res.stderr
    tok_file = tmp_path / "token"
    tok_file.write_text(env.pop("SPILLWAY_TOKEN") or "")
    tok_file.chmod(0o644)
    res = runner.invoke(app, ["show", job_id], env={**env, "SPILLWAY_TOKEN": None,
                                                    "SPILLWAY_TOKEN_FILE": str(tok_file)})
    assert res.exit_code == 1 and "chmod 600" in res.stderr
    tok_file.chmod(0o600)
    res = runner.invoke(app, ["show", job_id], env={**env, "SPILLWAY_TOKEN": None,
                                                    "SPILLWAY_TOKEN_FILE": str(tok_file)})
    assert res.exit_code == 0 and "Cancelled by frank" in res.stdout


def test_logs_stream_while_the_job_runs_and_operators_see_nodes(
        url: str, as_user: Callable[[str], Client], tokens: TokenStore) -> None:
    direct = Client(url, Config(hold_if_infeasible=True))  # the agent's and scheduler's side
    gpus = tuple(Gpu(f"GPU-n1-{i}", i, "A100-80GB", 80.0) for i in range(2))
    direct.store.heartbeat(Node("n1", gpus, hostname="n1", incarnation="i1"), ttl=60,
                           now=time.time())
    op = as_user(token(tokens, "otto", role="operator", team=""))
    assert [(n.id, n.total) for n in op.nodes()] == [("n1", 2)]
    user = as_user(token(tokens, "gina", team="g"))
    for queued in direct.list("PENDING"):  # (the other tests' jobs: only this one may start)
        direct.cancel(queued.id)
    job = user.submit(command="echo hi")
    one_cycle(direct._rt)
    direct.store.report(job.id, 1, Started(0, pid=123), time.time())
    direct.store.append_logs(job.id, 1, [("out", "line 1"), ("err", "oops")], time.time())
    assert [(x.stream, x.text) for x in user.logs(job.id)] == [("out", "line 1"),
                                                                 ("err", "oops")]
    got: queue.Queue[str | None] = queue.Queue()

    def follow() -> None:
        for line in user.logs(job.id, follow=True):
            got.put(line.text)
        got.put(None)

    threading.Thread(target=follow, daemon=True).start()
    assert [got.get(timeout=10), got.get(timeout=10)] == ["line 1", "oops"]
    direct.store.append_logs(job.id, 1, [("out", "line 2")], time.time())
    assert got.get(timeout=10) == "line 2"  # streamed while the job runs
    direct.store.report(job.id, 1, Exited(0, 0), time.time())
    assert got.get(timeout=10) is None  # the job ended: so did the stream
    assert user.wait(job.id, timeout=10).state is JobState.SUCCEEDED
    assert op.drain("n1").state.value == "DRAINING"
    assert [n.state for n in op.nodes()] == ["DRAINING"]
    direct.close()


def test_an_admin_manages_tokens_over_https(server: ApiServer, tokens: TokenStore,
                                           tmp_path: Path) -> None:
    env = {"SPILLWAY_URL": server.url, "SPILLWAY_TOKEN": token(tokens, "root", role="admin",
                                                                team=""),
           "SPILLWAY_CA_FILE": str(server.ca), "SPILLWAY_REDIS_URL": None,
           "HOME": str(tmp_path)}
    runner = CliRunner()
    res = runner.invoke(app, ["token", "create", "-u", "kim", "-t", "k", "--json"], env=env)
    assert res.exit_code == 0, res.output
    made = json.loads(res.stdout)
    assert made["record"]["created_by"] == "root (admin)"
    assert tokens.verify(made["token"], time.time()).user == "kim"
    res = runner.invoke(app, ["token", "revoke", made["record"]["id"]], env=env)
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["token", "list", "--json"], env=env)
    kim = next(r for r in json.loads(res.stdout) if r["id"] == made["record"]["id"])
    assert (kim["status"], kim["revoked_by"]) == ("revoked", "root (admin)")
    res = runner.invoke(app, ["token", "list"], env={**env, "SPILLWAY_TOKEN": made["token"]})
    assert res.exit_code == 1 and "revoked" in res.stderr


def test_plain_http_to_another_host_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"refusing plain http:// to example\.com"):
        Remote("http://example.com:8080", Config(), token="x")
