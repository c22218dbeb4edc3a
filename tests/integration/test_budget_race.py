"""Several scheduler processes race for a team's last dollars on one real Redis server.

Six jobs of team ``vision`` are about to break their SLA with no on-prem node; every burst
costs $8.40 (an on-demand $4/h machine for a 2 h limit, a 60 s boot and the 300 s idle tail)
and the hard cap is $20: room for two. Four processes (real subprocesses, no leader among
them) each read the snapshot first (so each sees the whole $20 free and plans two bursts),
then, released together, plan with the spillway policy and reserve through the actuator's
step. However their writes interleave, exactly two launches get their money and the team's
reserved dollars stay within the cap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import redis

from broker.config.core import Config
from broker.config.providers import parse_providers
from broker.model import JobSpec, Market, Offer
from broker.store import RedisStore
from broker.store.budgets import Budget, budget_book

ROOT = Path(__file__).resolve().parents[2]
OFFER = Offer("local", "home", "home-a", "t1", "A100-80GB", 1, 80.0, Market.ONDEMAND, 4.0,
              extra={"boot_s": 60.0})
NOW = 1_800_000_000.0
PROCS = 4

SCHEDULER = """
import json, sys, time
import redis
from broker.config.providers import parse_providers
from broker.config.core import Config
from broker.money.ledger import reserve_plan
from broker.cycle.scheduler import run_cycle
from broker.cycle.snapshots import SnapshotBuilder
from broker.store import RedisStore
from broker.store.budgets import budget_book
from policies.registry import PolicySet

url, prefix, idx, now = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
store = RedisStore(url, Config(providers=parse_providers({"local": {}})), prefix=prefix)
r = redis.Redis.from_url(url)
now += idx * 0.001  # (each plans its own request ids)
snap = SnapshotBuilder(store).build(now)  # all read before anyone reserves: the worst case
r.incr(prefix + "race:ready")
r.blpop([prefix + f"race:go:{idx}"], timeout=60)  # released together
plan = run_cycle(snap, PolicySet.named("spillway"), now)
kept = reserve_plan(budget_book(store), plan, now)
print(json.dumps({"planned": len(plan.launches), "kept": len(kept.launches)}))
"""


def test_schedulers_racing_for_the_last_dollar(redis_url: str, redis_client: redis.Redis,
                                               redis_prefix: str) -> None:
    store = RedisStore(redis_client, Config(providers=parse_providers({"local": {}})),
                       prefix=redis_prefix)
    store.publish_offers([OFFER], NOW)
    for _ in range(6):
        store.submit(JobSpec(command="true", gpus=1, team="vision", priority="high",
                             time_limit="2h"), NOW - 1600)  # SLA (30 min) breaks in 200 s
    book = budget_book(store)
    book.set(Budget("vision", 20.0, "total"), "test", NOW)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", SCHEDULER, redis_url, redis_prefix,
                               str(i), str(NOW)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(PROCS)]
    try:
        deadline = time.monotonic() + 60
        while int(redis_client.get(redis_prefix + "race:ready") or 0) < PROCS:
            assert time.monotonic() < deadline, "the schedulers did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.01)
        pipe = redis_client.pipeline(transaction=True)
        for i in range(PROCS):
            pipe.rpush(redis_prefix + f"race:go:{i}", 1)
        pipe.execute()
        results = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=60)
            assert p.returncode == 0, stderr
            results.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [r["planned"] for r in results] == [2] * PROCS  # each saw room for two
    assert sum(r["kept"] for r in results) == 2
    reserved = book.reserved()["vision"]
    assert abs(reserved - 2 * 8.4) < 1e-9 and reserved <= 20.0
    assert len({r.key for r in book.reservations()}) == 2
