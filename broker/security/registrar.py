"""The registrar: the one Spillway process that may grant Redis rights (docs/security.md,
"Cloud workers").

Anyone with ``ACL SETUSER`` can make themselves an administrator, so no long-running
component holds it but this one: ``spillway registrar``, run with the administrator's URL or
with the user of ``spillway redis acl --role registrar`` (``ACL SETUSER/DELUSER/USERS``, its
request and reply keys, the cloud instance records: broker/security/acl.py). The scheduler's
provisioner, which has no ACL right, asks it for each cloud machine's user:

* it pushes a JSON request onto ``<prefix>registrar:requests`` (:func:`ask`) and waits, at
  most the provider's ``registrar_wait_s``, on ``<prefix>registrar:reply:<token>``;
* the registrar (:class:`Registrar`) pops it, checks it, and does exactly one thing: ``wait``
  makes the user ``spillway-cloud-<request id>`` with no key at all (it may connect and PING);
  ``agent`` gives that user the agent rules of one node (``acl.user_for("agent", ...)``).
  Anything else is refused, and the refusal logged and answered with its reason;
* every ``sweep_s`` it deletes the cloud users whose instance record has ended.

A request is checked against the instance record the provisioner wrote before the launch
(``<prefix>inst:<request id>``): the user must be ``spillway-cloud-<request id>``; ``wait``
needs the record REQUESTED (a running machine's user is never reset), ``agent`` needs it live
and, once the record names the machine, that machine's id as the node id; the node id must
pass :func:`acl.check_node_id` (no glob characters). The password never reaches the
registrar: the provisioner generates it (it goes into the machine's boot script) and sends
only its SHA-256, which ``ACL SETUSER`` takes as ``#<sha256>``. The registrar's own
credentials never leave its process.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import redis

from broker.model import Instance, InstanceState
from broker.security import acl

log = logging.getLogger(__name__)

USER_PREFIX = "spillway-cloud-"
REQUESTS = "registrar:requests"
REPLY = "registrar:reply:"
WAIT_S = 10.0  # the provisioner waits this long for an answer (registrar_wait_s)
REPLY_TTL_S = 120  # an answer nobody read is gone after this
SWEEP_S = 30.0  # users of ended machines are deleted this often
MAX_REQUEST = 4096  # bytes; a longer request is refused unread
OPS = ("wait", "agent")
_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,111}")
_TOKEN = re.compile(r"[0-9a-f]{32}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class RegistrarError(acl.AclError):
    """No registrar answered, or it refused the request (the text says which and why)."""


class Refused(Exception):
    """A request the registrar does not carry out; the text says why."""


def requests_key(prefix: str = acl.DEFAULT_PREFIX) -> str:
    return f"{prefix}{REQUESTS}"


def reply_key(token: str, prefix: str = acl.DEFAULT_PREFIX) -> str:
    return f"{prefix}{REPLY}{token}"


def user_name(request_id: str) -> str:
    """The Redis user of the machine of launch request ``request_id``."""
    return f"{USER_PREFIX}{request_id}"


@dataclass(frozen=True)
class Request:
    """What the provisioner asks for one machine's user."""

    op: str  # "wait" (the user, no rights) or "agent" (the agent rules of node_id)
    request_id: str  # the machine's launch request id (its instance record's key)
    user: str  # spillway-cloud-<request_id>
    password_sha256: str  # the user's password, as ACL SETUSER's #<sha256>
    node_id: str = ""  # op agent: the machine's id, its agent's node id
    reply: str = ""  # the reply key's token (32 hex digits)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)


def parse(raw: bytes | str) -> Request:
    """A request as sent by :func:`ask`; Refused for anything else."""
    if len(raw) > MAX_REQUEST:
        raise Refused(f"a request of {len(raw)} bytes (at most {MAX_REQUEST})")
    try:
        doc = json.loads(raw)
    except ValueError:
        raise Refused("not a JSON request") from None
    fields = set(Request.__dataclass_fields__)
    if not isinstance(doc, dict) or not set(doc) <= fields \
            or not all(isinstance(v, str) for v in doc.values()):
        raise Refused(f"a request holds string fields of {', '.join(sorted(fields))} only")
    try:
        return Request(**doc)
    except TypeError:
        raise Refused("a request lacks op, request_id, user or password_sha256") from None


