"""What a cloud machine joins the broker with: its own Redis ACL user, never the
provisioner's (docs/security.md, "Cloud workers").

When the provisioner's URL carries credentials and its provider has no ``broker_url`` of its
own, each launch gets a user ``spillway-cloud-<request id>`` with a new password. The
provisioner has no ACL right: it asks the registrar (``spillway registrar``,
broker/security/registrar.py), sending only the password's SHA-256, and waits at most the
provider's ``registrar_wait_s`` for each answer:

1. :func:`prepare`, before the launch: the user exists with no key at all (it may PING), so an
   agent that boots quickly gets in and waits; the boot script carries that URL and the
   broker's CA certificate (read from the URL's ``ssl_ca_certs``). No answer, or a refusal, is
   a :class:`~broker.security.registrar.RegistrarError` and nothing is launched.
2. :meth:`AgentJoin.finish`, once the launch returned the machine's provider id (its agent's
   node id): the user gets the agent rules of that node.
3. The registrar deletes the users of machines whose record has ended, on its own.

A ``local`` provider's machines are processes of the provisioner's own host and user: they
join with its URL. A provider with ``broker_url`` set joins with that (ops made its user).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from broker.security import acl, registrar

log = logging.getLogger(__name__)

USER_PREFIX = registrar.USER_PREFIX
#: URL options naming files of the provisioner's machine (meaningless on another one).
_LOCAL_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path")


@dataclass(frozen=True)
class AgentJoin:
    url: str  # what the machine's boot script exports as SPILLWAY_REDIS_URL
    ca_pem: str  # the broker's CA certificate for the machine ("" for none)
    user: str = ""  # the ACL user made for this machine ("": none was made)
    request_id: str = ""  # the machine's launch request id
    password_sha256: str = ""  # the user's password, as the registrar takes it
    prefix: str = acl.DEFAULT_PREFIX
    wait_s: float = registrar.WAIT_S

    def finish(self, rt: Any, node_id: str) -> str:
        """Have the registrar grant the machine's user the agent rules of ``node_id`` (its
        provider id). Returns "" when done (or nothing was to be done), else why not, also
        logged: the machine then cannot register."""
        if not self.user:
            return ""
        try:
            registrar.ask(rt.redis, registrar.Request(
                "agent", self.request_id, self.user, self.password_sha256, node_id),
                self.wait_s, self.prefix)
        except registrar.RegistrarError as e:
            log.error("machine %s: its Redis user %s got no agent rules (%s); it cannot "
                      "register", node_id, self.user, e)
            return f"its Redis user got no agent rules: {e}"
        return ""


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
            prefix: str = acl.DEFAULT_PREFIX, wait_s: float = registrar.WAIT_S) -> AgentJoin:
    """The URL and CA a new machine of provider ``kind`` joins with (module docstring);
    ``rt``: the provisioner's runtime (its ``redis_url``, and ``redis`` to reach the
    registrar). RegistrarError if the registrar does not make the machine's user within
    ``wait_s`` seconds."""
    redis_url = rt.redis_url
    if kind == "local":
        return AgentJoin(broker_url or redis_url, "")
    if broker_url or not has_credentials(redis_url):
        url, ca_pem = portable(broker_url or redis_url)
        return AgentJoin(url, ca_pem)
    url, ca_pem = portable(redis_url)
    name = registrar.user_name(request_id)
    password = acl.new_password()
    sha256 = acl.password_sha256(password)
    registrar.ask(rt.redis, registrar.Request("wait", request_id, name, sha256), wait_s,
                  prefix)
    return AgentJoin(acl.url_for(url, name, password), ca_pem, name, request_id, sha256, prefix,
                     wait_s)
