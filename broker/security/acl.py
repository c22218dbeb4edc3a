"""Redis ACL users for each Spillway component (Redis 7 or later; docs/security.md).

Roles, and what each may touch (``sw:`` is the store's key prefix, broker/store/redis.py):

* ``scheduler``: every key and channel, as the scheduler, reconciler and provisioner need;
  no administration and no ``ACL`` command at all (``INFO`` alone of the dangerous commands:
  the leader reads the server's uptime). Cloud machines' users are made by the registrar.
* ``api``: every key and channel, no administration (no ACL, CONFIG, FLUSHALL, KEYS, ...):
  the API server and operators' CLIs submit, cancel, drain and read.
* ``registrar``: ``ACL SETUSER/DELUSER/USERS`` and nothing else administrative; it pops its
  requests (``<prefix>registrar:requests``), pushes its replies
  (``<prefix>registrar:reply:*``, write only) and reads the cloud instance records
  (``<prefix>inst:*``) it checks requests against (broker/security/registrar.py). Anyone with
  ``ACL SETUSER`` can grant themselves anything: this user is an administrator's in all but
  name, and is held only by that one small process.
* ``agent``: one node, and only its keys. It writes its node's record (``sw:node:<id>``), its
  reports (``sw:reports:<id>``: started, exited, preempted, registered; the leading scheduler
  applies them to the job records) and its parts' log streams (``sw:logs:*@<id>``); it reads
  its node's view (``sw:run:<id>``: the jobs placed there, their attempts and sealed specs)
  and GPU allocations (``sw:alloc:<id>``, read only); it says hello once (``sw:nodes:hello``, write
  only), asks for cycles, and consumes its own Celery queue (``node.<id>``). It reads no job
  record, no other node's keys, no other team's spec, and writes no job record: a compromised
  agent can lie only about the jobs placed on its own node (docs/security.md).

Passwords never appear in the rules: a user's password goes in as ``#<sha256>``.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from broker.errors import SpillwayError

ROLES = ("scheduler", "api", "agent", "registrar")
DEFAULT_PREFIX = "sw:"
#: Keys outside the store's prefix that Spillway itself writes (broker/bus/commands.py).
CYCLE_KEYS = ("sw:cycle:dirty", "sw:cycle:wake")
#: Kombu's Redis transport: queue bindings, the unacknowledged-message ledger and its lock.
KOMBU_KEYS = ("_kombu.binding*", "unacked", "unacked_index", "unacked_mutex")
#: kombu's priority queues are ``<queue>\x06\x16<priority>`` (kombu.transport.redis).
PRIORITY_SEP = "\x06\x16"

_SHA256 = re.compile(r"[0-9a-f]{64}")
_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_USER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")

#: Commands no component but an administrator runs.
_NEVER = ("-@admin", "-@dangerous", "-function", "-script|flush", "-script|kill",
          "-swapdb", "-move", "-migrate")


def password_sha256(password: str) -> str:
    """What ``ACL SETUSER`` takes after ``#``: the password's SHA-256, in hex."""
    return hashlib.sha256(password.encode()).hexdigest()


class AclError(SpillwayError):
    """A bad role, node id or user name, or Redis refused to set the user up."""


@dataclass(frozen=True)
class AclUser:
    name: str
    rules: tuple[str, ...]  # ACL SETUSER arguments after the name, without the password

    def with_password(self, password: str) -> tuple[str, ...]:
        """The rules plus the password, as its SHA-256 (never the clear text)."""
        return self.with_hash(password_sha256(password))

    def with_hash(self, sha256: str) -> tuple[str, ...]:
        """The rules plus a password given as its SHA-256 (64 hex digits)."""
        if not _SHA256.fullmatch(sha256):
            raise AclError("a password's SHA-256 is 64 lower-case hex digits")
        return (*self.rules, f"#{sha256}")

    def command(self, password: str | None = None) -> str:
        """``ACL SETUSER ...`` as one redis-cli line (the password as its hash)."""
        rules = self.with_password(password) if password else self.rules
        return " ".join(["ACL", "SETUSER", self.name, *(_quote(r) for r in rules)])


