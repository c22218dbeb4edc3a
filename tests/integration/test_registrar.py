"""No Redis user but an administrator's can grant rights (issue 35, item 8), on a real
redis-server 7 with ACL users (tests/integration/test_security.py's server): the scheduler's
user is refused every ACL command; ``spillway registrar``, a process of its own on the user of
``spillway redis acl --role registrar``, makes a cloud machine's user on a valid request, that
user can then do what an agent of its node may and no more, and every bad request is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from broker.model import Instance, InstanceState
from broker.security import acl, cloud_agent, registrar
from broker.security.registrar import RegistrarError, Request
from broker.store import open_store
from tests.integration.harness import wait_until
from tests.integration.test_security import Server, registrar_running, server

__all__ = ["server"]  # (the module's redis-server fixture, shared with test_security)

pytestmark = pytest.mark.integration

OFFER = "libcloud:r1:z1:spot/g4"


def test_the_schedulers_user_may_not_grant_rights(server: Server) -> None:
    url, _ = server.user("scheduler", tls=False)
    sched = redis.Redis.from_url(url)
    try:
        for args in (("ACL", "SETUSER", "x", "on", ">pw", "~*", "+@all"),
                     ("ACL", "SETUSER", "spillway-scheduler", "+@all"),
                     ("ACL", "DELUSER", "default"), ("ACL", "USERS"),
                     ("ACL", "GETUSER", "default"), ("ACL", "LIST"), ("ACL", "LOG"),
                     ("CONFIG", "GET", "*"), ("CONFIG", "SET", "requirepass", "x"),
                     ("FLUSHALL",), ("SHUTDOWN",), ("KEYS", "*"),
                     ("MONITOR",), ("MODULE", "LIST"), ("FUNCTION", "FLUSH")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                sched.execute_command(*args)
        assert "x" not in server.admin.acl_users()
        sched.set("sw:anything", "1")  # every key, as before
        assert sched.info("server")["uptime_in_seconds"] >= 0  # (the leader reads it)
    finally:
        sched.close()


def test_the_registrar_makes_exactly_the_users_it_is_asked_for(server: Server,
                                                              tmp_path: Path) -> None:
    admin = server.admin
    admin.acl_log_reset()
    sched_url, _ = server.user("scheduler", tls=False)
    sched = redis.Redis.from_url(sched_url)
    store = open_store(sched_url)
    store.record_instances([Instance(rid, OFFER) for rid in ("r-ok", "r-bad")])
    rt = type("Rt", (), {"redis_url": sched_url, "redis": sched})()
    with registrar_running(server, tmp_path) as (_, log):
        join = cloud_agent.prepare(rt, "libcloud", "", "r-ok", wait_s=10)
        assert join.user == "spillway-cloud-r-ok" and "spillway-scheduler" not in join.url
        machine = redis.Redis.from_url(join.url)
        assert machine.ping()  # waiting: in, but no key
        with pytest.raises(redis.exceptions.NoPermissionError):
            machine.hset("sw:node:i-ok", "state", "READY")
        assert join.finish(rt, "i-ok") == ""
        machine.hset("sw:node:i-ok", "state", "READY")  # what an agent of its node may
        machine.rpush("node.i-ok", "x")
        for refused in (lambda: machine.hset("sw:node:i-other", "state", "READY"),
                        lambda: machine.lrange("node.i-other", 0, -1),
                        lambda: machine.rpush("sw:registrar:requests", "{}"),
                        lambda: machine.hget("sw:inst:r-ok", "doc"),
                        lambda: machine.execute_command("ACL", "SETUSER", "y", "on")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                refused()
        machine.close()

        # refused: a name that is not the request's, an unknown request, a globbing node id,
        # and a waiting user reset under a running machine
        sha = acl.password_sha256("guess")
        bad = {"a cloud machine's user is": Request("wait", "r-bad", "spillway-api", sha),
               "no instance record r-none": Request("wait", "r-none",
                                                    "spillway-cloud-r-none", sha),
               "node id 'i-*'": Request("agent", "r-bad", "spillway-cloud-r-bad", sha, "i-*"),
               "node id 'i?'": Request("agent", "r-bad", "spillway-cloud-r-bad", sha, "i?")}
        for why, request in bad.items():
            with pytest.raises(RegistrarError, match="the registrar refused") as e:
                registrar.ask(sched, request, 10)
            assert why in str(e.value)
        assert {"spillway-api", "spillway-cloud-r-none", "spillway-cloud-r-bad"}.isdisjoint(
            admin.acl_users())
        assert "refused" in log.read_text() and sha not in log.read_text()

        # a machine given back: the registrar deletes its user on its own
        store.move_instance("r-ok", InstanceState.TERMINATED, 1.0, "given back")
        wait_until(lambda: join.user not in admin.acl_users(), 30,
                   "the ended machine's user to be deleted")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(join.url).ping()

    # with no registrar: the provisioner's clear error, and the request taken back
    with pytest.raises(RegistrarError, match=r"no registrar answered in 0.2 s: start "
                       r"`spillway registrar` with the administrator's URL, or set the "
                       r"provider's broker_url"):
        cloud_agent.prepare(rt, "libcloud", "", "r-bad", wait_s=0.2)
    assert sched.llen("sw:registrar:requests") == 0
    # the registrar needed nothing its rules do not grant
    assert [e for e in admin.acl_log() if e["username"] == "spillway-registrar"] == []
    sched.close()


def test_the_registrars_user_reaches_only_its_keys(server: Server) -> None:
    url, _ = server.user("registrar", tls=False)
    reg = redis.Redis.from_url(url)
    try:
        reg.rpush("sw:registrar:reply:" + "0" * 32, "{}")
        assert reg.blpop(["sw:registrar:requests"], timeout=0.1) is None
        for refused in (lambda: reg.get("sw:job:x"), lambda: reg.hset("sw:inst:x", "doc", "{}"),
                        lambda: reg.lrange("sw:registrar:reply:" + "0" * 32, 0, -1),
                        lambda: reg.config_get("*"), lambda: reg.flushall(),
                        lambda: reg.execute_command("ACL", "GETUSER", "default"),
                        lambda: reg.publish("c", "m")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                refused()
    finally:
        reg.close()