# -- the provisioner's side --------------------------------------------------------------------


def ask(client: Any, request: Request, wait_s: float,
        prefix: str = acl.DEFAULT_PREFIX) -> None:
    """Send ``request`` to the registrar and wait for its answer, at most ``wait_s`` seconds
    (``client``: the provisioner's Redis client). RegistrarError if none answers in time or
    it refuses."""
    if not wait_s > 0:
        raise ValueError("wait_s must be > 0")
    token = secrets.token_hex(16)
    payload = Request(**{**asdict(request), "reply": token}).to_json()
    queue = requests_key(prefix)
    client.rpush(queue, payload)
    got = client.blpop([reply_key(token, prefix)], timeout=wait_s)
    if got is None:
        taken = client.lrem(queue, 1, payload) == 0  # (still queued: nobody took it)
        if taken:
            raise RegistrarError(f"the registrar took the request for {request.user} but "
                                 f"did not answer in {wait_s:g} s; see its log")
        raise RegistrarError(f"no registrar answered in {wait_s:g} s: start `spillway "
                             "registrar` with the administrator's URL, or set the provider's "
                             "broker_url (docs/security.md, \"Cloud workers\")")
    try:
        answer = json.loads(got[1])
        ok, error = bool(answer["ok"]), str(answer.get("error", ""))
    except (ValueError, KeyError, TypeError):
        raise RegistrarError("the registrar's answer is not one it sends") from None
    if not ok:
        raise RegistrarError(f"the registrar refused {request.op} for {request.user}: {error}")


# -- the registrar's side ----------------------------------------------------------------------


