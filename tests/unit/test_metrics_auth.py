"""/metrics behind credentials and TLS (broker/metrics/http.py): real HTTP(S) requests to the
server broker.metrics.http.serve starts, and the settings' checks."""

from __future__ import annotations

import base64
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from wsgiref.simple_server import WSGIServer

import pytest

from broker.config.core import load_config
from broker.errors import ConfigError
from broker.metrics.agent import AgentMetrics
from broker.metrics.http import Guard, serve


@pytest.fixture
def started() -> Iterator[list[WSGIServer]]:
    servers: list[WSGIServer] = []
    yield servers
    for s in servers:
        s.shutdown()
        s.server_close()


def start(servers: list[WSGIServer], guard: Guard) -> int:
    server = serve(AgentMetrics().registry, 0, "127.0.0.1", guard=guard)
    assert server is not None
    servers.append(server)
    return server.server_port


def get(url: str, auth: str | None = None, ctx: ssl.SSLContext | None = None
        ) -> tuple[int, str, str]:
    """(status, body, WWW-Authenticate) of a GET."""
    req = urllib.request.Request(url, headers={"Authorization": auth} if auth else {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status, resp.read().decode(), ""
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers.get("WWW-Authenticate", "")


def test_a_bearer_token_is_needed_when_set(started: list[WSGIServer]) -> None:
    url = f"http://127.0.0.1:{start(started, Guard(token='s3cret'))}/metrics"
    status, body, challenge = get(url)
    assert status == 401 and "metrics_token" in body and challenge == "Bearer"
    assert get(url, "Bearer wrong")[0] == 401
    status, body, _ = get(url, "Bearer s3cret")
    assert status == 200 and "spillway_agent_heartbeat_lag_seconds" in body


def test_basic_auth_and_a_token_either_passes(started: list[WSGIServer]) -> None:
    url = f"http://127.0.0.1:{start(started, Guard('tok', 'prom:pa:ss'))}/metrics"
    basic = "Basic " + base64.b64encode(b"prom:pa:ss").decode()
    status, _, challenge = get(url, "Basic " + base64.b64encode(b"prom:nope").decode())
    assert status == 401 and challenge.startswith("Basic realm=")
    assert get(url, basic)[0] == 200 and get(url, "Bearer tok")[0] == 200


def test_no_setting_keeps_metrics_open(started: list[WSGIServer]) -> None:
    assert get(f"http://127.0.0.1:{start(started, Guard())}/metrics")[0] == 200


def test_tls_serves_https_only(started: list[WSGIServer], tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    port = start(started, Guard(token="t", tls_cert=str(cert), tls_key=str(key)))
    ctx = ssl.create_default_context(cafile=str(cert))
    status, body, _ = get(f"https://127.0.0.1:{port}/metrics", "Bearer t", ctx)
    assert status == 200 and "spillway_agent_job_starts_total" in body
    assert get(f"https://127.0.0.1:{port}/metrics", None, ctx)[0] == 401
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        get(f"http://127.0.0.1:{port}/metrics", "Bearer t")  # plain HTTP gets no answer


def test_bad_settings_name_the_field(tmp_path: Path) -> None:
    def guard(**env: str) -> Guard:
        return Guard.from_config(load_config(env={f"SPILLWAY_{k.upper()}": v
                                                  for k, v in env.items()}))

    assert guard(metrics_token="x") == Guard(token="x")
    with pytest.raises(ConfigError, match="config metrics_basic_auth: not user:password"):
        guard(metrics_basic_auth="prometheus")
    with pytest.raises(ConfigError, match="config metrics_tls_key: empty while "
                                          "metrics_tls_cert is set"):
        guard(metrics_tls_cert="/etc/cert.pem")
    (tmp_path / "c.pem").write_text("not a certificate")
    bad = Guard(tls_cert=str(tmp_path / "c.pem"), tls_key=str(tmp_path / "k.pem"))
    with pytest.raises(ConfigError, match="config metrics_tls_cert / metrics_tls_key: cannot "
                                          "load"):
        serve(AgentMetrics().registry, 0, "127.0.0.1", guard=bad)
