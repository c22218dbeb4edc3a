"""The client's HTTP side: :class:`broker.client.Client` given an ``https://`` URL (or
``http://`` to this machine) sends its calls here, to ``spillway api``, with a token, through
its HTTPS transport (:mod:`broker.client.https`); the CLI's finance and token commands call
:class:`Remote` for what the transport does not carry (budgets, reports, tokens).

The token comes from ``SPILLWAY_TOKEN``, else from the file ``SPILLWAY_TOKEN_FILE`` (default
``~/.config/spillway/token``), which must be readable by its owner only (mode 0600). The
server's certificate is checked against the system's CAs, or ``SPILLWAY_CA_FILE``. Standard
library only (http.client): researchers need no extra package to talk to the API.
"""

from __future__ import annotations

import builtins
import contextlib
import http.client
import ipaddress
import json
import os
import ssl
import stat
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from broker.config.core import Config
from broker.errors import (
    ConfigError,
    Conflict,
    FieldError,
    JobNotFound,
    NodeNotFound,
    SpecError,
    SpillwayError,
)
from broker.model import Job, Node
from broker.model.state import JobState
from broker.security.tokens import RateLimited, Refused, TokenError
from broker.store.backend import LogLine

DEFAULT_TOKEN_FILE = "~/.config/spillway/token"
IDLE_S = 4.0  # reconnect before reusing a connection idle this long (uvicorn closes at 5 s)


class ApiUnreachable(SpillwayError, ConnectionError):
    """The API server did not answer."""


#: A rate-limited submit is sent again after the server's Retry-After when that is at most
#: this many seconds, and while the waits add up to at most PACE_TOTAL_S.
PACE_S = 30.0
PACE_TOTAL_S = 120.0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_token(env: Mapping[str, str] | None = None) -> str:
    """The caller's token: SPILLWAY_TOKEN, else the token file (refused unless mode 0600)."""
    env = os.environ if env is None else env
    if env.get("SPILLWAY_TOKEN", "").strip():
        return env["SPILLWAY_TOKEN"].strip()
    named = env.get("SPILLWAY_TOKEN_FILE")
    path = Path(named or DEFAULT_TOKEN_FILE).expanduser()
    try:
        st = path.stat()
    except OSError:
        st = None
    if st is None:
        where = f"the token file {path} does not exist; " if named else ""
        raise ConfigError(f"no API token: {where}set SPILLWAY_TOKEN, or write the token to "
                          f"{DEFAULT_TOKEN_FILE} (or SPILLWAY_TOKEN_FILE) with mode 0600")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise ConfigError(f"token file {path} has mode {stat.S_IMODE(st.st_mode):04o}; others "
                          f"could read it. Run `chmod 600 {path}`")
    token = path.read_text().strip()
    if not token:
        raise ConfigError(f"token file {path} is empty")
    return token


def _fail(status: int, body: Any) -> SpillwayError:
    """The error a refused call raises, from the server's JSON reply."""
    body = body if isinstance(body, dict) else {}
    msg = str(body.get("error") or f"the API server answered HTTP {status}")
    errors = [FieldError(str(e.get("field", "")), str(e.get("problem", "")),
                         str(e.get("allowed", ""))) for e in body.get("errors") or ()
              if isinstance(e, dict)]
    if status == 422 and errors:
        return SpecError(errors)
    if status == 404 and msg.startswith("no job with id"):
        return JobNotFound(msg.split("'")[1] if "'" in msg else "")
    if status == 404 and msg.startswith("no node with id"):
        return NodeNotFound(msg.split("'")[1] if "'" in msg else "")
    if status == 429:
        return RateLimited(msg, 0.0)
    kind: type[SpillwayError] = {401: TokenError, 403: Refused, 409: Conflict}.get(
        status, SpillwayError)
    return kind(msg)


