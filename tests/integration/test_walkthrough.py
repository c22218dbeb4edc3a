"""docs/operations.md's three-host walkthrough, run as written on one machine.

Every fenced block marked ``<!-- walkthrough HOST... -->`` runs in a bash session of its host
(exported variables and the directory carry over from block to block, as in one terminal).
Hosts are directories: absolute paths under /etc, /var and /opt are that host's
(``/opt/spillway-src`` is this checkout); ``redis-1:6379`` is a redis-server on a free port
of 127.0.0.1. What one machine cannot do is done otherwise, each rule in ``INSTEAD`` below and
each used at least once (so that a changed walkthrough fails here rather than drift):

- packages (``apt-get``) are not installed: the redis-server, openssl and sha256sum here serve;
- accounts (``useradd``, ``chown``) are not made: everything runs as the test's user;
- the virtual environment (``python3 -m venv``, ``pip install``: network) is this test's own,
  linked at the host's /opt/spillway;
- ``scp`` copies between the host directories;
- systemd: ``systemctl restart redis-server`` starts redis-server on the host's redis.conf;
  ``systemctl enable --now UNIT`` runs the unit file the walkthrough copied, as systemd would:
  its ``EnvironmentFile``, ``LoadCredential`` (a credentials directory), ``StateDirectory`` and
  ``ExecStart``; not its ``User=`` (no account) nor its sandboxing. The worker gets a static
  inventory (no NVML here) and its host's name as node id (the hostname is this machine's),
  and the test waits (polling) until its node is registered, as a person typing would;
- processes get ``SPILLWAY_METRICS_PORT=0`` and ``SPILLWAY_AGENT_METRICS_PORT=0`` (the ports
  of two hosts collide on one) and ``SPILLWAY_JOB_ISOLATION=false`` (not a test of job users).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from broker.control.embedded import free_port
from broker.waiting import poll_until
from tests.conftest import redis_server_binary

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
MARK = re.compile(r"<!-- walkthrough ([\w\s-]+?) -->\n```sh\n(.*?)```", re.DOTALL)
HOSTS = ("redis-1", "gpu-01", "gpu-02")
INVENTORY = "2xA100-80GB"


@dataclass
class Host:
    name: str
    root: Path
    env: dict[str, str]
    cwd: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


def blocks(text: str) -> list[tuple[list[str], str]]:
    """(hosts, script) of each marked block, in order."""
    return [(m.group(1).split(), m.group(2)) for m in MARK.finditer(text)]


def commands(script: str) -> list[str]:
    """The block's commands: continuation lines joined, a heredoc kept with its command."""
    out: list[str] = []
    lines = script.splitlines()
    i = 0
    while i < len(lines):
        cmd = [lines[i]]
        while cmd[-1].endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd.append(lines[i])
        here = re.search(r"<<-?'?(\w+)'?", "\n".join(cmd))
        if here:
            while i + 1 < len(lines) and lines[i] != here.group(1):
                i += 1
                cmd.append(lines[i])
        out.append("\n".join(cmd))
        i += 1
    return [c for c in out if c.strip()]


