"""/metrics (broker/metrics/: scheduler.py, agent.py, http.py) scraped over HTTP: the
scheduler's after real cycles on a real Redis database, the leader's loop, and an agent running
real job processes."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from wsgiref.simple_server import WSGIServer

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from broker.bus.runtime import Runtime
from broker.config.core import Config, load_config
from broker.control.leader import Leader
from broker.control.loop import one_cycle
from broker.cycle.plan import Plan, Start
from broker.metrics import agent as agent_series
from broker.metrics import scheduler as scheduler_series
from broker.metrics.agent import AgentMetrics
from broker.metrics.http import serve
from broker.metrics.scheduler import SchedulerMetrics, wait_buckets
from broker.model import Allocation, Gpu, JobSpec, Node
from broker.model.state import JobState
from broker.store.events import Started
from broker.store.memory import MemoryStore
from tests.conftest import with_db
from workers.agent import Agent

DB = 8  # this module's own database


Scrape = Callable[[], dict[tuple[str, tuple[tuple[str, str], ...]], float]]


def scraper(server: WSGIServer) -> Scrape:
    """GET /metrics: {(sample name, sorted labels): value}."""
    url = f"http://127.0.0.1:{server.server_port}/metrics"

    def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert resp.status == 200
            text = resp.read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}
    return scrape


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def wait_for(pred: Callable[[], object], timeout: float = 10.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def rt(redis_url: str) -> Iterator[Runtime]:
    url = with_db(redis_url, DB)
    raw = redis.Redis.from_url(url)
    raw.flushdb()
    runtime = Runtime(Config(lease_ttl_s=1.0, heartbeat_s=0.5, min_runtime_s=0.0,
                             grace_s=5.0), url)
    try:
        yield runtime
    finally:
        raw.flushdb()
        raw.close()


@pytest.fixture
def sched(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[SchedulerMetrics,
                                                                          Scrape]]:
    """This process's scheduler metrics, fresh, served on a free port."""
    m = SchedulerMetrics(rt.config.classes)
    monkeypatch.setattr(scheduler_series, "_scheduler", m)
    server = serve(m.registry, 0, "127.0.0.1")
    assert server is not None
    try:
        yield m, scraper(server)
    finally:
        server.shutdown()
        server.server_close()


def a100s(node_id: str, count: int) -> Node:
    return Node(node_id, tuple(Gpu(f"{node_id}-g{i}", i, "A100-80GB", 80.0)
                               for i in range(count)))


def test_a_cycle_fills_queue_capacity_waits_and_breaches(
        rt: Runtime, sched: tuple[SchedulerMetrics, Scrape]) -> None:
    _, scrape = sched
    now = time.time()
    store = rt.store
    store.heartbeat(a100s("n1", 2), 60.0, now)
    high = store.submit(JobSpec(command=["true"], gpus=1, priority="high", team="nlp"), now - 90)
    store.submit(JobSpec(command=["true"], gpus=1, priority="normal", team="vision"), now - 5)
    store.submit(JobSpec(command=["true"], gpus=2, priority="low", team="vision"), now - 20)
    # 4 GPUs on a 2-GPU cluster: never placed, waiting 400 s past a 300 s SLA
    crit = store.submit(JobSpec(command=["true"], gpus=4, priority="critical", team="ops"),
                        now - 400)
    applied, _ = one_cycle(rt)
    assert {j.priority for j in applied.started} == {"high", "normal"}
    s = scrape()
    assert value(s, "spillway_job_starts_total") == 2
    assert value(s, "spillway_queue_depth", **{"class": "low", "team": "vision"}) == 1
    assert value(s, "spillway_queue_depth", **{"class": "critical", "team": "ops"}) == 1
    assert value(s, "spillway_queue_depth", **{"class": "high", "team": "nlp"}) is None
    oldest = value(s, "spillway_queue_oldest_wait_seconds", **{"class": "critical",
                                                               "team": "ops"})
    assert oldest is not None and 400 <= oldest < 460
    assert value(s, "spillway_sla_breaches_total", **{"class": "critical"}) == 1
    assert value(s, "spillway_sla_breaches_total", **{"class": "low"}) == 0
    # the high job waited about 90 s: inside its 1800 s SLA bucket, outside the 60 s one
    assert value(s, "spillway_job_wait_seconds_count", **{"class": "high"}) == 1
    assert value(s, "spillway_job_wait_seconds_bucket", **{"class": "high", "le": "1800.0"}) == 1
    assert value(s, "spillway_job_wait_seconds_bucket", **{"class": "high", "le": "60.0"}) == 0
    waited = value(s, "spillway_job_wait_seconds_sum", **{"class": "high"})
    assert waited is not None and 90 <= waited < 150
    assert value(s, "spillway_gpus_capacity", site="onprem", model="A100-80GB") == 2
    assert value(s, "spillway_gpus_allocated", site="onprem", model="A100-80GB") == 2
    assert value(s, "spillway_nodes", state="READY") == 1
    for phase in ("snapshot", "plan", "apply"):
        assert value(s, "spillway_cycle_duration_seconds_count", phase=phase) == 1
    assert value(s, "spillway_leader") == 0  # no Leader loop ran here
    assert value(s, "spillway_preemptions_total", kind="priority") == 0

    # a second cycle: the breach is not counted again; the started jobs left the queue
    store.cancel(high.id, time.time())
    one_cycle(rt)
    s = scrape()
    assert value(s, "spillway_sla_breaches_total", **{"class": "critical"}) == 1
    assert value(s, "spillway_queue_depth", **{"class": "critical", "team": "ops"}) == 1
    assert value(s, "spillway_cycle_duration_seconds_count", phase="plan") == 2
    assert store.get(crit.id).state is JobState.PENDING


