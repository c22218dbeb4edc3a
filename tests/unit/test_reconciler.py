"""The reconciler judges node leases only once the store has been reachable for a lease."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from broker.bus.runtime import Runtime
from broker.config.core import Config
from broker.control.reconciler import reconcile
from broker.cycle.plan import Plan, Start
from broker.model import Allocation, Gpu, JobSpec, Node, NodeState
from broker.model.state import JobState
from tests.conftest import with_db

DB = 13
T0 = 1_000_000.0


@pytest.fixture
def rt(redis_url: str) -> Iterator[Runtime]:
    url = with_db(redis_url, DB)
    raw = redis.Redis.from_url(url)
    raw.flushdb()
    runtime = Runtime(Config(lease_ttl_s=3.0, heartbeat_s=1.0), url)
    try:
        yield runtime
    finally:
        raw.flushdb()
        raw.close()


@pytest.mark.parametrize(("reachable_for", "declared_dead"), [
    (10.0, True),  # the store has answered for longer than a lease: the silence is the node's
    (3.0, True),  # exactly a lease
    (2.9, False),  # the store came back 2.9 s ago: its agents get a whole lease to heartbeat
    (0.0, False),  # it just came back
])
def test_leases_are_judged_from_when_the_store_answers(rt: Runtime, reachable_for: float,
                                                       declared_dead: bool) -> None:
    store = rt.store
    store.heartbeat(Node("n1", (Gpu("g0", 0, "A100-80GB", 80.0),)), 3.0, T0)
    job = store.submit(JobSpec(command=["true"], gpus=1), T0)
    store.apply(Plan(starts=(Start(job.id, 1, job.version,
                                   (Allocation("n1", ("g0",), 0),)),)), T0)
    now = T0 + 60  # the lease ran out long ago, by the clock
    out = reconcile(rt, now=now, judge_from=now - reachable_for)
    node = next(n for n in store.nodes() if n.id == "n1")
    assert (node.state is NodeState.DOWN) is declared_dead
    assert out["requeued"] == int(declared_dead)
    assert store.get(job.id).state is (JobState.PENDING if declared_dead
                                       else JobState.STARTING)
