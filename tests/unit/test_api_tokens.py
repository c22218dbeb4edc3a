"""The API's pieces without a server: its OpenAPI schema, tokens (hashed, expiring, revocable),
the submit bucket, who may do what, the token file's mode, the server's options."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker.api import auth
from broker.api.remote import load_token
from broker.api.server import ServeOptions
from broker.client import Client
from broker.config.core import Config
from broker.errors import ConfigError, JobNotFound, SpecError
from broker.model import Job, JobSpec
from broker.model.state import JobState
from broker.security.tokens import RateLimited, Refused, TokenError, TokenStore
from tests.conftest import with_db

T0 = 1_800_000_000.0

ROUTES = {
    ("post", "/v1/jobs"), ("post", "/v1/jobs/batch"), ("get", "/v1/jobs"),
    ("get", "/v1/jobs/{job_id}"), ("post", "/v1/jobs/{job_id}/cancel"),
    ("get", "/v1/jobs/{job_id}/logs"), ("get", "/v1/jobs/{job_id}/wait"),
    ("get", "/v1/jobs/{job_id}/explain"), ("get", "/v1/nodes"),
    ("post", "/v1/nodes/{node_id}/drain"), ("post", "/v1/nodes/{node_id}/resume"),
    ("post", "/v1/tokens"), ("get", "/v1/tokens"), ("post", "/v1/tokens/{token_id}/revoke"),
    ("get", "/v1/whoami"), ("get", "/healthz"),
    ("get", "/v1/budgets"), ("get", "/v1/budgets/{team}"), ("put", "/v1/budgets/{team}"),
    ("delete", "/v1/budgets/{team}"), ("get", "/v1/budgets/{team}/history"),
    ("get", "/v1/reports"),
}


@pytest.fixture
def tokens(redis_client: redis.Redis, redis_prefix: str) -> TokenStore:
    return TokenStore(redis_client, prefix=redis_prefix)


def test_the_openapi_schema_has_every_route_each_behind_a_token(redis_url: str) -> None:
    from broker.api.app import create_app

    client = Client(with_db(redis_url, 2), Config())
    try:
        schema = create_app(client).openapi()
    finally:
        client.close()
    found = {(m, p) for p, ops in schema["paths"].items() for m in ops}
    assert found == ROUTES
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            secured = op.get("security") == [{"HTTPBearer": []}]
            assert secured == (path != "/healthz"), (method, path)


def test_tokens_are_stored_hashed_and_checked(tokens: TokenStore,
                                              redis_client: redis.Redis) -> None:
    tok, rec = tokens.create("alice", "user", ["vision"], T0, expires_s=3600, by="root")
    assert tok.startswith(f"swt_{rec.id}_") and rec.team == "vision"
    assert tok.encode() not in b"".join(redis_client.hgetall(tokens.key).values())
    assert tokens.verify(tok, T0 + 10) == rec
    with pytest.raises(TokenError, match="expired"):
        tokens.verify(tok, T0 + 3600)
    with pytest.raises(TokenError, match="not one this server issued"):
        tokens.verify(tok[:-1] + ("A" if tok[-1] != "A" else "B"), T0)
    with pytest.raises(TokenError, match="not one this server issued"):
        tokens.verify("swt_nonsense", T0)
    assert tokens.revoke(rec.id, T0 + 5, by="root").revoked_by == "root"
    with pytest.raises(TokenError, match="revoked"):
        tokens.verify(tok, T0 + 10)
    assert [(r.id, r.status(T0 + 10)) for r in tokens.list()] == [(rec.id, "revoked")]
    assert "digest" not in rec.to_dict()


def test_a_bad_grant_names_each_field(tokens: TokenStore) -> None:
    with pytest.raises(SpecError) as e:
        tokens.create("bad user!", "boss", ["ok"], T0)
    assert [f.field for f in e.value.errors] == ["user", "role"]
    with pytest.raises(SpecError, match="needs a team"):
        tokens.create("alice", "user", [], T0)
    with pytest.raises(SpecError, match="exactly one team"):
        tokens.create("alice", "user", ["a", "b"], T0)
    with pytest.raises(SpecError, match="no token with id"):
        tokens.revoke("0123456789ab", T0)
    _, fin = tokens.create("fred", "finance", ["a,b", "c"], T0)
    assert fin.teams == ("a", "b", "c")


def test_the_submit_bucket_refills_at_its_rate(tokens: TokenStore) -> None:
    _, rec = tokens.create("alice", "user", ["a"], T0)
    for _ in range(3):
        tokens.take(rec, 1, T0, rate=1.0, burst=3)
    with pytest.raises(RateLimited, match=r"retry in 1\.0s") as e:
        tokens.take(rec, 1, T0, rate=1.0, burst=3)
    assert e.value.retry_after == pytest.approx(1.0)
    tokens.take(rec, 2, T0 + 2.0, rate=1.0, burst=3)  # two seconds: two more
    with pytest.raises(RateLimited, match="more than the 3"):
        tokens.take(rec, 4, T0 + 100, rate=1.0, burst=3)


def _job(team: str) -> Job:
    spec = JobSpec(command="true", team=team)
    return Job(id="j-1", spec=spec, state=JobState.PENDING, submitted_at=T0)


def test_who_may_do_what(tokens: TokenStore) -> None:
    _, user = tokens.create("alice", "user", ["a"], T0)
    _, fin = tokens.create("fred", "finance", ["a"], T0)
    _, op = tokens.create("olga", "operator", [], T0)
    assert auth.visible(user, _job("a")).team == "a"
    with pytest.raises(JobNotFound):
        auth.visible(user, _job("b"))
    assert auth.visible(op, _job("b")).team == "b"
    assert auth.list_team(user, None) == "a" and auth.list_team(op, None) is None
    assert auth.submit_team(user, None) == "a"
    with pytest.raises(Refused, match="needs a token of team 'b'"):
        auth.submit_team(user, "b")
    with pytest.raises(Refused, match="role operator or admin; yours"):
        auth.require(user, "nodes.drain")
    with pytest.raises(Refused, match="role admin"):
        auth.require(op, "tokens")
    auth.require(fin, "budgets.read", "a")
    with pytest.raises(Refused, match="team 'z'"):
        auth.require(fin, "budgets.read", "z")


@pytest.fixture
def no_token_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    monkeypatch.delenv("SPILLWAY_TOKEN", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    yield tmp_path


def test_the_token_file_must_be_private(no_token_env: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="no API token"):
        load_token()
    path = no_token_env / "tok"
    path.write_text("swt_x\n")
    path.chmod(0o640)
    monkeypatch.setenv("SPILLWAY_TOKEN_FILE", str(path))
    with pytest.raises(ConfigError, match="mode 0640"):
        load_token()
    path.chmod(0o600)
    assert load_token() == "swt_x"
    monkeypatch.setenv("SPILLWAY_TOKEN", "swt_env")
    assert load_token() == "swt_env"


def test_the_server_refuses_clear_text_tokens_on_the_network(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="clear text"):
        ServeOptions("redis://h/0", host="0.0.0.0").check()
    ServeOptions("redis://h/0", host="0.0.0.0", insecure_http=True).check()
    with pytest.raises(ConfigError, match="go together"):
        ServeOptions("redis://h/0", certfile=tmp_path / "c.pem").check()
    with pytest.raises(ConfigError, match="needs the cluster's Redis"):
        ServeOptions("https://h").check()


def test_token_commands_on_redis(redis_url: str, no_token_env: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    from broker.cli import app

    url = with_db(redis_url, 2)
    monkeypatch.delenv("SPILLWAY_URL", raising=False)
    run = CliRunner().invoke
    res = run(app, ["--redis-url", url, "token", "create", "-u", "ann", "-t", "a",
                    "--expires", "30d", "--json"])
    assert res.exit_code == 0, res.output
    made = json.loads(res.stdout)
    assert made["token"].startswith("swt_") and made["record"]["teams"] == ["a"]
    res = run(app, ["--redis-url", url, "token", "create", "-u", "ann", "-r", "boss"])
    assert res.exit_code == 2 and "role" in res.stderr and "admin" in res.stderr
    res = run(app, ["--redis-url", url, "token", "create", "-u", "ann", "--expires", "soon"])
    assert res.exit_code == 2 and "expires" in res.stderr
    res = run(app, ["--redis-url", url, "token", "revoke", made["record"]["id"]])
    assert res.exit_code == 0 and "revoked" in res.stdout
    res = run(app, ["--redis-url", url, "token", "list", "--json"])
    listed = {r["id"]: r for r in json.loads(res.stdout)}
    assert listed[made["record"]["id"]]["status"] == "revoked"
    assert made["token"] not in res.stdout
    redis.Redis.from_url(url).delete("sw:tokens")


def test_the_client_waits_out_a_short_retry_after_and_gives_up_on_a_long_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.api import remote

    r = remote.Remote("http://127.0.0.1:1", Config(), token="swt_x_y")
    answers: list[object] = [RateLimited("retry in 0.01s", 0.01),
                             RateLimited("retry in 0.02s", 0.02), {"ok": 1}]
    sent: list[str] = []

    def once(method: str, path: str, body: object, timeout: float) -> object:
        sent.append(path)
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    monkeypatch.setattr(r, "_call_once", once)
    assert r.call("POST", "/v1/jobs", {}) == {"ok": 1} and len(sent) == 3  # paced, then in
    answers[:] = [RateLimited("retry in 1000s", remote.PACE_S + 1)]
    with pytest.raises(RateLimited, match="1000s"):  # too long to wait: the caller decides
        r.call("POST", "/v1/jobs", {})
    answers[:] = [RateLimited("a batch of 9 is more than the 3", 0.0)]
    with pytest.raises(RateLimited, match="more than"):  # waiting would not help
        r.call("POST", "/v1/jobs/batch", {})
    monkeypatch.setattr(remote, "PACE_TOTAL_S", 0.015)
    answers[:] = [RateLimited("retry in 0.01s", 0.01), RateLimited("retry in 0.01s", 0.01)]
    with pytest.raises(RateLimited):  # the waits would add up past the total
        r.call("POST", "/v1/jobs", {})