def test_preemptions_are_counted_by_kind(rt: Runtime,
                                         sched: tuple[SchedulerMetrics, Scrape]) -> None:
    _, scrape = sched
    now = time.time()
    store = rt.store
    store.heartbeat(a100s("n1", 2), 60.0, now)
    low = store.submit(JobSpec(command=["sleep", "100"], gpus=2, priority="normal"), now - 2000)
    start = Start(low.id, 1, low.version, (Allocation("n1", ("n1-g0", "n1-g1")),))
    assert store.apply(Plan(starts=(start,)), now - 1000).started
    store.report(low.id, 1, Started(0, 123), now - 999)
    store.submit(JobSpec(command=["true"], gpus=1, priority="critical"), now)
    applied, _ = one_cycle(rt)
    assert [j.id for j in applied.stopping] == [low.id]
    s = scrape()
    assert value(s, "spillway_preemptions_total", kind="priority") == 1
    assert value(s, "spillway_preemptions_total", kind="move") == 0
    assert value(s, "spillway_jobs_active", state="STOPPING") == 1


def test_the_leader_loop_reports_leadership_and_requeues(
        rt: Runtime, sched: tuple[SchedulerMetrics, Scrape]) -> None:
    _, scrape = sched
    now = time.time()
    store = rt.store
    store.heartbeat(a100s("dying", 1), 0.3, now)  # its lease runs out at once: no agent
    job = store.submit(JobSpec(command=["true"], gpus=1), now)
    store.apply(Plan(starts=(Start(job.id, 1, job.version,
                                   (Allocation("dying", ("dying-g0",)),)),)), now)
    leader = Leader(rt, owner="test-metrics", reachable_since=now - 100)
    thread = threading.Thread(target=leader.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: value(scrape(), "spillway_leader") == 1, what="leading")
        wait_for(lambda: value(scrape(), "spillway_reconciler_requeues_total") == 1,
                 what="the requeue")
        s = scrape()
        assert value(s, "spillway_leadership_changes_total") == 1
        assert (value(s, "spillway_cycle_duration_seconds_count", phase="apply") or 0) >= 1
    finally:
        leader.stop.set()
        thread.join(10)
    s = scrape()
    assert value(s, "spillway_leader") == 0
    assert value(s, "spillway_leadership_changes_total") == 2
    # a follower reports no queue: summing over schedulers gives the leader's
    assert not [k for k in s if k[0] == "spillway_queue_depth"]
    assert store.get(job.id).attempt == 2


def test_wait_buckets_surround_each_sla() -> None:
    buckets = wait_buckets(Config().classes)
    for c in Config().classes:
        for f in (0.1, 0.25, 0.5, 1.0, 2.0):
            assert c.sla_s * f in buckets
    assert list(buckets) == sorted(set(buckets)) and buckets[0] == 1.0


def test_ports_come_from_the_config_and_a_taken_port_is_not_fatal() -> None:
    assert (Config().metrics_port, Config().agent_metrics_port) == (9464, 9465)
    cfg = load_config(env={"SPILLWAY_METRICS_PORT": "0", "SPILLWAY_AGENT_METRICS_PORT": "9999"})
    assert (cfg.metrics_port, cfg.agent_metrics_port) == (0, 9999)
    m = AgentMetrics()
    first = serve(m.registry, 0, "127.0.0.1")
    assert first is not None
    try:
        assert serve(m.registry, first.server_port, "127.0.0.1") is None
    finally:
        first.shutdown()
        first.server_close()


