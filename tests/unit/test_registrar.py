"""No Redis user but an administrator's can grant rights (issue 35, item 8): the scheduler's
rules hold no ACL command, and the registrar (broker/security/registrar.py) makes exactly the
users it is asked for, after checking each request against its instance record. On a fake
Redis client here; on a real redis-server in tests/integration/test_registrar.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from broker.bus.runtime import Runtime
from broker.cli import app
from broker.config.core import Config
from broker.model import Instance, InstanceState
from broker.security import acl, cloud_agent, registrar
from broker.security.registrar import Registrar, RegistrarError, Request

S = InstanceState
SHA = acl.password_sha256("pw")


class FakeRedis:
    """What the registrar and the provisioner call, in memory. ``on_push``: called with the
    payload when a request is pushed (a registrar answering at once)."""

    def __init__(self, on_push: Callable[[bytes], None] | None = None) -> None:
        self.hashes: dict[str, dict[str, bytes]] = {}
        self.lists: dict[str, list[bytes]] = {}
        self.users: dict[str, tuple[str, ...]] = {"default": ()}
        self.ttl: dict[str, int] = {}
        self.on_push = on_push

    def hget(self, key: str, field: str) -> bytes | None:
        return self.hashes.get(key, {}).get(field)

    def rpush(self, key: str, value: str | bytes) -> int:
        raw = value.encode() if isinstance(value, str) else value
        self.lists.setdefault(key, []).append(raw)
        if self.on_push is not None and key.endswith(registrar.REQUESTS):
            self.on_push(self.lists[key].pop(0))
        return len(self.lists.get(key, ()))

    def blpop(self, keys: list[str], timeout: float = 0) -> tuple[bytes, bytes] | None:
        for key in keys:
            if self.lists.get(key):
                return key.encode(), self.lists[key].pop(0)
        return None

    def lrem(self, key: str, count: int, value: str) -> int:
        items = self.lists.get(key, [])
        if value.encode() in items:
            items.remove(value.encode())
            return 1
        return 0

    def expire(self, key: str, seconds: int) -> bool:
        self.ttl[key] = seconds
        return True

    def pipeline(self, transaction: bool = True) -> Any:
        fake = self

        class Pipe:
            def __getattr__(self, name: str) -> Any:
                return getattr(fake, name)

            def execute(self) -> list[Any]:
                return []

        return Pipe()

    def execute_command(self, *args: str) -> Any:
        if args[:2] == ("ACL", "SETUSER"):
            self.users[args[2]] = tuple(args[3:])
            return b"OK"
        if args[:2] == ("ACL", "DELUSER"):
            return int(self.users.pop(args[2], None) is not None)
        if args[:2] == ("ACL", "USERS"):
            return [u.encode() for u in self.users]
        raise AssertionError(f"unexpected command {args}")

    def record(self, rid: str, state: InstanceState = S.REQUESTED, provider_id: str = "",
               key: str = "") -> None:
        inst = Instance(rid, "aws:us-east-1:us-east-1a:spot/g5.xlarge", state,
                        provider_id=provider_id)
        self.hashes[key or f"sw:inst:{rid}"] = {"doc": json.dumps(inst.to_dict()).encode()}


def replies(fake: FakeRedis) -> list[dict[str, Any]]:
    return [json.loads(v) for k, items in fake.lists.items() if ":reply:" in k for v in items]


# -- the rules --------------------------------------------------------------------------------


def test_the_schedulers_user_holds_no_acl_admin_or_dangerous_command() -> None:
    rules = acl.user_for("scheduler").rules
    assert not any(r.lower().startswith(("+acl", "+@admin", "+@dangerous", "+config"))
                   for r in rules)
    assert {"-@admin", "-@dangerous", "-acl"} <= set(rules)
    after = rules[rules.index("-@dangerous") + 1:]  # what is given back after the denials
    assert [r for r in after if r.startswith("+")] == ["+info"]  # (the server's uptime)
    assert rules.index("-acl") > rules.index("+@all")


def test_the_api_user_is_as_before_with_no_acl_command() -> None:
    rules = acl.user_for("api").rules
    assert rules[-8:] == ("-@admin", "-@dangerous", "-function", "-script|flush",
                          "-script|kill", "-swapdb", "-move", "-migrate")
    assert not any(r.startswith("+acl") for r in rules)


def test_the_registrars_user_touches_only_its_keys_and_grants_by_acl_setuser() -> None:
    user = acl.user_for("registrar", prefix="p:")
    assert user.name == "spillway-registrar"
    assert user.rules == ("reset", "on", "resetchannels", "~p:registrar:requests",
                          "%W~p:registrar:reply:*", "%R~p:inst:*", "-@all", "+@connection",
                          "-@admin", "-@dangerous", "+blpop", "+rpush", "+expire", "+hget",
                          "+acl|setuser", "+acl|deluser", "+acl|users")
    with pytest.raises(acl.AclError, match="only for the agent role"):
        acl.user_for("registrar", "n1")


def test_redis_acl_prints_the_registrars_user() -> None:
    got = CliRunner().invoke(app, ["redis", "acl", "--role", "registrar"])
    assert got.exit_code == 0, got.output
    line = " ".join(got.output.split())
    assert line.startswith("ACL SETUSER spillway-registrar reset on resetchannels "
                           "~sw:registrar:requests %W~sw:registrar:reply:* %R~sw:inst:* -@all")
    assert "+acl|setuser +acl|deluser +acl|users" in line


def test_a_password_goes_in_only_as_its_sha256() -> None:
    user = acl.waiting_user("spillway-cloud-r1")
    assert user.with_password("pw") == user.with_hash(SHA) == (*user.rules, f"#{SHA}")
    with pytest.raises(acl.AclError, match="SHA-256"):
        user.with_hash("pw")


# -- the registrar ------------------------------------------------------------------------------


def req(op: str = "wait", rid: str = "r1", user: str = "", node: str = "",
        sha: str = SHA) -> Request:
    return Request(op, rid, user or registrar.user_name(rid), sha, node)


@pytest.mark.parametrize(("request_", "state", "provider_id", "why"), [
    (req(user="spillway-cloud-r2"), S.REQUESTED, "", "a cloud machine's user is"),
    (req(user="spillway-scheduler"), S.REQUESTED, "", "a cloud machine's user is"),
    (req(rid="r9"), S.REQUESTED, "", "no instance record r9"),
    (req(rid="r*"), S.REQUESTED, "", "not one the provisioner makes"),
    (req(op="admin"), S.REQUESTED, "", "not one of wait, agent"),
    (req(sha="pw"), S.REQUESTED, "", "64 lower-case hex"),
    (req(), S.BOOTING, "i-1", "not REQUESTED"),
    (req(node="i-1"), S.REQUESTED, "", "names no node"),
    (req("agent", node="n*"), S.REQUESTED, "", "node id 'n*'"),
    (req("agent", node="n?"), S.REQUESTED, "", "node id 'n?'"),
    (req("agent", node="[n]"), S.REQUESTED, "", "node id '[n]'"),
    (req("agent", node=""), S.REQUESTED, "", "node id ''"),
    (req("agent", node="i-1"), S.TERMINATED, "i-1", "has ended"),
    (req("agent", node="i-2"), S.BOOTING, "i-1", "is machine i-1, not i-2"),
])
def test_a_bad_request_is_refused_logged_and_answered(
        request_: Request, state: InstanceState, provider_id: str, why: str,
        caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeRedis()
    fake.record("r1", state, provider_id)
    fake.record("r*", key="sw:inst:r*")
    Registrar(fake).handle(Request(**{**request_.__dict__, "reply": "ab" * 16}).to_json())
    assert set(fake.users) == {"default"}  # nothing made
    [answer] = replies(fake)
    assert answer["ok"] is False and why in answer["error"], answer
    assert any(why in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)


def test_a_request_that_is_no_request_is_dropped_unanswered() -> None:
    fake = FakeRedis()
    fake.record("r1")
    reg = Registrar(fake)
    for raw in ("nonsense", json.dumps({**req().__dict__, "reply": "../x"}),
                json.dumps({**req().__dict__, "reply": "ab" * 16, "rules": "+@all"}),
                "x" * 5000):
        reg.handle(raw)
    assert set(fake.users) == {"default"} and replies(fake) == []


def test_the_waiting_user_then_the_agent_rules_of_its_node_and_nothing_else() -> None:
    fake = FakeRedis()
    fake.record("r1")
    reg = Registrar(fake)
    reg.handle(Request(**{**req().__dict__, "reply": "0" * 32}).to_json())
    assert fake.users["spillway-cloud-r1"] == (*acl.waiting_user("spillway-cloud-r1").rules,
                                               f"#{SHA}")
    fake.record("r1", S.BOOTING, "i-1")
    reg.handle(Request(**{**req("agent", node="i-1").__dict__, "reply": "1" * 32}).to_json())
    agent = acl.user_for("agent", "i-1", "spillway-cloud-r1")
    assert fake.users["spillway-cloud-r1"] == (*agent.rules, f"#{SHA}")
    assert [r["ok"] for r in replies(fake)] == [True, True]
    assert fake.ttl == {f"sw:registrar:reply:{'0' * 32}": registrar.REPLY_TTL_S,
                        f"sw:registrar:reply:{'1' * 32}": registrar.REPLY_TTL_S}


def test_the_sweep_deletes_the_users_of_ended_machines_only() -> None:
    fake = FakeRedis()
    for rid, state in (("r1", S.TERMINATED), ("r2", S.FAILED), ("r3", S.BOOTING)):
        fake.record(rid, state)
        fake.users[registrar.user_name(rid)] = ()
    fake.users["spillway-cloud-elsewhere"] = ()  # no record here: another store's
    fake.users["spillway-api"] = ()
    assert Registrar(fake).sweep() == 2
    assert set(fake.users) == {"default", "spillway-cloud-r3", "spillway-cloud-elsewhere",
                               "spillway-api"}


# -- the provisioner's side -------------------------------------------------------------------


def test_with_no_registrar_the_request_is_taken_back_and_the_error_says_what_to_do() -> None:
    fake = FakeRedis()
    with pytest.raises(RegistrarError) as e:
        registrar.ask(fake, req(), 0.25)
    assert str(e.value) == ("no registrar answered in 0.25 s: start `spillway registrar` with "
                            "the administrator's URL, or set the provider's broker_url "
                            "(docs/security.md, \"Cloud workers\")")
    assert fake.lists["sw:registrar:requests"] == []


def test_prepare_and_finish_through_a_registrar() -> None:
    fake = FakeRedis()
    fake.on_push = Registrar(fake).handle
    fake.record("r1")
    rt = type("Rt", (), {"redis_url": "redis://sched:pw@10.0.0.1:6379/0", "redis": fake})()
    join = cloud_agent.prepare(rt, "aws", "", "r1")
    assert join.user == "spillway-cloud-r1" and "sched" not in join.url
    password = join.url.split(":")[2].split("@")[0]
    assert fake.users[join.user][-1] == f"#{acl.password_sha256(password)}"
    assert join.finish(rt, "i-7") == ""
    assert fake.users[join.user][:-1] == acl.user_for("agent", "i-7", join.user).rules
    assert "refused agent" in join.finish(rt, "i-*")
    # no credentials, a broker_url, or the local provider: no user, no registrar
    for url, kind, broker in (("redis://10.0.0.1:6379/0", "aws", ""),
                              (rt.redis_url, "aws", "redis://a:b@broker:6379/0"),
                              (rt.redis_url, "local", "")):
        rt.redis_url = url
        other = cloud_agent.prepare(rt, kind, broker, "r2")
        assert other.user == "" and other.finish(rt, "i-8") == ""
    assert set(fake.users) == {"default", "spillway-cloud-r1"}


class OneMachine:
    """A provider that launches one machine per call and records terminations."""

    name = "cloudy"

    def __init__(self) -> None:
        self.terminated: list[str] = []

    def offers(self, request: Any) -> list[Any]:
        from broker.model import Market, Offer

        return [Offer("cloudy", "r1", "z1", "g4", "A100-40GB", 1, 40.0, Market.SPOT, 1.0)]

    def launch(self, offer: Any, count: int, request_id: str, user_data: str) -> list[Any]:
        from providers.base import CloudMachine

        return [CloudMachine(f"i-{request_id}", request_id, S.BOOTING)]

    def terminate(self, ids: Any) -> None:
        self.terminated += list(ids)

    def instances(self) -> dict[str, Any]:
        return {}


@pytest.mark.parametrize("answers", ["none", "wait only"])
def test_the_provisioner_fails_the_launch_with_the_registrars_error(
        answers: str, tmp_path: Path) -> None:
    from broker.cloud.provisioner import Provisioner
    from broker.config.providers import parse_providers

    cfg = Config(providers=parse_providers({"cloudy": {"kind": "libcloud",
                                                       "registrar_wait_s": 0.1}}),
                 cluster_name="unit")
    rt = Runtime(cfg, "memory://")
    store = rt.store
    fake = FakeRedis()
    reg = Registrar(fake)
    if answers == "wait only":  # the registrar answers the first request, then is gone
        def once(raw: bytes) -> None:
            fake.on_push = None
            reg.handle(raw)
        fake.on_push = once
    rt.redis_url = "redis://sched:pw@10.0.0.1:6379/0"
    rt.__dict__["redis"] = fake
    provider = OneMachine()
    p = Provisioner(rt, {"cloudy": provider}, clock=lambda: 1000.0)  # type: ignore[dict-item]
    offer_id = provider.offers(None)[0].id
    store.record_instances([Instance("r1", offer_id, requested_at=990.0)])
    inst = store.instance("r1")
    assert inst is not None
    fake.hashes["sw:inst:r1"] = {"doc": json.dumps(inst.to_dict()).encode()}
    got = p.launch_one("r1")
    assert got is not None and got.state is S.FAILED, got
    assert "no registrar answered in 0.1 s: start `spillway registrar`" in got.reason
    if answers == "none":
        assert provider.terminated == [] and "credentials" in got.reason  # nothing launched
    else:
        assert provider.terminated == ["i-r1"] and got.provider_id == "i-r1"
        assert "got no agent rules" in got.reason and "given back" in got.reason
