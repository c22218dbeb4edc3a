"""A cloud machine's metadata service for tests: the parts of AWS IMDSv2 and the GCE metadata
server that Spillway reads, on a local port (``$SPILLWAY_METADATA_URL`` points the boot script
and the agent at it).

AWS: ``PUT /latest/api/token`` (needs ``X-aws-ec2-metadata-token-ttl-seconds``) issues a
token; every ``GET /latest/...`` needs it in ``X-aws-ec2-metadata-token`` (401 otherwise, as
IMDSv2 with ``HttpTokens: required``). ``/latest/meta-data/spot/instance-action`` is 404 until
:meth:`MetadataServer.interrupt` is called. GCP: ``GET /computeMetadata/v1/...`` needs
``Metadata-Flavor: Google`` (403 otherwise); ``instance/preempted`` is ``FALSE`` until
:meth:`MetadataServer.interrupt`.
"""

from __future__ import annotations

import collections
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from broker.control.embedded import free_port


class MetadataServer:
    """One machine's metadata: its instance id, zone, type, and an interruption switch."""

    def __init__(self, instance_id: str = "i-0123456789abcdef0", zone: str = "us-east-1a",
                 instance_type: str = "g5.xlarge") -> None:
        self.instance_id, self.zone, self.instance_type = instance_id, zone, instance_type
        self.action: str | None = None  # AWS: terminate, stop or hibernate
        self.at = 0.0
        self.tokens: set[str] = set()
        self.hits: collections.Counter[str] = collections.Counter()  # path -> requests
        self.refused: collections.Counter[str] = collections.Counter()  # path -> 401/403s
        self.port = free_port()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def interrupt(self, action: str = "terminate", in_s: float = 120.0) -> None:
        """From now on, both clouds' endpoints say this machine is being taken back."""
        self.action, self.at = action, time.time() + in_s

    def expire_tokens(self) -> None:
        self.tokens.clear()

    def _aws_get(self, path: str) -> tuple[int, str]:
        meta = {"/latest/meta-data/instance-id": self.instance_id,
                "/latest/meta-data/instance-type": self.instance_type,
                "/latest/meta-data/placement/availability-zone": self.zone}
        if path in meta:
            return 200, meta[path]
        if path == "/latest/meta-data/spot/instance-action" and self.action:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at))
            return 200, json.dumps({"action": self.action, "time": when})
        return 404, "Not Found"

    def _gcp_get(self, path: str) -> tuple[int, str]:
        base = "/computeMetadata/v1/instance/"
        meta = {"name": self.instance_id, "preempted": "TRUE" if self.action else "FALSE",
                "zone": f"projects/0/zones/{self.zone}",
                "machine-type": f"projects/0/machineTypes/{self.instance_type}"}
        key = path.removeprefix(base)
        return (200, meta[key]) if path.startswith(base) and key in meta else (404, "")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                return None

            def _answer(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                server.hits[self.path] += 1
                if self.path != "/latest/api/token" or \
                        not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    server.refused[self.path] += 1
                    self._answer(400, "Bad Request")
                    return
                token = uuid.uuid4().hex
                server.tokens.add(token)
                self._answer(200, token)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                server.hits[path] += 1
                if path.startswith("/latest/"):
                    if self.headers.get("X-aws-ec2-metadata-token") not in server.tokens:
                        server.refused[path] += 1
                        self._answer(401, "Unauthorized")
                        return
                    self._answer(*server._aws_get(path))
                elif path.startswith("/computeMetadata/"):
                    if self.headers.get("Metadata-Flavor") != "Google":
                        server.refused[path] += 1
                        self._answer(403, "Missing Metadata-Flavor:Google header")
                        return
                    self._answer(*server._gcp_get(path))
                else:
                    self._answer(404, "Not Found")

        return Handler

    def start(self) -> MetadataServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
