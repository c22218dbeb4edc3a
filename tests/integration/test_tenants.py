"""Jobs are tenants (docs/security.md, "Threat model"): on real processes, with the agent as
root on a TLS Redis with ACL users, a job of team A attacks its agent and its neighbour of team
B. It tries to read the agent's environment, memory map, descriptors and credentials file, B's
environment, files and directory, to have root load a library through its spec's
``LD_PRELOAD``, to open B's (fake) GPU device, and to talk to Redis with anything it can find.
Every attempt must fail; the test fails if one succeeds.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from broker.client import Client
from broker.model.state import JobState
from tests.integration.harness import wait_until
from tests.integration.test_security import PLANTED, ROOT, Server, env_with, server

pytestmark = [pytest.mark.integration, pytest.mark.slow]
__all__ = ["server"]  # (the module's TLS redis-server with ACL users, reused)

NVIDIA_MAJOR = 195
PYTHON = "/usr/bin/python3"

ATTACK = r'''
import json, os, socket, ssl, sys
a = json.loads(sys.argv[1])
out = {}


def attempt(name, fn):
    try:
        value = fn()
        out[name] = ["GOT", repr(value)[:300]]
    except OSError as e:
        out[name] = ["DENIED", e.errno, str(e)[:200]]
    except Exception as e:  # (redis-py's errors and the like)
        out[name] = ["DENIED", type(e).__name__, str(e)[:200]]


def read(path, mode="rb"):
    with open(path, mode) as f:
        return f.read()


pid = a["agent_pid"]
attempt("agent environ", lambda: read(f"/proc/{pid}/environ"))
attempt("agent maps", lambda: read(f"/proc/{pid}/maps"))
attempt("agent mem", lambda: read(f"/proc/{pid}/mem"))
attempt("agent fds", lambda: os.listdir(f"/proc/{pid}/fd"))
attempt("agent cwd", lambda: os.listdir(f"/proc/{pid}/cwd"))
attempt("agent url file", lambda: read(a["url_file"]))
attempt("agent logs", lambda: os.listdir(a["log_dir"]))


def agent_pid_in_env():
    hits = [k for k, v in os.environ.items() if str(pid) in v.replace(":", " ").split()]
    if hits:
        return hits
    raise PermissionError(13, "the agent's pid is in no variable")


attempt("agent pid in the environment", agent_pid_in_env)


def scan_environs():
    hits = []
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != os.getpid():
            try:
                data = read(f"/proc/{p}/environ")
            except OSError:
                continue
            if any(s.encode() in data for s in a["secrets"]):
                hits.append(p)
    if hits:
        return hits
    raise PermissionError(13, "no other environment with a secret could be read")


attempt("any secret in a readable environment", scan_environs)
attempt("neighbour file", lambda: read(a["b_file"]))
attempt("neighbour dir", lambda: os.listdir(a["b_dir"]))
attempt("all jobs' dirs", lambda: os.listdir(a["jobs_dir"]))
attempt("a file in the agent's work dir", lambda: os.listdir(a["work_dir"]))
for name, path in a["devices"].items():
    try:
        os.close(os.open(path, os.O_RDWR))
        out["device " + name] = ["GOT", "opened"]
    except OSError as e:
        out["device " + name] = ["ERRNO", e.errno]


def find_urls():
    found = [k for k, v in os.environ.items() if "redis://" in v or "rediss://" in v
             or any(s in v for s in a["secrets"])]
    for root in (a["work_dir"], os.environ.get("HOME", "/"), "/etc/spillway"):
        for dirpath, _, files in os.walk(root):
            for f in files:
                try:
                    text = read(os.path.join(dirpath, f), "r")
                except (OSError, UnicodeDecodeError):
                    continue
                if "redis://" in text or "rediss://" in text:
                    found.append(os.path.join(dirpath, f))
    if found:
        return found
    raise PermissionError(13, "no Redis URL or password found")


attempt("a Redis URL anywhere", find_urls)


def resp(port, *words, tls=False):
    """One Redis command over a raw socket (a job has no redis-py): its reply's first line;
    an error reply (-NOAUTH, -NOPERM, -WRONGPASS) counts as refused."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=3)
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        raw = ctx.wrap_socket(raw)
    with raw as conn:
        msg = "*%d\r\n" % len(words) + "".join(
            "$%d\r\n%s\r\n" % (len(w), w) for w in words)
        conn.sendall(msg.encode())
        reply = conn.recv(65536).decode(errors="replace")
    if reply.startswith("-"):
        raise PermissionError(13, reply.strip())
    return reply