class Walk:
    """The simulated hosts, and what each rule of INSTEAD does."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.used: set[str] = set()
        self.hosts = {h: self._host(h) for h in HOSTS}

    def _host(self, name: str) -> Host:
        root = self.tmp / name
        for d in ("etc/redis", "etc/systemd/system", "var/lib", "opt", "root", "run"):
            (root / d).mkdir(parents=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("SPILLWAY_") or k == "SPILLWAY_CGROUP_PARENT"}
        env.pop("REDIS_URL", None)
        env.update(HOME=str(root / "root"), SPILLWAY_METRICS_PORT="0",
                   SPILLWAY_AGENT_METRICS_PORT="0", SPILLWAY_JOB_ISOLATION="false",
                   PYTHONUNBUFFERED="1")
        return Host(name, root, env, root / "root")

    def paths(self, host: Host, text: str) -> str:
        """The host's paths and Redis's address in ``text``."""
        text = text.replace("/opt/spillway-src", str(ROOT))
        text = re.sub(r"root@([\w-]+):(/\S*)",
                      lambda m: str(self.hosts[m.group(1)].root) + m.group(2), text)
        text = re.sub(r"(?<![\w./-])/(etc|var|opt|run)/", lambda m: f"{host.root}/{m.group(1)}/",
                      text)
        return text.replace("redis-1:6379", f"127.0.0.1:{self.port}")

    # -- the rules -------------------------------------------------------------------------

    def instead(self, host: Host, cmd: str) -> str | Callable[[], None] | None:
        """What to run in place of ``cmd``: a shell line, an action, or None (as written)."""
        first = cmd.split()[0]
        if first == "apt-get":
            return self._use("packages", ": apt-get skipped")
        if first in ("useradd", "chown"):
            return self._use("accounts", f": {first} skipped")
        if cmd.startswith("python3 -m venv "):
            self._use("venv", "")
            target = Path(self.paths(host, cmd.split()[-1]))
            return f"ln -s {shlex.quote(sys.prefix)} {shlex.quote(str(target))}"
        if re.match(r"\S*/pip install ", cmd):
            return self._use("venv", ": pip install skipped, the environment of the test serves")
        if first == "scp":
            return self._use("scp", "cp -p " + cmd.split(None, 1)[1])
        if cmd == "systemctl daemon-reload":
            return self._use("systemd", ": daemon-reload skipped")
        if cmd == "systemctl restart redis-server":
            self._use("systemd", "")
            return lambda: self.start_redis(host)
        m = re.fullmatch(r"systemctl enable --now ((?:[\w-]+ ?)+)", cmd)
        if m:
            self._use("systemd", "")
            units = m.group(1).split()

            def start() -> None:
                for unit in units:
                    self.start_unit(host, unit)

            return start
        return None

    def _use(self, rule: str, line: str) -> str:
        self.used.add(rule)
        return line

    def start_redis(self, host: Host) -> None:
        data = host.root / "var/lib/redis"
        data.mkdir(exist_ok=True)
        log = open(host.root / "run/redis.log", "ab")  # noqa: SIM115 (the child holds it)
        host.procs.append(subprocess.Popen(
            [redis_server_binary(), str(host.root / "etc/redis/redis.conf"), "--port",
             str(self.port), "--bind", "127.0.0.1", "--dir", str(data), "--daemonize", "no"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        log.close()

        def answers() -> bool:  # any reply will do (the default user is off: NOAUTH)
            assert host.procs[-1].poll() is None, self.log(host, "redis")
            client = redis.Redis(port=self.port, socket_timeout=1)
            try:
                client.ping()
            except (redis.AuthenticationError, redis.ResponseError):
                pass  # (an AuthenticationError is a ConnectionError too)
            except redis.ConnectionError:
                return False
            finally:
                client.close()
            return True

        poll_until(answers, 20, "the walkthrough's redis-server", error=AssertionError)

    def start_unit(self, host: Host, unit: str) -> None:
        """Run ``unit`` from the host's /etc/systemd/system as systemd would (but User=)."""
        keys: dict[str, list[str]] = {}
        text = (host.root / "etc/systemd/system" / f"{unit}.service").read_text()
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and not line.startswith("#"):
                keys.setdefault(key.strip(), []).append(value.strip())
        env = dict(host.env)
        for value in keys.get("EnvironmentFile", []):
            path = Path(self.paths(host, value.lstrip("-")))
            if not path.exists() and value.startswith("-"):
                continue
            for line in path.read_text().splitlines():
                k, _, v = line.partition("=")
                if k.strip() and not k.startswith("#"):
                    env[k.strip()] = self.paths(host, v.strip())
        for value in keys.get("LoadCredential", []):
            name, _, source = value.partition(":")
            creds = host.root / "run/credentials" / unit
            creds.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.paths(host, source), creds / name)
            os.chmod(creds / name, 0o600)
            env["CREDENTIALS_DIRECTORY"] = str(creds)
        for value in keys.get("StateDirectory", []):
            (host.root / "var/lib" / value).mkdir(parents=True, exist_ok=True)
        [start] = keys["ExecStart"]
        argv = [self.paths(host, a) for a in shlex.split(
            start.replace("${CREDENTIALS_DIRECTORY}", env.get("CREDENTIALS_DIRECTORY", "")))]
        if argv[1:2] == ["worker"]:  # no NVML here; the host's name as its node id
            argv += ["--gpus", INVENTORY, "--node-id", host.name]
        log = open(host.root / "run" / f"{unit}.log", "ab")  # noqa: SIM115 (the child holds it)
        host.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, cwd=host.root / "root",
                                           start_new_session=True))
        log.close()
        if argv[1:2] == ["worker"]:
            self.wait_registered(host)

    def wait_registered(self, host: Host) -> None:
        url = (self.hosts["redis-1"].root / "etc/spillway/admin.url").read_text().strip()
        client = redis.Redis.from_url(url)

        def ready() -> bool:
            assert host.procs[-1].poll() is None, self.log(host, "spillway-worker")
            return bool(client.exists(f"sw:node:{host.name}"))

        try:
            poll_until(ready, 30, f"{host.name}'s agent to register")
        finally:
            client.close()

    def log(self, host: Host, unit: str) -> str:
        with contextlib.suppress(OSError):
            return (host.root / "run" / f"{unit}.log").read_text()[-3000:]
        return ""

    # -- running ---------------------------------------------------------------------------

    def run(self, host: Host, script: str) -> str:
        """Run ``script`` (already the host's) in the host's session; its output."""
        state = self.tmp / f"{host.name}.state"
        full = (f"set -euo pipefail\ncd {shlex.quote(str(host.cwd))}\n{script}\n"
                f"pwd > {state}.pwd\nenv -0 > {state}.env\n")
        done = subprocess.run(["bash", "-c", full], env=host.env, capture_output=True,
                              text=True, timeout=120, cwd=host.cwd)
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"on {host.name}:\n{script}\n---\n{output}"
        host.cwd = Path(Path(f"{state}.pwd").read_text().strip())
        host.env = dict(kv.split("=", 1) for kv in
                        Path(f"{state}.env").read_text().split("\0") if "=" in kv)
        return output

    def block(self, host: Host, script: str) -> str:
        output: list[str] = []
        pending: list[str] = []
        for cmd in commands(script):
            done = self.instead(host, cmd)
            if callable(done):
                if pending:
                    output.append(self.run(host, "\n".join(pending)))
                    pending = []
                done()
            else:
                pending.append(self.paths(host, cmd if done is None else done))
        if pending:
            output.append(self.run(host, "\n".join(pending)))
        return "".join(output)

    def stop(self) -> None:
        procs = [p for h in reversed(list(self.hosts.values())) for p in h.procs]
        for p in procs:  # agents and schedulers first (the hosts' order, reversed), Redis last
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def walk(tmp_path: Path) -> Iterator[Walk]:
    w = Walk(tmp_path)
    try:
        yield w
    finally:
        w.stop()


