"""A real Spillway cluster for integration tests: one scheduler process and N worker-agent
processes with static inventories, on a real Redis database of its own.

Under pytest-xdist each worker has a Redis server of its own (tests/conftest.py), but the host
is shared: an agent that a test kills with SIGKILL needs a node id no other test uses, since its
keeper then kills every job cgroup of that node id on the host."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import redis

from broker.waiting import pid_alive, poll_until
from tests.conftest import with_db

T = TypeVar("T")

__all__ = ["FAST_TIMINGS", "Cluster", "pid_alive", "running", "wait_until", "with_db"]


def wait_until(pred: Callable[[], T], timeout: float, what: str) -> T:
    return poll_until(pred, timeout, what, error=AssertionError)


FAST_TIMINGS = {
    "SPILLWAY_HEARTBEAT_S": "0.5",
    "SPILLWAY_LEASE_TTL_S": "1.0",
    "SPILLWAY_RECONCILE_S": "0.25",
    "SPILLWAY_CYCLE_S": "0.5",
    "SPILLWAY_GRACE_S": "2",
}



class Cluster:
    def __init__(self, redis_url: str, workdir: Path) -> None:
        self.url = redis_url
        self.workdir = workdir
        self.env = {**os.environ, **FAST_TIMINGS, "SPILLWAY_REDIS_URL": redis_url,
                    "PYTHONUNBUFFERED": "1"}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.redis = redis.Redis.from_url(redis_url)
        self.redis.flushdb()
        from broker.client import Client
        from broker.store import open_store

        self.client = Client(redis_url)
        self.store = open_store(redis_url, None)

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, "-m", "broker.cli", "--redis-url", self.url,
                                 *args], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                cwd=self.workdir)
        self.procs[name] = proc
        return proc

    def start_scheduler(self) -> None:
        self._spawn("scheduler", "scheduler")

    def start_agent(self, node_id: str, gpus: str = "4xA100-80GB", cpus: int = 64) -> None:
        self._spawn(node_id, "worker", "--node-id", node_id, "--gpus", gpus, "--cpus",
                    str(cpus), "--work-dir", str(self.workdir / node_id))
        wait_until(lambda: any(n.id == node_id and n.state.value == "READY"
                               for n in self.store.nodes()),
                   30, f"agent {node_id} to register")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.procs[name].send_signal(sig)
        self.procs[name].wait(timeout=30)

    def logs_of(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.client.close()
        self.redis.flushdb()
        self.redis.close()


@contextlib.contextmanager
def running(redis_url: str, workdir: Path) -> Iterator[Cluster]:
    """A Cluster that prints each process's log tail and stops everything on the way out."""
    c = Cluster(redis_url, workdir)
    try:
        yield c
    finally:
        for name in c.procs:
            print(f"----- {name} log tail -----\n{c.logs_of(name)[-2000:]}")
        for p in c.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)  # (a test may have frozen one)
        c.stop()
