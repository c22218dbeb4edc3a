"""An unreachable Redis (a closed port on loopback): the services say so in one line per
attempt, give up after ``redis_retry_s`` with exit 1 and what to do, stop on SIGTERM without a
traceback; the client raises StoreUnreachable (a ConnectionError) naming the URL."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from broker.cli import app
from broker.client import Client
from broker.config.core import Config
from broker.control.embedded import free_port
from broker.errors import SpillwayError, StoreUnreachable


@pytest.fixture
def closed_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there


def _env(tmp_path: Path, retry_s: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPILLWAY_")}
    env.update(HOME=str(tmp_path), SPILLWAY_STATE_DIR=str(tmp_path / "state"),
               SPILLWAY_METRICS_PORT="0", SPILLWAY_AGENT_METRICS_PORT="0",
               SPILLWAY_REDIS_RETRY_S=str(retry_s), SPILLWAY_JOB_ISOLATION="false",
               COLUMNS="200")
    return env


def _service(name: str, url: str, tmp_path: Path, retry_s: float,
             log_name: str = "stderr") -> subprocess.Popen[bytes]:
    args = {"scheduler": ["scheduler"],
            "worker": ["worker", "--gpus", "1xA100-80GB", "--node-id", "u1", "--cpus", "2",
                       "--memory", "4", "--work-dir", str(tmp_path / "work")]}[name]
    log = (tmp_path / log_name).open("wb")
    return subprocess.Popen([sys.executable, "-m", "broker.cli", "--redis-url", url, *args],
                            env=_env(tmp_path, retry_s), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _finish(proc: subprocess.Popen[bytes], deadline_s: float) -> int:
    try:
        return proc.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"still running after {deadline_s}s") from None


@pytest.mark.parametrize("service", ["scheduler", "worker"])
def test_service_gives_up_after_redis_retry_s(service: str, closed_url: str,
                                              tmp_path: Path) -> None:
    started = time.monotonic()
    proc = _service(service, closed_url, tmp_path, retry_s=2)
    assert _finish(proc, 40) == 1
    assert time.monotonic() - started < 30
    out = (tmp_path / "stderr").read_text()
    attempts = [line for line in out.splitlines() if "cannot reach Redis at" in line]
    assert len(attempts) >= 3, out  # one line per attempt, and the last one
    assert all(closed_url in line for line in attempts), out
    assert "retrying in" in attempts[0] and "giving up in" in attempts[0], out
    last = attempts[-1]
    assert "ERROR" in last and f"The {service} exits" in last and "redis_retry_s" in last, out
    assert "--redis-url" in last and "SPILLWAY_REDIS_URL" in last, out
    assert "Traceback" not in out, out


@pytest.mark.parametrize("service", ["scheduler", "worker"])
def test_sigterm_while_waiting_for_redis_stops_cleanly(service: str, closed_url: str,
                                                      tmp_path: Path) -> None:
    proc = _service(service, closed_url, tmp_path, retry_s=60)
    deadline = time.monotonic() + 30
    while "cannot reach Redis" not in (tmp_path / "stderr").read_text():
        assert proc.poll() is None, (tmp_path / "stderr").read_text()
        assert time.monotonic() < deadline, (tmp_path / "stderr").read_text()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert _finish(proc, 15) == 0
    out = (tmp_path / "stderr").read_text()
    assert "Traceback" not in out and "ERROR" not in out, out


def test_client_raises_its_own_connection_error(closed_url: str) -> None:
    client = Client(closed_url.replace("redis://", "redis://:s3cret@"), Config())
    with pytest.raises(StoreUnreachable) as caught:
        client.get("j-1")
    e = caught.value
    assert isinstance(e, ConnectionError) and isinstance(e, SpillwayError)
    assert not isinstance(e, redis.exceptions.ConnectionError)
    text = str(e)
    assert closed_url.replace("redis://", "redis://:***@") in text and "s3cret" not in text
    assert "spillway up" in text and "SPILLWAY_REDIS_URL" in text
    with pytest.raises(StoreUnreachable):
        client.submit(command="true", gpus=0)
    with pytest.raises(StoreUnreachable):
        list(client.list())
    client.close()


def test_cli_says_where_redis_was_looked_for(closed_url: str) -> None:
    result = CliRunner().invoke(app, ["--redis-url", closed_url, "queue"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert f"cannot reach Redis at {closed_url}" in result.output
    assert "Traceback" not in result.output


def _wait_for(path: Path, text: str, procs: list[subprocess.Popen[bytes]], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while text not in (path.read_text() if path.exists() else ""):
        assert all(p.poll() is None for p in procs), path.read_text()
        assert time.monotonic() < deadline, f"no {text!r} in {path.name}:\n{path.read_text()}"
        time.sleep(0.05)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_an_outage_mid_run_is_a_line_now_and_then_and_sigterm_stops_cleanly(
        tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen([str(shutil.which("redis-server")), "--port", str(port), "--bind",
                               "127.0.0.1", "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs = [_service("scheduler", url, tmp_path, 10, "scheduler.log"),
                 _service("worker", url, tmp_path, 10, "worker.log")]
        _wait_for(tmp_path / "scheduler.log", "leading the schedulers", procs, 30)
        _wait_for(tmp_path / "worker.log", "registered", procs, 30)
        server.kill()
        server.wait(10)
        _wait_for(tmp_path / "scheduler.log", "does not answer", procs, 15)
        _wait_for(tmp_path / "worker.log", "heartbeat failed", procs, 15)
        time.sleep(3.0)  # a few seconds of outage: a line every 5 s, not every retry
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert [_finish(p, 30) for p in procs] == [0, 0]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if server.poll() is None:
            server.kill()
            server.wait(10)
    scheduler = (tmp_path / "scheduler.log").read_text()
    worker = (tmp_path / "worker.log").read_text()
    assert "Traceback" not in scheduler + worker, scheduler + worker
    assert "CPendingDeprecationWarning" not in worker, worker
    assert 1 <= scheduler.count("does not answer") <= 3, scheduler
