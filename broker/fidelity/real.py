"""The real run: a real Redis, the scheduler service, one worker agent per node of the cluster
(static inventories), a submitter process, and jobs that are real processes.

Each job runs ``/bin/sh job.sh WORK CHECKPOINT ID``: it sleeps the work it has left (read from
its checkpoint directory), and on SIGTERM writes the work done there, takes CHECKPOINT seconds
"to checkpoint" and exits 0, so an evicted job resumes where it stopped, as the simulator's
jobs do. While it runs, :class:`Watch` samples the load: the cycle's time by phase, the
agents' heartbeat ages, Redis's memory and every service's CPU time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import yaml

from broker.errors import ConfigError, SpillwayError
from broker.fidelity.cloud import CLUSTER_NAME, job_sites, local_providers, stop_machines
from broker.fidelity.scale import inventory_text, real_config
from broker.model import Instance, Job
from broker.model.state import JobState
from broker.sim.cluster import Cluster
from broker.sim.types import Trace, TraceJob
from broker.store.redis import RedisStore
from broker.waiting import poll_until

JOB_SH = """\
# a fidelity job: sleeps the work it has left; on SIGTERM saves the work done and exits 0
work=$1; ckpt=$2; f="$SPILLWAY_CHECKPOINT_DIR/done"; done=0
[ -f "$f" ] && done=$(cat "$f")
t0=$(date +%s.%N)
trap 'now=$(date +%s.%N); awk "BEGIN{print $done + $now - $t0}" > "$f"; sleep $ckpt; exit 0' TERM
left=$(awk "BEGIN{l = $work - $done; print (l > 0 ? l : 0)}")
sleep "$left" & wait $!
"""
STATS = "sw:cycle:stats"


class RealRunError(SpillwayError):
    """The real system could not be started or did not keep up; the message says why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RealResult:
    jobs: dict[str, Job]  # trace id -> its job as the store has it at the end
    t0: float  # epoch seconds of arrival 0
    stopped_at: float  # epoch seconds when the run was stopped
    all_started: bool
    submit_lag_s: list[float]
    load: dict[str, Any] = field(default_factory=dict)
    instances: list[Instance] = field(default_factory=list)  # every cloud launch, ended too
    registered: dict[str, float] = field(default_factory=dict)  # cloud node -> first heartbeat


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a live process (from /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RealRun:
    """Starts and stops everything; :meth:`run` replays a (scaled) trace on it."""

    def __init__(self, cluster: Cluster, trace: Trace, policy: str, workdir: Path,
                 checkpoint_s: float, say: Callable[[str], None] = lambda _: None) -> None:
        self.cluster, self.trace, self.policy = cluster, trace, policy
        self.workdir, self.checkpoint_s, self.say = workdir, checkpoint_s, say
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.url = ""
        self.env: dict[str, str] = {}
        self.providers: dict[str, dict[str, Any]] = {}  # cloud sites as local providers

    # -- processes ---------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        with log:
            proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=self.workdir, start_new_session=True)
        self.procs[name] = proc
        return proc

    def _cli(self, name: str, *args: str) -> None:
        self._spawn(name, [sys.executable, "-m", "broker.cli", "--redis-url", self.url, *args])

    def start(self) -> None:
        server = shutil.which("redis-server")
        if server is None:
            raise RealRunError("redis-server is not on PATH: the fidelity run needs a real "
                               "Redis (apt-get install redis-server), then run again")
        self.workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.url = f"redis://127.0.0.1:{port}/0"
        config = self.workdir / "config.yaml"
        doc = real_config(self.cluster, self.policy)
        if self.cluster.cloud is not None:
            self.providers = local_providers(self.cluster.cloud, self.workdir / "cloud")
            doc.update(providers=self.providers, cluster_name=CLUSTER_NAME)
        config.write_text(yaml.safe_dump(doc))
        self.env = {**os.environ, "SPILLWAY_CONFIG": str(config), "PYTHONUNBUFFERED": "1",
                    "SPILLWAY_REDIS_URL": self.url}
        self._spawn("redis", [server, "--port", str(port), "--bind", "127.0.0.1", "--save",
                              "", "--appendonly", "no", "--dir", str(self.workdir)])
        raw = redis.Redis.from_url(self.url)
        poll_until(lambda: _pings(raw), 30, f"redis-server on port {port} to answer",
                   error=RealRunError)
        raw.close()
        self._cli("scheduler", "scheduler")
        for node in self.cluster.nodes:
            self._cli(node.id, "worker", "--node-id", node.id, "--gpus", inventory_text(node),
                      "--cpus", f"{node.cpus:g}", "--memory", f"{node.memory_gb:g}",
                      "--work-dir", str(self.workdir / "nodes" / node.id))
        store = RedisStore(self.url)
        want = {n.id for n in self.cluster.nodes}
        try:
            poll_until(lambda: self._registered(store, want), 300,
                       f"{len(want)} agents to register", every=0.5, error=RealRunError)
        finally:
            store.close()

    def _registered(self, store: RedisStore, want: set[str]) -> bool:
        dead = [n for n, p in self.procs.items() if p.poll() is not None]
        if dead:
            tail = (self.workdir / f"{dead[0]}.log").read_text(errors="replace")[-800:]
            raise RealRunError(f"process {dead[0]} exited at start-up; its log ends:\n{tail}")
        return want <= {n.id for n in store.nodes() if n.state.value == "READY"}

    def stop(self) -> None:
        """SIGTERM the services (the agents stop their jobs), then Redis; SIGKILL whatever
        has not exited 30 s later."""
        services = [p for n, p in self.procs.items() if n != "redis"]
        redis_proc = self.procs.get("redis")
        for group in (services, [redis_proc] if redis_proc is not None else []):
            for proc in group:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            for proc in group:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            if group is services and self.providers:
                stop_machines(self.providers)  # (what the provisioner had not given back)

    # -- the run -----------------------------------------------------------------------

    def spec(self, tj: TraceJob) -> dict[str, Any]:
        ckpt = self.workdir / "ckpt" / tj.id
        ckpt.mkdir(parents=True, exist_ok=True)
        return {"command": ["/bin/sh", str(self.workdir / "job.sh"), f"{tj.duration_s:.6f}",
                            f"{self.checkpoint_s:.6f}", tj.id],
                "name": tj.name, "gpus": tj.gpus, "nodes": tj.nodes,
                "gpu_types": [tj.gpu_type] if tj.gpu_type else [], "cpus": 0.0,
                "priority": tj.priority, "team": tj.team, "time_limit": tj.time_limit_s,
                "checkpoint_dir": str(ckpt), "sites": job_sites(self.cluster, tj.priority)}

    def run(self, jobs: list[TraceJob], give_up_at_s: float, at_least_s: float = 0.0,
            tick: Callable[[float, int, int], None] = lambda *_: None) -> RealResult:
        """Submit ``jobs`` at their arrival times; return once every one has run and
        ``at_least_s`` seconds after arrival 0 have passed, or once ``give_up_at_s`` have
        (the rest never started)."""
        (self.workdir / "job.sh").write_text(JOB_SH)
        plan_jobs = [[tj.id, tj.submit_s, self.spec(tj)] for tj in jobs]
        t0 = time.time() + 1.0
        plan = self.workdir / "plan.json"
        plan.write_text(json.dumps({"redis_url": self.url, "t0": t0, "jobs": plan_jobs}))
        out = self.workdir / "submitted.json"
        self._spawn("submitter", [sys.executable, "-m", "broker.fidelity.submitter",
                                  str(plan), str(out)])
        watch = Watch(self.url, self.procs, self.cluster)
        store = RedisStore(self.url)
        ids: dict[str, str] = {}
        waiting: set[str] = set()
        submitted: dict[str, Any] = {}
        next_check = 0.0
        try:
            while True:
                now = time.time()
                watch.sample(now)
                if not submitted and out.exists():
                    submitted = json.loads(out.read_text())
                    ids = {t: v[0] for t, v in submitted["ids"].items()}
                    waiting = set(ids.values())
                elif not out.exists() and self.procs["submitter"].poll() not in (None, 0):
                    raise RealRunError("the submitter failed; its log: "
                                       f"{self.workdir / 'submitter.log'}")
                if submitted and now >= next_check:  # (a read a job: once a second)
                    next_check = now + 1.0
                    waiting = {j for j in waiting if not _ran(store.get(j))}
                    if not waiting and now - t0 >= at_least_s:
                        break
                tick(now - t0, len(ids) - len(waiting), len(jobs))
                if now - t0 > give_up_at_s:
                    break
                time.sleep(max(0.05, min(1.0, 0.2 - (time.time() - now))))  # sampling
            stopped = time.time()
            load = watch.summary(stopped)
            got = {t: store.get(j) for t, j in ids.items()}
            instances = store.instances() if self.providers else []
        finally:
            store.close()
            watch.close()
        return RealResult(got, t0, stopped, not waiting and bool(submitted),
                          submitted.get("lag_s", []), load, instances, dict(watch.registered))