def test_the_walkthrough_blocks_are_marked_and_name_known_hosts() -> None:
    found = blocks(DOC.read_text())
    assert len(found) >= 5, "the walkthrough's blocks are gone from docs/operations.md"
    assert all(set(hosts) <= set(HOSTS) for hosts, _ in found), found
    # the units it enables are the ones infra/ ships, at the path they run spillway from
    for unit in ("spillway-scheduler", "spillway-worker"):
        text = (ROOT / "infra/systemd" / f"{unit}.service").read_text()
        assert "ExecStart=/opt/spillway/bin/spillway " in text, unit


def test_the_three_host_walkthrough_runs_to_the_first_job(walk: Walk) -> None:
    outputs: dict[str, str] = {h: "" for h in HOSTS}
    for hosts, script in blocks(DOC.read_text()):
        for name in hosts:
            outputs[name] += walk.block(walk.hosts[name], script)
    assert walk.used == {"packages", "accounts", "venv", "scp", "systemd"}, walk.used
    redis_1, gpu_01, gpu_02 = (walk.hosts[h] for h in HOSTS)
    # Redis: AOF on, the users kept in the ACL file, the default user off
    assert "appendonly\nyes" in outputs["redis-1"], outputs["redis-1"]
    assert (redis_1.root / "var/lib/redis/appendonlydir").is_dir()
    acl = (redis_1.root / "etc/redis/users.acl").read_text()
    for user in ("spillway-scheduler", "spillway-api", "spillway-agent-gpu-01",
                 "spillway-agent-gpu-02"):
        assert f"user {user} on" in acl, acl
    assert "user default off" in acl, acl
    # the first job: submitted, run, SUCCEEDED; both nodes seen, one scheduler leading
    first = outputs["gpu-01"]
    m = re.search(r"^(j-[0-9a-f]+) SUCCEEDED\b", first, re.MULTILINE)
    assert m, first
    assert re.search(r"^Leader\s+\d+:", first, re.MULTILINE), first
    for node in ("gpu-01", "gpu-02"):
        assert re.search(rf"^{node}\s", first, re.MULTILINE), first
    # two schedulers run (one leads, the other waits) and both agents
    for host in (gpu_01, gpu_02):
        assert len(host.procs) == 2 and all(p.poll() is None for p in host.procs), \
            walk.log(host, "spillway-scheduler") + walk.log(host, "spillway-worker")
    # the job's log, through the operator's user
    logs = walk.block(gpu_01, f"spillway logs {m.group(1)}")
    assert "hello from " in logs and ", GPU GPU-gpu-0" in logs, logs
