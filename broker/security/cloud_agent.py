"""What a cloud machine joins the broker with: its own Redis ACL user, never the
provisioner's (docs/security.md, "Cloud workers").

When the provisioner's URL carries credentials and its provider has no ``broker_url`` of its
own, each launch gets a user ``spillway-cloud-<request id>`` with a new password:

1. :func:`prepare`, before the launch: the user exists with a password and no key at all
   (it may PING), so an agent that boots quickly gets in and waits; the boot script carries
   that URL and the broker's CA certificate (read from the URL's ``ssl_ca_certs``).
2. :func:`AgentJoin.finish`, once the launch returned the machine's provider id (its agent's
   node id): the user gets the agent rules of that node (broker/security/acl.py).
3. :func:`drop_ended`, in each lifecycle pass: the users of machines that ended are deleted,
   so a machine given back (or its disk) holds no working credentials.

A ``local`` provider's machines are processes of the provisioner's own host and user: they
join with its URL. A provider with ``broker_url`` set joins with that (ops made its user).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from broker.security import acl

log = logging.getLogger(__name__)

USER_PREFIX = "spillway-cloud-"
#: URL options naming files of the provisioner's machine (meaningless on another one).
_LOCAL_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path")


@dataclass(frozen=True)
class AgentJoin:
    url: str  # what the machine's boot script exports as SPILLWAY_REDIS_URL
    ca_pem: str  # the broker's CA certificate for the machine ("" for none)
    user: str = ""  # the ACL user made for this machine ("": none was made)
    password: str = ""
    prefix: str = acl.DEFAULT_PREFIX

    def finish(self, rt: Any, node_id: str) -> None:
        """Grant the machine's user the agent rules of ``node_id`` (its provider id). A
        failure is logged: the machine then never registers, and the lifecycle gives it back
        after its boot timeout."""
        if not self.user:
            return
        try:
            acl.setuser(rt.redis, acl.user_for("agent", node_id, self.user, self.prefix),
                        self.password)
        except Exception as e:
            log.error("machine %s: its Redis user %s got no agent rules (%s); it cannot "
                      "register", node_id, self.user, e)


def has_credentials(url: str) -> bool:
    try:
        parts = urlsplit(url)
        return bool(parts.password or parts.username)
    except ValueError:
        return False


def portable(url: str) -> tuple[str, str]:
    """``url`` without the options that name local files, and the CA certificate its
    ``ssl_ca_certs`` names (read here, to travel in the boot script; "" for none)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ca_file = next((v for k, v in query if k == "ssl_ca_certs"), "")
    ca_pem = Path(ca_file).read_text() if ca_file else ""
    kept = [(k, v) for k, v in query if k not in _LOCAL_FILES]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(kept),
                       parts.fragment)), ca_pem


def prepare(rt: Any, kind: str, broker_url: str, request_id: str,
            prefix: str = acl.DEFAULT_PREFIX) -> AgentJoin:
    """The URL and CA a new machine of provider ``kind`` joins with (module docstring);
    ``rt``: the provisioner's runtime (its ``redis_url``, and ``redis`` to make users)."""
    redis_url = rt.redis_url
    if kind == "local":
        return AgentJoin(broker_url or redis_url, "")
    if broker_url or not has_credentials(redis_url):
        url, ca_pem = portable(broker_url or redis_url)
        return AgentJoin(url, ca_pem)
    url, ca_pem = portable(redis_url)
    name = f"{USER_PREFIX}{request_id}"
    password = acl.new_password()
    waiting = acl.AclUser(name, ("reset", "on", "resetchannels", "-@all", "+@connection",
                                 "-@admin", "-@dangerous"))
    acl.setuser(rt.redis, waiting, password)
    return AgentJoin(acl.url_for(url, name, password), ca_pem, name, password, prefix)


def drop_ended(rt: Any, live_request_ids: Iterable[str]) -> int:
    """Delete the users of machines whose request is not live (``rt``: the provisioner's
    runtime, whose ``redis`` made them); returns how many. Nothing to do, and no round trip,
    where the provisioner's URL has no credentials (it made no user)."""
    if not has_credentials(rt.redis_url):
        return 0
    live = {f"{USER_PREFIX}{r}" for r in live_request_ids}
    client = rt.redis
    try:
        users = [u.decode() if isinstance(u, bytes) else str(u)
                 for u in client.execute_command("ACL", "USERS")]
    except Exception as e:  # (no ACL rights: nothing was minted either)
        log.debug("cannot list ACL users (%s)", e)
        return 0
    gone = [u for u in users if u.startswith(USER_PREFIX) and u not in live]
    return sum(acl.deluser(client, u) for u in gone)
