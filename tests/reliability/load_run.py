"""Load: 10,000 queued jobs and 100 agents with static inventories on one machine.

Run by hand (``python -m tests.reliability.load_run [--agents 100] [--jobs 10000]``; minutes
of CPU, gigabytes of memory): one scheduler and N agents (8 static A100s each) on a Redis
database of their own; 10,000 jobs that sleep, so most of them wait. Prints JSON: the cycle's
time by phase (the leader's statistics), Redis memory, the agents' heartbeat lag (the age of
each node's lease against its lifetime), and how long the agents took to register.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import redis

from broker.client import Client
from broker.model import JobSpec
from broker.waiting import poll_until


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/6")
    ap.add_argument("--watch-s", type=float, default=60.0)
    a = ap.parse_args()
    raw = redis.Redis.from_url(a.redis_url)
    raw.flushdb()
    tmp = tempfile.mkdtemp(prefix="spillway-load-")
    env = {**os.environ, "SPILLWAY_REDIS_URL": a.redis_url, "SPILLWAY_METRICS_PORT": "0",
           "SPILLWAY_AGENT_METRICS_PORT": "0"}
    procs = []

    def spawn(*args: str) -> None:
        log = open(os.path.join(tmp, f"p{len(procs)}.log"), "ab")  # noqa: SIM115
        procs.append(subprocess.Popen([sys.executable, "-m", "broker.cli", *args], env=env,
                                      stdout=log, stderr=subprocess.STDOUT))

    client = Client(a.redis_url)
    try:
        t0 = time.monotonic()
        spawn("scheduler")
        for i in range(a.agents):
            spawn("worker", "--node-id", f"load-{i:03d}", "--gpus", "8xA100-80GB", "--cpus",
                  "64", "--work-dir", os.path.join(tmp, f"a{i}"))
        poll_until(lambda: len(client.nodes()) == a.agents, 600, "agents to register")
        registered_s = time.monotonic() - t0
        specs = [JobSpec(command=["sleep", "3600"], gpus=1, name="load")
                 for _ in range(a.jobs)]
        for i in range(0, a.jobs, 1000):
            client.submit_many(specs[i:i + 1000])
        stats: list[dict[str, float]] = []
        lags: list[float] = []
        end = time.monotonic() + a.watch_s
        while time.monotonic() < end:
            s = {k.decode(): float(v) for k, v in raw.hgetall("sw:cycle:stats").items()
                 if k.decode().endswith("_ms") or k.decode() in ("pending", "active")}
            if s:
                stats.append(s)
            lags += [n.lease_age_s for n in client.nodes()]  # since each node's heartbeat
            time.sleep(1.0)  # sampling, not synchronisation
        mem = raw.info("memory")

        def dist(key: str) -> dict[str, float]:
            xs = sorted(s[key] for s in stats if key in s)
            return {"p50": round(statistics.median(xs), 1), "max": round(max(xs), 1)} \
                if xs else {}

        print(json.dumps({
            "agents": a.agents, "jobs": a.jobs, "agents_registered_s": round(registered_s, 1),
            "pending_at_end": stats[-1].get("pending") if stats else None,
            "active_at_end": stats[-1].get("active") if stats else None,
            "cycle_snapshot_ms": dist("snapshot_ms"), "cycle_plan_ms": dist("plan_ms"),
            "cycle_apply_ms": dist("apply_ms"),
            "redis_used_memory_mb": round(mem["used_memory"] / 2**20, 1),
            "heartbeat_lag_s": {"p50": round(statistics.median(lags), 2),
                                "p99": round(sorted(lags)[int(0.99 * (len(lags) - 1))], 2),
                                "max": round(max(lags), 2)},
        }, indent=2))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        client.close()
        raw.flushdb()


if __name__ == "__main__":
    main()