def _quote(rule: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_.:~%&*+\-|@#<>=/()\[\]^?]+", rule):
        return rule
    return '"' + rule.encode("unicode_escape").decode().replace('"', '\\"') + '"'


def check_node_id(node_id: str) -> str:
    if not _NODE_ID.match(node_id) or any(c in node_id for c in "*?[]\\"):
        raise AclError(f"node id {node_id!r}: not allowed; use 1-128 letters, digits, '.', "
                       "'_', ':' or '-', starting with a letter or digit")
    return node_id


def default_user(role: str, node_id: str | None = None) -> str:
    return f"spillway-agent-{node_id}" if role == "agent" else f"spillway-{role}"


def user_for(role: str, node_id: str | None = None, name: str | None = None,
             prefix: str = DEFAULT_PREFIX) -> AclUser:
    """The ACL user of ``role`` (``agent`` needs ``node_id``)."""
    if role not in ROLES:
        raise AclError(f"role {role!r}: not a role; use one of {', '.join(ROLES)}")
    if role == "agent" and not node_id:
        raise AclError("role agent: --node is required (an agent's user is for one node)")
    if role != "agent" and node_id:
        raise AclError(f"role {role}: --node is only for the agent role")
    if node_id:
        check_node_id(node_id)
    name = name or default_user(role, node_id)
    if not _USER.match(name):
        raise AclError(f"user {name!r}: not allowed; use 1-128 letters, digits, '.', '_', ':' "
                       "or '-'")
    base = ("reset", "on", "resetchannels")
    if role == "scheduler":  # (INFO: the leader judges node leases from the server's uptime)
        return AclUser(name, (*base, "~*", "&*", "+@all", *_NEVER, "-acl", "+info"))
    if role == "api":
        return AclUser(name, (*base, "~*", "&*", "+@all", *_NEVER))
    if role == "registrar":
        return AclUser(name, (*base, *registrar_keys(prefix), "-@all", "+@connection",
                              "-@admin", "-@dangerous", *REGISTRAR_COMMANDS))
    return AclUser(name, (*base, *agent_keys(node_id or "", prefix),
                          "&*", "-@all", "+@read", "+@write", "+@scripting", "+@transaction",
                          "+@connection", "+@pubsub", "+@keyspace", "+@fast", *_NEVER,
                          "-publish", "-spublish", "-keys", "-scan", "-randomkey", "-rename",
                          "-renamenx", "-copy", "-restore"))


def agent_keys(node_id: str, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The key patterns of one node's agent: ``~`` read and write, ``%R~`` read only,
    ``%W~`` write only. Only its node's keys: it reads no job record, no other node's and no
    other team's spec (broker/store/node_reports.py, workers/channel.py)."""
    p, n = prefix, node_id
    # its record and heartbeat, its reports to the scheduler, its parts' log streams
    # (logs:{job}:{attempt}@{node}: a node id holds no '@', so the pattern is its own), and
    # its view (the jobs placed here: read, and declared by the log append's script, which
    # Redis counts as a write; an agent that wrote its own view would fool only itself)
    own = [f"{p}node:{n}", f"{p}reports:{n}", f"{p}logs:*@{n}", f"{p}run:{n}"]
    queue = [f"node.{n}", f"node.{n}{PRIORITY_SEP}*"]
    # the agent's Celery worker's remote-control queue (hostname agent@<id>), and replies
    celery = [*KOMBU_KEYS, f"agent@{n}.celery.pidbox*", "*reply.celery.pidbox*"]
    # (node ids hold no glob characters: check_node_id)
    rules = [f"~{k}" for k in (*own, *CYCLE_KEYS, *queue, *celery)]
    # its GPUs' owners, as the scheduler wrote them; and the list of registered agents
    # (said once, at start)
    return [*rules, f"%R~{p}alloc:{n}", f"%W~{p}nodes:hello"]


def registrar_keys(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The registrar's keys: its request list (popped: read and write), its replies (pushed:
    write only) and the cloud instance records it checks requests against (read only)."""
    return [f"~{prefix}registrar:requests", f"%W~{prefix}registrar:reply:*",
            f"%R~{prefix}inst:*"]


#: What the registrar runs besides its connection's commands (broker/security/registrar.py).
REGISTRAR_COMMANDS = ("+blpop", "+rpush", "+expire", "+hget", "+acl|setuser", "+acl|deluser",
                      "+acl|users")


def waiting_user(name: str) -> AclUser:
    """A cloud machine's user before its machine has an id: it may connect and ``PING``,
    nothing more (no key, no channel), so a fast-booting agent gets in and retries."""
    if not _USER.match(name):
        raise AclError(f"user {name!r}: not allowed; use 1-128 letters, digits, '.', '_', ':' "
                       "or '-'")
    return AclUser(name, ("reset", "on", "resetchannels", "-@all", "+@connection", "-@admin",
                          "-@dangerous"))


# -- applying ---------------------------------------------------------------------------------


def new_password() -> str:
    """A random password (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def setuser(client: Any, user: AclUser, password: str) -> None:
    """Create or replace ``user`` on the server ``client`` talks to."""
    setuser_hashed(client, user, password_sha256(password))


def setuser_hashed(client: Any, user: AclUser, sha256: str) -> None:
    """:func:`setuser` with the password given as its SHA-256 only."""
    import redis

    try:
        client.execute_command("ACL", "SETUSER", user.name, *user.with_hash(sha256))
    except redis.ResponseError as e:
        raise AclError(f"Redis refused ACL SETUSER {user.name}: {e} (the connecting user "
                       "needs the acl|setuser permission, and Redis 7 or later)") from None


def deluser(client: Any, name: str) -> bool:
    return bool(client.execute_command("ACL", "DELUSER", name))


def url_for(base_url: str, user: str, password: str) -> str:
    """``base_url`` (its host, port, database, TLS options) with this user and password."""
    parts = urlsplit(base_url)
    host = parts.hostname or "127.0.0.1"
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    netloc += f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def mint_agent(client: Any, base_url: str, node_id: str, prefix: str = DEFAULT_PREFIX,
               name: str | None = None) -> str:
    """Create (or replace) the agent user of ``node_id`` with a new password; return the
    URL its agent connects with (``base_url``'s server and TLS options)."""
    user = user_for("agent", node_id, name, prefix)
    password = new_password()
    setuser(client, user, password)
    return url_for(base_url, user.name, password)


def rules_text(users: Sequence[AclUser], password: str | None = None) -> str:
    return "\n".join(u.command(password) for u in users) + "\n"
