"""Serving ``/metrics`` (:func:`serve`), with optional credentials and TLS: what the scheduler's
and the agent's processes share (each serves its own registry: :mod:`broker.metrics.scheduler`,
:mod:`broker.metrics.agent`).

prometheus-client's own ``start_http_server`` has TLS but no credentials; its documented way to
serve a registry elsewhere is ``make_wsgi_app`` under any WSGI server
(https://prometheus.github.io/client_python/exporting/http/wsgi). So the registry's WSGI app
runs here behind a check of the ``Authorization`` header, in a threading ``wsgiref`` server
whose listening socket is wrapped in TLS when a certificate is configured:

* ``metrics_token``: ``Authorization: Bearer <token>`` (Prometheus: ``authorization:
  credentials_file``);
* ``metrics_basic_auth``: ``user:password`` (Prometheus: ``basic_auth``);
* ``metrics_tls_cert`` and ``metrics_tls_key``: PEM files; HTTPS only (Prometheus:
  ``scheme: https`` and ``tls_config``).

With both a token and basic auth set, either is accepted. A request without them gets 401.
"""

from __future__ import annotations

import base64
import hmac
import logging
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from broker.errors import ConfigError

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]


@dataclass(frozen=True)
class Guard:
    """How ``/metrics`` is protected; all empty: open, plain HTTP (the default)."""

    token: str = ""
    basic_auth: str = ""  # user:password
    tls_cert: str = ""
    tls_key: str = ""

    @classmethod
    def from_config(cls, config: Any) -> Guard:
        """From the ``metrics_*`` settings; ConfigError naming the one that is wrong."""
        guard = cls(config.metrics_token, config.metrics_basic_auth, config.metrics_tls_cert,
                    config.metrics_tls_key)
        if guard.basic_auth and ":" not in guard.basic_auth.strip(":"):
            raise ConfigError("config metrics_basic_auth: not user:password; allowed: a user "
                              "name, a colon, then the password (empty: no basic auth)")
        if bool(guard.tls_cert) != bool(guard.tls_key):
            have, lack = (("metrics_tls_cert", "metrics_tls_key") if guard.tls_cert
                          else ("metrics_tls_key", "metrics_tls_cert"))
            raise ConfigError(f"config {lack}: empty while {have} is set; set both (a PEM "
                              "certificate and its private key) for HTTPS, or neither")
        return guard

    def accepted(self) -> list[bytes]:
        """The ``Authorization`` header values that pass (none: no credentials needed)."""
        out = []
        if self.token:
            out.append(b"Bearer " + self.token.encode())
        if self.basic_auth:
            out.append(b"Basic " + base64.b64encode(self.basic_auth.encode()))
        return out

    def tls_context(self) -> ssl.SSLContext | None:
        if not self.tls_cert:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"config metrics_tls_cert / metrics_tls_key: cannot load "
                              f"{self.tls_cert!r} with {self.tls_key!r} ({e}); allowed: a PEM "
                              "certificate and the PEM private key that belongs to it") from None
        return ctx


def guarded(app: Callable[..., Iterable[bytes]], accepted: list[bytes]
            ) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    """``app`` behind a check of the Authorization header (compared in constant time)."""
    challenge = 'Basic realm="spillway metrics"' if any(
        a.startswith(b"Basic ") for a in accepted) else "Bearer"

    def check(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        got = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")
        if accepted and not any(hmac.compare_digest(got, a) for a in accepted):
            start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                                ("WWW-Authenticate", challenge)])
            return [b"401 Unauthorized: this /metrics needs credentials "
                    b"(metrics_token or metrics_basic_auth)\n"]
        return app(environ, start_response)

    return check


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scrape never holds the process at exit


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing: a scrape every 15 s is not news."""


def start(registry: CollectorRegistry, port: int, addr: str, guard: Guard) -> WSGIServer:
    """Serve ``registry`` from a daemon thread; OSError if the port is taken, ConfigError if
    the certificate cannot be loaded."""
    ctx = guard.tls_context()  # (before binding: a bad file is a ConfigError, not a port)
    app = guarded(make_wsgi_app(registry), guard.accepted())
    server = make_server(addr, port, app, _Server, handler_class=_Quiet)
    if ctx is not None:
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="spillway-metrics", daemon=True).start()
    return server


def serve(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0",
          guard: Guard | None = None) -> WSGIServer | None:
    """Serve ``registry`` on ``http://addr:port/metrics`` from a daemon thread (port 0: any
    free port; read it from the server's ``server_port``), behind ``guard``'s credentials and
    TLS if any (``Guard.from_config``). A port already taken is logged
    and the process goes on without metrics; a certificate that cannot be loaded is a
    ConfigError. Returns the server, or None."""
    guard = guard or Guard()
    try:
        server = start(registry, port, addr, guard)
    except OSError as e:
        log.warning("cannot serve metrics on %s:%d (%s); going on without them", addr, port, e)
        return None
    log.info("metrics on %s://%s:%d/metrics%s", "https" if guard.tls_cert else "http", addr,
             server.server_port, " (credentials needed)" if guard.accepted() else "")
    return server
