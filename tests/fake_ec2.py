"""EC2 for tests: moto's server (a separate thread, reachable from subprocesses) behind a
small HTTP proxy that injects faults moto does not simulate.

moto never runs out of capacity nor throttles. :class:`FaultProxy` forwards every request to
moto unchanged, except that a fault queued for an EC2 action (``RunInstances``, ...) is
answered instead with EC2's own error document (``<Response><Errors><Error><Code>...``) and
HTTP status, the way the real endpoint answers. It counts the requests it saw and the faults it
served, per action.

moto keeps its state per process, not per server: every server a test process starts shows the
same instances, and they outlive the server (a second ``pytest.main`` in the same process, as
mutation testing runs, would find the first run's instances and instance profiles). So
:func:`moto_ec2` starts and leaves moto empty, :func:`reset_moto` empties it between the tests
that share one server, and each test still tags its machines with a cluster name of its own.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

from broker.control.embedded import free_port

_ERROR_XML = ('<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}'
              '</Code><Message>{message}</Message></Error></Errors><RequestID>{rid}</RequestID>'
              '</Response>')

#: The HTTP status EC2 answers each injected code with.
STATUS = {"InsufficientInstanceCapacity": 500, "MaxSpotInstanceCountExceeded": 400,
          "RequestLimitExceeded": 503, "InternalError": 500, "Unavailable": 503,
          "SpotMaxPriceTooLow": 400, "UnauthorizedOperation": 403, "VcpuLimitExceeded": 400}


class FaultProxy:
    """An HTTP proxy in front of ``upstream`` (host:port) that answers queued faults."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self._faults: dict[str, collections.deque[str]] = collections.defaultdict(
            collections.deque)
        self.seen: collections.Counter[str] = collections.Counter()  # action -> requests
        self.served: collections.Counter[str] = collections.Counter()  # code -> faults sent
        self._lock = threading.Lock()
        self.port = free_port()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def upstream_url(self) -> str:
        """moto itself, without faults."""
        return f"http://{self.upstream}"

    def inject(self, action: str, code: str, times: int = 1) -> None:
        """Answer the next ``times`` requests for ``action`` with the EC2 error ``code``."""
        with self._lock:
            self._faults[action].extend([code] * times)

    def pending(self, action: str) -> int:
        with self._lock:
            return len(self._faults[action])

    def _take(self, action: str) -> str | None:
        with self._lock:
            self.seen[action] += 1
            queue = self._faults[action]
            code = queue.popleft() if queue else None
            if code:
                self.served[code] += 1
            return code

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                return None

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                action = parse_qs(body.decode(errors="replace")).get("Action", [""])[0]
                code = proxy._take(action)
                if code:
                    self._answer(STATUS.get(code, 400), _ERROR_XML.format(
                        code=code, message=f"injected by the test's fault proxy ({action})",
                        rid=uuid.uuid4()).encode())
                    return
                host, port = proxy.upstream.split(":")
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() not in ("host", "connection")}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    self._answer(resp.status, resp.read(),
                                 resp.getheader("Content-Type", "text/xml"))
                finally:
                    conn.close()

            def _answer(self, status: int, data: bytes, ctype: str = "text/xml") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_GET = _relay

        return Handler

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def reset_moto(moto_url: str) -> None:
    """Empty every moto backend of this process (EC2, IAM, ...: moto's reset API), the way a
    fresh process starts."""
    request = urllib.request.Request(f"{moto_url}/moto-api/reset", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()


@contextlib.contextmanager
def moto_ec2() -> Iterator[tuple[str, FaultProxy]]:
    """moto's EC2 server on a free port, and a fault proxy in front of it: yields (moto's
    URL, the proxy). Clients that should meet faults use ``proxy.url``. moto is empty when it
    is handed over, and emptied again before the server stops."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    proxy = FaultProxy(f"127.0.0.1:{port}").start()
    try:
        reset_moto(url)
        yield url, proxy
    finally:
        with contextlib.suppress(OSError):
            reset_moto(url)
        proxy.stop()
        server.stop()


AWS_TEST_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
"""Dummy credentials for moto (set in the test's environment and its subprocesses')."""