def _ran(job: Job) -> bool:
    return any(h.state is JobState.RUNNING for h in job.history)


def _pings(raw: redis.Redis) -> bool:
    try:
        return bool(raw.ping())
    except redis.RedisError:
        return False


def _text(key: bytes | str) -> str:
    return key.decode() if isinstance(key, bytes) else key


def _dist(xs: list[float], digits: int = 4) -> dict[str, float | None]:
    """Count, p50, p95, p99 and max of ``xs`` (None for no values)."""
    from broker.sim.metrics import percentile

    s = sorted(xs)
    out: dict[str, float | None] = {"n": len(s)}
    for p in (50, 95, 99):
        v = percentile(s, p)
        out[f"p{p}"] = None if v is None else round(v, digits)
    out["max"] = round(s[-1], digits) if s else None
    return out


class Watch:
    """Samples the load of a running real system (a few times a second)."""

    def __init__(self, url: str, procs: dict[str, subprocess.Popen[bytes]],
                 cluster: Cluster) -> None:
        self.raw = redis.Redis.from_url(url)
        self.procs, self.cluster = procs, cluster
        self.store = RedisStore(url)
        self.cycles: dict[str, dict[str, float]] = {}  # by "at": each cycle seen once
        self.ages: list[float] = []
        self.registered: dict[str, float] = {}  # cloud node -> its first heartbeat
        self.memory: list[int] = []
        self.cpu0 = {n: _cpu_s(p.pid) for n, p in procs.items()}
        self.t0 = time.time()
        self.load0 = os.getloadavg()
        self._next_slow = 0.0

    def sample(self, now: float) -> None:
        with contextlib.suppress(redis.RedisError):
            s = {_text(k): float(v) for k, v in self.raw.hgetall(STATS).items()}
            if "at" in s:
                self.cycles[f"{s['at']:.6f}"] = s
            if now >= self._next_slow:  # heartbeats and memory: once a second
                self._next_slow = now + 1.0
                ttl = self.store.config.lease_ttl_s
                nodes = self.store.nodes()
                self.ages += [max(0.0, now - (n.lease_expires - ttl)) for n in nodes
                              if n.state.value != "DOWN"]  # (a machine given back: gone)
                for n in nodes:
                    if n.site != "onprem" and n.lease_expires > 0:
                        beat = n.lease_expires - ttl
                        self.registered[n.id] = min(self.registered.get(n.id, beat), beat)
                self.memory.append(int(self.raw.info("memory")["used_memory"]))

    def summary(self, now: float) -> dict[str, Any]:
        wall = now - self.t0
        cpu: dict[str, Any] = {}
        agents: list[float] = []
        each: dict[str, float | None] = {}
        for name, proc in self.procs.items():
            c0, c1 = self.cpu0.get(name), _cpu_s(proc.pid)
            if c1 is None:
                continue
            share = round((c1 - (c0 or 0.0)) / wall, 4) if wall > 0 else None
            if name in {n.id for n in self.cluster.nodes}:
                agents.append(share or 0.0)
                each[name] = share
            else:
                cpu[name] = share
        cpu["agents_mean"] = round(sum(agents) / len(agents), 4) if agents else None
        cpu["agents_max"] = max(agents) if agents else None
        cpu["agents_total"] = round(sum(agents), 4)
        cpu["agents"] = each
        cycles = list(self.cycles.values())
        hb = self.store.config.heartbeat_s
        return {
            "wall_s": round(wall, 2),
            "machine_load_1m": {"start": round(self.load0[0], 2),
                                "end": round(os.getloadavg()[0], 2)},
            "cpus": os.cpu_count(),
            "redis_used_memory_mb": {"max": round(max(self.memory, default=0) / 2**20, 2),
                                     "end": round(self.memory[-1] / 2**20, 2)
                                     if self.memory else None},
            "cycle_ms": {"cycles_sampled": len(cycles), **{
                phase: _dist([c[f"{phase}_ms"] for c in cycles if f"{phase}_ms" in c], 2)
                for phase in ("snapshot", "plan", "apply")}},
            "heartbeat_age_s": {"heartbeat_s": hb, **_dist(self.ages, 3)},
            "heartbeat_lag_s": _dist([max(0.0, a - hb) for a in self.ages], 3),
            "cpu_share": cpu,  # CPU seconds per wall second of each process (1.0 = one core)
        }

    def close(self) -> None:
        self.raw.close()
        self.store.close()


def refuse_custom(policy: str, cluster: Cluster) -> None:
    if policy in cluster.policies:
        raise ConfigError(f"--policy {policy}: a bundle the cluster file builds; the fidelity "
                          "run supports the built-in bundles only (spillway, slurm-like, fcfs)")