for port, tls in ((a["plain_port"], False), (a["tls_port"], True)):
    kind = "tls" if tls else "plain"
    attempt(f"redis {kind}: keys", lambda p=port, t=tls: resp(p, "KEYS", "*", tls=t))
    attempt(f"redis {kind}: a job's record",
            lambda p=port, t=tls: resp(p, "HGETALL", "sw:job:" + a["b_id"], tls=t))
    attempt(f"redis {kind}: B's node view",
            lambda p=port, t=tls: resp(p, "HGETALL", "sw:run:" + a["node"], tls=t))
    for user, pw in (("default", "spillway"), ("spillway-agent-" + a["node"], "spillway"),
                     ("spillway-scheduler", "")):
        attempt(f"redis {kind}: AUTH {user}",
                lambda p=port, t=tls, u=user, w=pw: resp(p, "AUTH", u, w or "x", tls=t))
print("ATTACK " + json.dumps(out), flush=True)
'''

PRELOAD_C = r'''
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "a");
    if (f) { fprintf(f, "%%d %%d %%d\n", (int)getpid(), (int)getuid(), (int)geteuid()); fclose(f); }
}
'''


def _fenceable() -> str:
    """Why real processes cannot be fenced here ("" if they can)."""
    if os.geteuid() != 0:
        return "the agent must run as root to run jobs as per-team users"
    if not os.access("/sys/fs/cgroup/devices", os.W_OK):
        return "no writable cgroup v1 devices controller"
    if shutil.which("gcc") is None:
        return "no gcc to build the planted library"
    if not os.access(PYTHON, os.X_OK):
        return f"no {PYTHON} for the attacking job"
    return ""


@pytest.fixture
def top(passable_tmp: Path) -> Path:
    return passable_tmp


def test_a_job_reaches_nothing_of_its_agent_its_neighbour_root_or_redis(
        server: Server, top: Path, tmp_path: Path) -> None:
    why = _fenceable()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    admin = server.admin
    admin.flushall()
    node = f"ten-{uuid.uuid4().hex[:6]}"
    sched_url, _ = server.user("scheduler")
    api_url, _ = server.user("api")
    agent_url, agent_pw = server.user("agent", node)
    url_file = tmp_path / "agent.url"
    url_file.write_text(agent_url + "\n")
    os.chmod(url_file, 0o600)
    # fake GPUs: character devices with NVIDIA's major (no driver: an allowed open is ENXIO)
    devdir = top / "dev"
    devdir.mkdir(mode=0o755)
    devices = {}
    for minor in (0, 1):
        path = devdir / f"nvidia{minor}"
        os.mknod(path, 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, minor))
        os.chmod(path, 0o666)
        devices[minor] = str(path)
    # a library an earlier job planted where anyone may read it
    preload_log = top / "preload"
    preload_log.mkdir(mode=0o777)
    os.chmod(preload_log, 0o777)
    lib = top / "planted.so"
    src = top / "planted.c"
    src.write_text(PRELOAD_C % (preload_log / "loads"))
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    os.chmod(lib, 0o755)
    attack = top / "attack.py"
    attack.write_text(ATTACK)
    os.chmod(attack, 0o644)

    work = top / "work"
    logs = {"scheduler": tmp_path / "scheduler.log", "agent": tmp_path / "agent.log"}
    procs: list[subprocess.Popen[bytes]] = []
    env = env_with(sched_url, tmp_path)
    agent_env = {k: v for k, v in env_with(agent_url, tmp_path).items()
                 if k != "SPILLWAY_REDIS_URL"}
    agent_env["SPILLWAY_JOB_ISOLATION"] = "true"  # (the default; the suite's own is false)
    with open(logs["scheduler"], "ab") as out:
        procs.append(subprocess.Popen([sys.executable, "-m", "broker.cli", "scheduler"],
                                      env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                      start_new_session=True))
    with open(logs["agent"], "ab") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "worker", "--redis-url-file", str(url_file),
             "--node-id", node, "--gpus", "2xA100-80GB", "--cpus", "4", "--memory", "8",
             "--work-dir", str(work)],
            env=agent_env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
            start_new_session=True)
        procs.append(agent)
    b_secret = "B-SECRET-" + uuid.uuid4().hex
    try:
        with Client(api_url) as client:
            wait_until(lambda: any(n.id == node and n.state == "READY"
                                   for n in client.nodes())
                       or agent.poll() is not None, 60, "the agent to register")
            assert agent.poll() is None, logs["agent"].read_text()
            (shown,) = [n for n in client.store.nodes() if n.id == node]
            assert shown.isolation == "uid per team"

            b = client.submit(command='echo "$B_SECRET" > secret.txt; echo ready; sleep 120',
                              gpus=1, team="b", workdir="/nonexistent-tenants",
                              env={"B_SECRET": b_secret})
            wait_until(lambda: any(x.text == "ready" for x in client.logs(b.id)), 60,
                       "B's job to run")
            b_dir = work / "jobs" / b.id
            assert (b_dir / "secret.txt").read_text().strip() == b_secret
            b_uid = (b_dir / "secret.txt").stat().st_uid
            args = {"agent_pid": agent.pid, "url_file": str(url_file),
                    "log_dir": str(work / "logs"), "work_dir": str(work),
                    "jobs_dir": str(work / "jobs"), "b_dir": str(b_dir),
                    "b_file": str(b_dir / "secret.txt"),
                    "secrets": [b_secret, agent_pw, *PLANTED.values()],
                    "devices": {str(m): p for m, p in devices.items()},
                    "plain_port": server.plain_port, "tls_port": server.tls_port,
                    "b_id": b.id, "node": node}
            # (the system's Python: the test's may live where other users cannot go)
            a = client.submit(command=[PYTHON, str(attack), json.dumps(args)], gpus=1,
                              team="a", workdir="/nonexistent-tenants")
            done = client.wait(a.id, timeout=90)
            out = [x.text for x in client.logs(a.id)]
            assert done.state is JobState.SUCCEEDED, (done.history, out)
            line = next((t for t in out if t.startswith("ATTACK ")), None)
            assert line is not None, out
            results = json.loads(line.removeprefix("ATTACK "))

            # a job of team A runs as its team's uid: not root, not the agent's, not B's
            a_dir = work / "jobs" / a.id
            a_uid = a_dir.stat().st_uid
            assert a_uid not in (0, b_uid) and b_uid != 0

            # the planted library through the spec's env: loaded, but only as the job's user
            c = client.submit(command="true", gpus=1, team="a", workdir="/nonexistent-tenants",
                              env={"LD_PRELOAD": str(lib)})
            assert client.wait(c.id, timeout=60).state is JobState.SUCCEEDED
            client.cancel(b.id)
            client.wait(b.id, timeout=60)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        print("----- agent log -----\n" + logs["agent"].read_text()[-3000:])

    print("attempts: " + json.dumps(results, indent=1))
    got = {k: v for k, v in results.items() if v[0] == "GOT"}
    assert got == {}, got  # every attack on the agent, the neighbour and Redis failed
    assert set(results) >= {"agent environ", "agent url file", "neighbour file",
                            "any secret in a readable environment", "a Redis URL anywhere",
                            "redis plain: keys", "redis tls: a job's record"}
    # its own GPU opens (no driver: ENXIO); the neighbour's is refused by the devices cgroup
    own = int(done.allocations[0].gpu_ids[0].rsplit("-", 1)[1]) if done.allocations else \
        int(done.attempts[-1].allocations[0].gpu_ids[0].rsplit("-", 1)[1])
    assert results[f"device {own}"] == ["ERRNO", errno.ENXIO], results
    assert results[f"device {1 - own}"] == ["ERRNO", errno.EPERM], results
    loads = [tuple(map(int, ln.split())) for ln in (preload_log / "loads").read_text()
             .splitlines()]
    assert loads, "the planted library never loaded (the test proves nothing)"
    assert all(uid != 0 and euid != 0 for _, uid, euid in loads), loads
    assert all(uid == a_uid for _, uid, _ in loads), (loads, a_uid)