class Registrar:
    """Carries out the provisioner's requests on the server ``client`` talks to (its user
    needs the registrar's rights, or an administrator's)."""

    def __init__(self, client: Any, prefix: str = acl.DEFAULT_PREFIX,
                 sweep_s: float = SWEEP_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.prefix, self.sweep_s, self.clock = client, prefix, sweep_s, clock
        self._swept = -1e18

    def instance(self, request_id: str) -> Instance | None:
        try:
            doc = self.client.hget(f"{self.prefix}inst:{request_id}", "doc")
        except redis.exceptions.NoPermissionError:
            raise
        except redis.ResponseError as e:
            raise Refused(f"the instance record of {request_id} cannot be read ({e})") from None
        if doc is None:
            return None
        try:
            return Instance.from_dict(json.loads(doc))
        except (ValueError, KeyError, TypeError) as e:
            raise Refused(f"the instance record of {request_id} cannot be read ({e})") from None

    def check(self, req: Request) -> acl.AclUser:
        """The user ``req`` may set (its rules without the password); Refused otherwise."""
        if req.op not in OPS:
            raise Refused(f"op {req.op!r} is not one of {', '.join(OPS)}")
        if not _REQUEST_ID.fullmatch(req.request_id):
            raise Refused(f"request id {req.request_id!r} is not one the provisioner makes")
        if req.user != user_name(req.request_id):
            raise Refused(f"user {req.user!r}: a cloud machine's user is "
                          f"{user_name(req.request_id)!r}")
        if not _SHA256.fullmatch(req.password_sha256):
            raise Refused("password_sha256 is not 64 lower-case hex digits")
        inst = self.instance(req.request_id)
        if inst is None or inst.request_id != req.request_id:
            raise Refused(f"no instance record {req.request_id}: no such launch")
        if req.op == "wait":
            if req.node_id:
                raise Refused("op wait names no node")
            if inst.state is not InstanceState.REQUESTED:
                raise Refused(f"instance {req.request_id} is {inst.state.value}, not "
                              "REQUESTED: its user is made before the launch only")
            return acl.waiting_user(req.user)
        try:
            acl.check_node_id(req.node_id)
        except acl.AclError as e:
            raise Refused(str(e)) from None
        if inst.ended:
            raise Refused(f"instance {req.request_id} has ended ({inst.state.value})")
        if inst.provider_id and inst.provider_id != req.node_id:
            raise Refused(f"instance {req.request_id} is machine {inst.provider_id}, not "
                          f"{req.node_id}")
        return acl.user_for("agent", req.node_id, req.user, self.prefix)

    def handle(self, raw: bytes | str) -> None:
        """Carry out (or refuse) one request and answer it where it asked."""
        try:
            req = parse(raw)
        except Refused as e:
            log.warning("refused a request: %s", e)
            return
        if not _TOKEN.fullmatch(req.reply):
            log.warning("refused a request for %r: no reply token", req.user)
            return
        try:
            user = self.check(req)
            acl.setuser_hashed(self.client, user, req.password_sha256)
        except (Refused, acl.AclError) as e:
            log.warning("refused %s for user %r (request %r): %s", req.op, req.user,
                        req.request_id, e)
            self.answer(req.reply, False, str(e))
            return
        what = f"the agent rules of node {req.node_id}" if req.op == "agent" else "no rights yet"
        log.info("user %s set: %s (request %s)", req.user, what, req.request_id)
        self.answer(req.reply, True)

    def answer(self, token: str, ok: bool, error: str = "") -> None:
        key = reply_key(token, self.prefix)
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(key, json.dumps({"ok": ok, "error": error}))
        pipe.expire(key, REPLY_TTL_S)
        pipe.execute()

    def sweep(self) -> int:
        """Delete the users of machines whose instance record has ended; returns how many.
        A cloud user with no record here is left alone (another store's, on this server)."""
        self._swept = self.clock()
        gone = 0
        for raw in self.client.execute_command("ACL", "USERS"):
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            request_id = name.removeprefix(USER_PREFIX)
            if name == request_id or not _REQUEST_ID.fullmatch(request_id):
                continue
            try:
                inst = self.instance(request_id)
            except Refused as e:
                log.warning("user %s kept: %s", name, e)
                continue
            if inst is not None and inst.ended:
                gone += acl.deluser(self.client, name)
                log.info("user %s deleted: its machine %s", name, inst.state.value.lower())
        return gone

    def serve(self, block_s: float = 1.0) -> bool:
        """Sweep when due, then handle the next request, waiting at most ``block_s`` for it.
        True if one was handled."""
        if self.clock() - self._swept >= self.sweep_s:
            self.sweep()
        got = self.client.blpop([requests_key(self.prefix)], timeout=block_s)
        if got is None:
            return False
        self.handle(got[1])
        return True


def run_registrar(url: str, prefix: str = acl.DEFAULT_PREFIX, sweep_s: float = SWEEP_S,
                  stop: threading.Event | None = None, retry_s: float = 60.0) -> int:
    """Serve requests until ``stop`` is set; ride out Redis outages. Returns the exit code:
    1 at once if this user may not run ``ACL USERS`` or read its requests."""
    from broker.errors import StoreRefused, StoreUnreachable
    from broker.store.reach import REFUSED, UNREACHABLE, hide_password, wait_for_redis

    stop = stop or threading.Event()
    shown = hide_password(url)
    try:
        if not wait_for_redis(url, retry_s, stop, "registrar", log):
            return 0
    except (StoreRefused, StoreUnreachable) as e:
        log.error("%s. The registrar exits", e)
        return 1
    client = redis.Redis.from_url(url, socket_connect_timeout=5.0, socket_timeout=15.0)
    registrar = Registrar(client, prefix, sweep_s)
    down_since: float | None = None
    try:
        registrar.sweep()  # (and proof that this user holds the ACL rights)
        log.warning("registrar on %s: requests on %s, ended machines' users deleted every "
                    "%gs", shown, requests_key(prefix), sweep_s)
        while not stop.is_set():
            try:
                registrar.serve()
                if down_since is not None:
                    log.warning("Redis answers again after %.0fs", time.monotonic() - down_since)
                    down_since = None
            except REFUSED:
                raise
            except redis.ResponseError as e:  # (e.g. its request key made something else)
                log.error("the registrar's request failed: %s; retrying in a second", e)
                stop.wait(1.0)
            except UNREACHABLE as e:
                if down_since is None:
                    down_since = time.monotonic()
                    log.warning("Redis at %s does not answer (%s); retrying every second",
                                shown, e)
                stop.wait(1.0)
    except REFUSED as e:
        log.error("Redis at %s refused the registrar (%s): run it with the administrator's "
                  "URL, or the user of `spillway redis acl --role registrar`", shown, e)
        return 1
    finally:
        client.close()
    return 0
