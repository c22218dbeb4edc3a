"""A small fake of the Compute Engine REST API (v1), served over HTTP from a thread.

Google ships no Compute Engine emulator (the Cloud SDK has emulators for Pub/Sub, Datastore,
Firestore, Bigtable and Spanner only), and google-cloud-compute ships no test double. This
fake models only the calls Spillway makes, with the JSON shapes of the REST reference
(cloud.google.com/compute/docs/reference/rest/v1):

- ``POST   /compute/v1/projects/P/zones/Z/instances[?requestId=UUID]``: insert; answers a zone
  Operation. A repeated ``requestId`` answers the first insert's operation; a taken name
  answers 409 ``alreadyExists``.
- ``GET    .../zones/Z/instances/NAME``: get; 404 ``notFound``.
- ``DELETE .../zones/Z/instances/NAME``: delete; answers an Operation; 404 when missing.
- ``GET    /compute/v1/projects/P/aggregated/instances?filter=&maxResults=&pageToken=``.
- ``GET    .../zones/Z/operations/OP`` and ``POST .../operations/OP/wait``.

Operations start PENDING and move one step (PENDING, RUNNING, DONE) each time they are read or
waited on, or all at once after ``op_seconds``; so a client must wait for them, as on Google's
endpoint (whose ``wait`` also returns before DONE at times). An inserted instance is
PROVISIONING, STAGING while its operation runs, RUNNING when it is DONE; a deleted one is
STOPPING, then gone. Listeners hear when an instance starts RUNNING and when it goes away
(the boot shim in tests/fakes/boot.py runs its startup-script then), and
:meth:`FakeCompute.preempt` takes a SPOT instance back.

Checks a real endpoint makes and this one copies: instance names and label keys/values must
match Compute's patterns, ``requestId`` must be a UUID, an A2/A3/A4/G2 machine type takes no
``guestAccelerators``, a machine with GPUs must have ``onHostMaintenance: TERMINATE``, a SPOT
machine must not restart automatically. Faults (switches on :class:`FakeCompute`): a stockout
per zone (the insert's operation ends with ``ZONE_RESOURCE_POOL_EXHAUSTED``, HTTP 503), a quota
(``QUOTA_EXCEEDED`` in the operation, with ``quotaInfo``, or HTTP 403 ``quotaExceeded`` on the
call), and any HTTP error for the next N calls (429 ``rateLimitExceeded``, 503 ``backendError``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.fakes.gce_rules import check_instance, match_filter, quota_error, stockout_error

BASE = "https://www.googleapis.com/compute/v1"
_ZONE_PATH = re.compile(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/(instances|operations)"
                        r"(?:/([^/]+))?(/wait)?$")
_AGG_PATH = re.compile(r"/compute/v1/projects/([^/]+)/aggregated/instances$")
Listener = Callable[[dict[str, Any]], None]


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": self.message, "errors": [
            {"message": self.message, "domain": "global", "reason": self.reason}]}}


@dataclass
class _Op:
    body: dict[str, Any]
    steps_left: int
    due: float  # monotonic time at which it is DONE however often it was read
    finish: Callable[[], dict[str, Any] | None]  # applies the effect; an error body or None


@dataclass
class _Fault:
    status: int
    reason: str
    message: str
    left: int
    method: str  # "" any, or GET/POST/DELETE
    after: int  # matching calls to let through first


@dataclass
class FakeCompute:
    """The fake's state and switches. ``start()`` serves it; ``url`` is its endpoint."""

    op_steps: int = 2  # reads of an operation before it is DONE
    op_seconds: float = 3.0  # ... or this long after it began, whichever comes first
    page_size: int = 500  # aggregatedList's page when the call sets no maxResults
    instances: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    stockout_zones: set[str] = field(default_factory=set)
    quota: dict[str, Any] | None = None  # {"metric":..., "limit":..., "region":..., "sync":bool}
    calls: list[tuple[str, str]] = field(default_factory=list)  # (method, path) of each call
    inserts: list[dict[str, Any]] = field(default_factory=list)  # every insert body accepted
    bugs: list[str] = field(default_factory=list)  # requests the fake itself failed on
    on_running: list[Listener] = field(default_factory=list)
    on_gone: list[Listener] = field(default_factory=list)
    on_preempted: list[Listener] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._ops: dict[tuple[str, str, str], _Op] = {}
        self._by_request_id: dict[str, dict[str, Any]] = {}
        self._faults: list[_Fault] = []
        self._lock = threading.RLock()
        self._ids = itertools.count(4_100_000_000_000_000_001)
        self._server: ThreadingHTTPServer | None = None
        self._stop = threading.Event()

    # -- switches -------------------------------------------------------------------------

    def fail_next(self, status: int, reason: str, count: int = 1, method: str = "",
                  message: str = "", after: int = 0) -> None:
        """Answer ``count`` calls (of ``method``, or any), after letting ``after`` through,
        with this HTTP error."""
        text = message or {429: "Rate Limit Exceeded", 503: "Backend Error",
                           401: "Request had invalid authentication credentials.",
                           403: "Required 'compute.instances.create' permission"}.get(
                               status, reason)
        with self._lock:
            self._faults.append(_Fault(status, reason, text, count, method.upper(), after))

    def stockout(self, zone: str) -> None:
        self.stockout_zones.add(zone)

    def quota_exceeded(self, metric: str = "NVIDIA_A100_GPUS", region: str = "us-central1",
                       limit: float = 0.0, sync: bool = False) -> None:
        """Inserts fail for a quota: in the operation (``QUOTA_EXCEEDED``) or, ``sync``, at
        the call (HTTP 403 ``quotaExceeded``)."""
        self.quota = {"metric": metric, "region": region, "limit": limit, "sync": sync}

    def forget_request_ids(self) -> None:
        """Compute remembers a ``requestId`` for a while only; forget them all."""
        with self._lock:
            self._by_request_id.clear()

    def clear_faults(self) -> None:
        with self._lock:
            self.stockout_zones.clear()
            self.quota = None
            self._faults.clear()

    # -- serving --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the fake first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, body = fake.handle(self.command, self.path, raw)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        threading.Thread(target=self._tick, daemon=True).start()
        return self.url

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _tick(self) -> None:
        """Finish operations that are due even when nobody reads them."""
        while not self._stop.wait(0.05):
            with self._lock:
                for key, op in list(self._ops.items()):
                    if op.body["status"] != "DONE" and time.monotonic() >= op.due:
                        self._advance(key, op, to_done=True)

    # -- dispatch -------------------------------------------------------------------------

    def handle(self, method: str, target: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        url = urlparse(target)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        with self._lock:
            self.calls.append((method, url.path))
            try:
                self._fault(method)
                return 200, self._route(method, url.path, query, raw)
            except ApiError as e:
                return e.status, e.body()
            except Exception as e:  # a bug of the fake's: answered, and kept for the test
                self.bugs.append(f"{method} {url.path}: {type(e).__name__}: {e}")
                return 500, ApiError(500, "fakeBug", self.bugs[-1]).body()

    def _fault(self, method: str) -> None:
        for fault in self._faults:
            if fault.left > 0 and fault.method in ("", method):
                if fault.after > 0:
                    fault.after -= 1
                    continue
                fault.left -= 1
                raise ApiError(fault.status, fault.reason, fault.message)

    def _route(self, method: str, path: str, query: dict[str, str],
               raw: bytes) -> dict[str, Any]:
        m = _AGG_PATH.fullmatch(path)
        if m and method == "GET":
            return self._aggregated(m.group(1), query)
        m = _ZONE_PATH.fullmatch(path)
        if not m:
            raise ApiError(404, "notFound", f"The fake has no route for {method} {path}")
        project, zone, kind, name, _wait = m.groups()
        if kind == "operations" and name:
            return self._read_op(project, zone, name)
        if kind == "instances" and name is None and method == "POST":
            return self._insert(project, zone, json.loads(raw or b"{}"),
                                query.get("requestId", ""))
        if kind == "instances" and name and method == "GET":
            return self._get(project, zone, name)
        if kind == "instances" and name and method == "DELETE":
            return self._delete(project, zone, name)
        raise ApiError(405, "badRequest", f"The fake does not serve {method} {path}")

    # -- instances ------------------------------------------------------------------------

    def _get(self, project: str, zone: str, name: str) -> dict[str, Any]:
        inst = self.instances.get((project, zone, name))
        if inst is None:
            raise ApiError(404, "notFound", f"The resource 'projects/{project}/zones/{zone}/"
                           f"instances/{name}' was not found")
        return inst

    def _insert(self, project: str, zone: str, body: dict[str, Any],
                request_id: str) -> dict[str, Any]:
        if request_id:
            try:
                uuid.UUID(request_id)
            except ValueError:
                raise ApiError(400, "invalid", f"Invalid value for field 'requestId': "
                               f"'{request_id}'. Must be a UUID.") from None
            if request_id in self._by_request_id:
                return self._by_request_id[request_id]
        try:
            check_instance(body)
        except ValueError as e:
            raise ApiError(400, "invalid", str(e)) from None
        name = body["name"]
        key = (project, zone, name)
        if key in self.instances:
            raise ApiError(409, "alreadyExists", f"The resource 'projects/{project}/zones/"
                           f"{zone}/instances/{name}' already exists")
        if self.quota and self.quota["sync"]:
            q = self.quota
            raise ApiError(403, "quotaExceeded", f"Quota '{q['metric']}' exceeded.  Limit: "
                           f"{q['limit']:.1f} in region {q['region']}.")
        inst = self._new_instance(project, zone, body)
        self.instances[key] = inst
        self.inserts.append(body)
        op = self._new_op(project, zone, "insert", inst,
                          lambda: self._finish_insert(key, zone))
        if request_id:
            self._by_request_id[request_id] = op
        return op

    def _new_instance(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        inst = json.loads(json.dumps(body))
        n = len(self.inserts) + 2
        inst.update(kind="compute#instance", id=str(next(self._ids)), status="PROVISIONING",
                    zone=f"{BASE}/projects/{project}/zones/{zone}",
                    selfLink=f"{BASE}/projects/{project}/zones/{zone}/instances/{body['name']}",
                    creationTimestamp=datetime.now(timezone.utc).isoformat(
                        timespec="milliseconds"),
                    machineType=f"{BASE}/projects/{project}/{body['machineType']}")
        for nic in inst.get("networkInterfaces", []):
            nic.setdefault("networkIP", f"10.128.{n // 250}.{n % 250 + 2}")
        return inst

    def _finish_insert(self, key: tuple[str, str, str], zone: str) -> dict[str, Any] | None:
        inst = self.instances[key]
        if zone in self.stockout_zones:
            del self.instances[key]  # it shows for a moment, then is gone
            return stockout_error(key[0], zone)
        if self.quota:
            del self.instances[key]
            return quota_error(**{k: v for k, v in self.quota.items() if k != "sync"})
        inst["status"] = "RUNNING"
        for listener in list(self.on_running):
            listener(inst)
        return None

    def _delete(self, project: str, zone: str, name: str) -> dict[str, Any]:
        inst = self._get(project, zone, name)
        inst["status"] = "STOPPING"
        return self._new_op(project, zone, "delete", inst,
                            lambda: self._finish_delete((project, zone, name)))

    def _finish_delete(self, key: tuple[str, str, str]) -> None:
        inst = self.instances.pop(key, None)
        if inst is not None:
            for listener in list(self.on_gone):
                listener(inst)

    def _aggregated(self, project: str, query: dict[str, str]) -> dict[str, Any]:
        expr = query.get("filter", "")
        try:
            found = [i for (p, _, _), i in sorted(self.instances.items())
                     if p == project and match_filter(expr, i)]
        except ValueError as e:
            raise ApiError(400, "invalid", f"Invalid value for field 'filter': {e}") from None
        start = int(query.get("pageToken") or 0)
        size = int(query.get("maxResults") or self.page_size)
        page = found[start:start + size]
        items: dict[str, Any] = {}
        for inst in page:
            scope = "zones/" + inst["zone"].rsplit("/", 1)[-1]
            items.setdefault(scope, {"instances": []})["instances"].append(inst)
        out: dict[str, Any] = {"kind": "compute#instanceAggregatedList", "items": items,
                               "id": f"projects/{project}/aggregated/instances"}
        if start + size < len(found):
            out["nextPageToken"] = str(start + size)
        return out

    # -- operations -----------------------------------------------------------------------

    def _new_op(self, project: str, zone: str, kind: str, inst: dict[str, Any],
                finish: Callable[[], dict[str, Any] | None]) -> dict[str, Any]:
        name = f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:12]}"
        zone_url = f"{BASE}/projects/{project}/zones/{zone}"
        body = {"kind": "compute#operation", "id": str(next(self._ids)), "name": name,
                "zone": zone_url, "operationType": kind, "targetLink": inst["selfLink"],
                "targetId": inst["id"], "status": "PENDING", "user": "fake@example.com",
                "progress": 0, "insertTime": inst["creationTimestamp"],
                "selfLink": f"{zone_url}/operations/{name}"}
        self._ops[(project, zone, name)] = _Op(body, self.op_steps,
                                               time.monotonic() + self.op_seconds, finish)
        return dict(body)

    def _read_op(self, project: str, zone: str, name: str) -> dict[str, Any]:
        key = (project, zone, name)
        op = self._ops.get(key)
        if op is None:
            raise ApiError(404, "notFound", f"The resource 'projects/{project}/zones/{zone}/"
                           f"operations/{name}' was not found")
        self._advance(key, op, to_done=time.monotonic() >= op.due)
        return dict(op.body)

    def _advance(self, key: tuple[str, str, str], op: _Op, to_done: bool) -> None:
        if op.body["status"] == "DONE":
            return
        op.steps_left -= 1
        if op.steps_left > 0 and not to_done:
            op.body.update(status="RUNNING", progress=50)
            inst = self.instances.get((key[0], key[1], op.body["targetLink"].rsplit("/")[-1]))
            if inst is not None and inst["status"] == "PROVISIONING":
                inst["status"] = "STAGING"
            return
        op.body.update(status="DONE", progress=100)
        op.body.update(op.finish() or {})

    # -- for tests ------------------------------------------------------------------------

    def preempt(self, name: str) -> None:
        """Take a SPOT instance back as Compute does: listeners hear it first (its metadata
        says ``preempted``), it is STOPPING, then after ``op_seconds`` deleted, or
        TERMINATED when its ``instanceTerminationAction`` is STOP (a system operation,
        ``compute.instances.preempted``)."""
        with self._lock:
            key, inst = next((k, i) for k, i in self.instances.items() if k[2] == name)
            for listener in list(self.on_preempted):
                listener(inst)
            inst["status"] = "STOPPING"
            stop = inst.get("scheduling", {}).get("instanceTerminationAction") == "STOP"
            op = self._new_op(key[0], key[1], "compute.instances.preempted", inst,
                              (lambda: inst.update(status="TERMINATED")) if stop
                              else (lambda: self._finish_delete(key)))
            self._ops[(key[0], key[1], op["name"])].steps_left = 10**9  # time decides

    def labelled(self, key: str, value: str) -> list[dict[str, Any]]:
        with self._lock:
            return [i for i in self.instances.values() if i.get("labels", {}).get(key) == value]


@contextlib.contextmanager
def serving(**settings: Any) -> Iterator[FakeCompute]:
    fake = FakeCompute(**settings)
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()