class Remote:
    """One API server, one keep-alive connection (thread-safe through a lock)."""

    def __init__(self, url: str, config: Config, token: str | None = None) -> None:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.scheme == "http" and not is_loopback(host):
            raise ConfigError(f"refusing plain http:// to {host}: tokens would cross the network"
                              " unencrypted; use https:// (http:// is for localhost only)")
        if not host:
            raise ConfigError(f"API URL {url!r} has no host; e.g. https://spillway.example:8443")
        self.url, self.config = url.rstrip("/"), config
        self._host, self._tls = host, parts.scheme == "https"
        self._port = parts.port or (443 if self._tls else 80)
        self._base = parts.path.rstrip("/")
        self._token = token or load_token()
        self._ctx = ssl.create_default_context(cafile=os.environ.get("SPILLWAY_CA_FILE") or None) \
            if self._tls else None
        self._conn: http.client.HTTPConnection | None = None
        self._used = 0.0
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        if self._tls:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                               context=self._ctx)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _send(self, conn: http.client.HTTPConnection, method: str, path: str,
              body: Any) -> http.client.HTTPResponse:
        data = None if body is None else json.dumps(body, default=str).encode()
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, self._base + path, body=data, headers=headers)
            return conn.getresponse()
        except ssl.SSLCertVerificationError as e:
            raise ApiUnreachable(f"the API server at {self.url} has a certificate this client "
                                 f"does not trust ({e.verify_message}); set SPILLWAY_CA_FILE "
                                 "to its CA") from None

    def call(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Any:
        """One request on the kept connection; the JSON reply, or the error it stands for. A
        rate-limited submit (429) whose ``Retry-After`` is at most :data:`PACE_S` is sent again
        after it, up to :data:`PACE_TOTAL_S` in all: a long sweep is paced, not refused."""
        waited = 0.0
        while True:
            try:
                return self._call_once(method, path, body, timeout)
            except RateLimited as e:
                if not 0 < e.retry_after <= PACE_S or waited + e.retry_after > PACE_TOTAL_S:
                    raise
                time.sleep(e.retry_after)  # (the server's pacing, not a synchronisation)
                waited += e.retry_after

    def _call_once(self, method: str, path: str, body: Any, timeout: float) -> Any:
        with self._lock:
            reused = self._conn is not None and time.monotonic() - self._used < IDLE_S
            if not reused:
                self.close()
            for attempt in (1, 2):
                if self._conn is None:
                    self._conn = self._connect(timeout)
                self._conn.timeout = timeout
                if self._conn.sock is not None:
                    self._conn.sock.settimeout(timeout)
                try:
                    resp = self._send(self._conn, method, path, body)
                    raw = resp.read()
                    break
                except (OSError, http.client.HTTPException) as e:
                    self.close()  # a kept connection the server closed: send it once more
                    if attempt == 2 or not reused or isinstance(e, ApiUnreachable):
                        raise e if isinstance(e, ApiUnreachable) else ApiUnreachable(
                            f"cannot reach the API server at {self.url} ({e}); is `spillway "
                            "api` running there?") from None
            self._used = time.monotonic()
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = None
        if resp.status >= 400:
            err = _fail(resp.status, doc)
            if isinstance(err, RateLimited):
                with contextlib.suppress(ValueError):
                    err.retry_after = float(resp.getheader("Retry-After") or 0)
            raise err
        return doc

    # -- the client's calls ----------------------------------------------------------------------

    def submit(self, data: Mapping[str, Any], hold: bool | None) -> Job:
        return Job.from_dict(self.call("POST", "/v1/jobs", {
            "spec": dict(data), "hold_if_infeasible": hold}))

    def submit_many(self, datas: Sequence[Mapping[str, Any]], hold: bool | None
                    ) -> builtins.list[Job]:
        if not datas:
            return []
        return [Job.from_dict(d) for d in self.call("POST", "/v1/jobs/batch", {
            "specs": [dict(d) for d in datas], "hold_if_infeasible": hold})]

    @staticmethod
    def _job(job_id: str, what: str = "") -> str:
        return f"/v1/jobs/{quote(job_id, safe='')}{what}"

    def get(self, job_id: str) -> Job:
        return Job.from_dict(self.call("GET", self._job(job_id)))

    def list(self, states: set[JobState] | None, team: str | None, priority: str | None,
             limit: int | None, skip: int) -> builtins.list[Job]:
        query = {"state": ",".join(sorted(s.value for s in states)) if states else None,
                 "team": team, "priority": priority, "limit": limit, "skip": skip or None}
        q = urlencode({k: v for k, v in query.items() if v is not None})
        return [Job.from_dict(d) for d in self.call("GET", "/v1/jobs" + (f"?{q}" if q else ""))]

    def cancel(self, job_id: str) -> Job:
        return Job.from_dict(self.call("POST", self._job(job_id, "/cancel")))

    def wait(self, job_id: str, timeout: float | None) -> tuple[Job, bool]:
        """The job once it ended, or as it was at ``timeout`` (and whether it ended)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 60.0 if deadline is None else max(0.0, min(60.0, deadline - time.monotonic()))
            doc = self.call("GET", self._job(job_id, f"/wait?timeout={left:.3f}"),
                            timeout=left + 30.0)
            job = Job.from_dict(doc["job"])
            if doc["done"] or (deadline is not None and time.monotonic() >= deadline):
                return job, bool(doc["done"])

    def logs(self, job_id: str, attempt: int | None, follow: bool,
             since: str) -> Iterator[LogLine]:
        """Streamed on a connection of its own (the kept one stays free for other calls)."""
        query = urlencode({k: v for k, v in {"attempt": attempt, "since": since,
                                             "follow": "true" if follow else None}.items()
                           if v is not None})
        conn = self._connect(None if follow else 60.0)
        try:
            try:
                resp = self._send(conn, "GET", self._job(job_id, f"/logs?{query}"), None)
            except (OSError, http.client.HTTPException) as e:
                raise ApiUnreachable(f"cannot reach the API server at {self.url} ({e})"
                                     ) from None
            if resp.status >= 400:
                raw = resp.read()
                raise _fail(resp.status, json.loads(raw) if raw.startswith(b"{") else None)
            for raw_line in resp:
                d = json.loads(raw_line)
                yield LogLine(d["cursor"], d["time"], d["stream"], d["text"])
        except (TimeoutError, http.client.IncompleteRead) as e:
            raise ApiUnreachable(f"the log stream from {self.url} broke off ({e})") from None
        finally:
            conn.close()

    def explain(self, job_id: str) -> dict[str, Any]:
        return self.call("GET", self._job(job_id, "/explain"))

    def nodes(self) -> builtins.list[dict[str, Any]]:
        return self.call("GET", "/v1/nodes")

    def node_state(self, node_id: str, action: str) -> Node:
        return Node.from_dict(self.call("POST", f"/v1/nodes/{quote(node_id, safe='')}/{action}"))

    # -- budgets and reports (finance; broker/api/budgets.py, reports.py) ---------------------

    @staticmethod
    def _team(team: str, what: str = "") -> str:
        return f"/v1/budgets/{quote(team, safe='')}{what}"

    def budgets(self, team: str | None = None) -> builtins.list[dict[str, Any]]:
        """Each budget the token may see (``team``: that one, even without a cap)."""
        if team is not None:
            return [self.call("GET", self._team(team))]
        return self.call("GET", "/v1/budgets")

    def set_budget(self, team: str, amount: float, window: str, hard: bool,
                   alerts: Sequence[float]) -> dict[str, Any]:
        return self.call("PUT", self._team(team), {"amount": amount, "window": window,
                                                   "hard": hard, "alerts": list(alerts)})

    def remove_budget(self, team: str) -> dict[str, Any]:
        return self.call("DELETE", self._team(team))

    def budget_history(self, team: str) -> builtins.list[dict[str, Any]]:
        return self.call("GET", self._team(team, "/history"))

    def whoami(self) -> dict[str, Any]:
        return self.call("GET", "/v1/whoami")

    def report(self, query: Mapping[str, str | None]) -> dict[str, Any]:
        """The spend report as JSON (``month``, ``week``, ``from``, ``to``, ``by``,
        ``forecast``, ``team``); the caller renders the other formats."""
        q = urlencode({k: v for k, v in {**query, "format": "json"}.items() if v is not None})
        return self.call("GET", f"/v1/reports?{q}", timeout=120.0)