# -- the agent -----------------------------------------------------------------------------


def test_agent_metrics_count_real_job_processes(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    m = AgentMetrics()
    monkeypatch.setattr(agent_series, "_agent", m)
    store = MemoryStore()
    node = Node("n1", (Gpu("GPU-a", 0, "A100-80GB", 80.0), Gpu("GPU-b", 1, "A100-80GB", 80.0)),
                incarnation="i1")
    store.heartbeat(node, 1e9, 0.0)
    agent = Agent(store, Config(grace_s=5.0, job_isolation=False), node,
                  str(tmp_path / "agent"))
    m.count_running(lambda: len(agent._local))
    server = serve(m.registry, 0, "127.0.0.1")
    assert server is not None
    scrape = scraper(server)
    try:
        m.beat(time.time() - 30)
        lag = value(scrape(), "spillway_agent_heartbeat_lag_seconds")
        assert lag is not None and 30 <= lag < 40
        agent.heartbeat()
        lag = value(scrape(), "spillway_agent_heartbeat_lag_seconds")
        assert lag is not None and lag < 5
        jobs = []
        for gpu, cmd in (("GPU-a", "exit 0"), ("GPU-b", "sleep 300")):
            job = store.submit(JobSpec(command=cmd, gpus=1), 0.0)
            st = Start(job.id, 1, job.version, (Allocation("n1", (gpu,)),))
            assert store.apply(Plan(starts=(st,)), 1.0).started
            jobs.append(job)
        agent.start_jobs([(j.id, 1) for j in jobs])
        wait_for(lambda: store.get(jobs[0].id).state is JobState.SUCCEEDED, what="the end")
        # the agent lets go of a part after its end is stored: poll, do not race it
        wait_for(lambda: value(scrape(), "spillway_agent_jobs_running") == 1,
                 what="one job running")
        s = scrape()
        assert value(s, "spillway_agent_job_starts_total") == 2
        assert value(s, "spillway_agent_job_ends_total", outcome="succeeded") == 1
        store.cancel(jobs[1].id, 2.0)
        agent.stop_job(jobs[1].id, 1, 5.0)
        wait_for(lambda: store.get(jobs[1].id).state is JobState.CANCELLED, what="the cancel")
        wait_for(lambda: value(scrape(), "spillway_agent_jobs_running") == 0,
                 what="no job running")
        s = scrape()
        assert value(s, "spillway_agent_job_ends_total", outcome="signalled") == 1
        assert value(s, "spillway_agent_job_ends_total", outcome="failed") == 0
    finally:
        agent.close()
        server.shutdown()
        server.server_close()


def test_gauges_pass_at_most_every_quarter_second_and_no_breach_is_missed() -> None:
    """In a burst cycles come every few ms: the gauges are passed over at most every
    GAUGE_EVERY_S of snapshot time, and a job that passed its SLA between two passes and
    started is counted at its start, once."""
    from broker.config.core import DEFAULT_CLASSES
    from broker.cycle.plan import Applied, Snapshot
    from broker.model import Job

    m = SchedulerMetrics(DEFAULT_CLASSES)
    sla = {c.name: c.sla_s for c in DEFAULT_CLASSES}["critical"]
    spec = JobSpec(command=["true"], gpus=1, priority="critical", team="ops")
    job = Job("j1", spec, JobState.PENDING, 1000.1 - sla)  # passes its SLA at 1000.1

    def cycle(now: float, pending: tuple[Job, ...], started: tuple[Job, ...] = ()) -> None:
        snap = Snapshot(now, pending, (), (), {}, DEFAULT_CLASSES)
        m.observe_cycle(snap, Plan(), Applied(started), {"plan": 0.001})

    def read(name: str, **labels: str) -> float | None:
        return m.registry.get_sample_value(name, {"class": "critical", **labels})

    cycle(1000.0, (job,))
    assert read("spillway_queue_depth", team="ops") == 1
    assert read("spillway_sla_breaches_total") == 0
    ran = Job("j1", spec, JobState.STARTING, job.submitted_at)
    cycle(1000.2, (job,), (ran,))  # 0.2 s on: no gauge pass; started 300.1 s after queued
    assert read("spillway_queue_depth", team="ops") == 1
    assert read("spillway_sla_breaches_total") == 1
    assert read("spillway_job_wait_seconds_count") == 1
    assert m.registry.get_sample_value("spillway_cycle_duration_seconds_count",
                                       {"phase": "plan"}) == 2
    cycle(1000.3, ())  # 0.3 s after the last pass: the queue is empty now
    assert read("spillway_queue_depth", team="ops") == 0
    assert read("spillway_sla_breaches_total") == 1
