"""Issue 36, seen from outside: the real leader loop on a real Redis database schedules a
CPU-only job; a policy failing on one job sets it aside where ``spillway status``,
``spillway explain`` and /metrics show it; a policy failing for every job fails the cycles,
which are counted, recorded and shown (status, and explain instead of "is the scheduler
running?")."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import policies.order.orderings
from broker.bus.runtime import Runtime
from broker.config.core import Config
from broker.control.leader import Leader
from broker.cycle.plan import Plan, SetAside
from broker.metrics import scheduler as metrics
from broker.metrics.scheduler import SchedulerMetrics
from broker.model import Gpu, Job, JobSpec, Node, Reason
from broker.model.state import JobState
from broker.store.memory import MemoryStore
from policies import registry
from tests.conftest import cli_env, run_cli, with_db

DB = 8  # shared with test_metrics.py: each test flushes it before and after


@pytest.fixture
def rt(redis_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Runtime]:
    cli_env(monkeypatch, tmp_path)
    url = with_db(redis_url, DB)
    raw = redis.Redis.from_url(url)
    raw.flushdb()
    runtime = Runtime(Config(cycle_s=0.1, reconcile_s=0.5, lease_ttl_s=30.0), url)
    monkeypatch.setattr(metrics, "_scheduler", SchedulerMetrics(runtime.config.classes))
    try:
        yield runtime
    finally:
        raw.flushdb()
        raw.close()


def wait_for(pred: Callable[[], object], timeout: float = 20.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def sample(name: str, **labels: str) -> float | None:
    value = metrics.scheduler_metrics().registry.get_sample_value(name, labels)
    return None if value is None else float(value)


@pytest.fixture
def leading(rt: Runtime) -> Iterator[Callable[[], None]]:
    """Start the real leader loop (a thread of this process) when called; stop it after."""
    leader = Leader(rt, owner="test-health", reachable_since=time.time() - 100)
    thread = threading.Thread(target=leader.run, daemon=True)

    def start() -> None:
        thread.start()
    yield start
    leader.stop.set()
    if thread.is_alive():
        thread.join(10)


def _node(rt: Runtime) -> None:
    gpus = tuple(Gpu(f"g{i}", i, "A100-80GB", 80.0) for i in range(2))
    rt.store.heartbeat(Node("n1", gpus, cpus=16, memory_gb=64), 60.0, time.time())


def _submit(rt: Runtime, name: str, gpus: int, **kw: Any) -> Job:
    return rt.store.submit(JobSpec(command=["true"], name=name, gpus=gpus, **kw), time.time())


def _state(rt: Runtime, job: Job) -> JobState:
    return rt.store.get(job.id).state


def test_a_cpu_only_job_starts_and_no_cycle_fails(rt: Runtime,
                                                  leading: Callable[[], None]) -> None:
    """The issue: a --gpus 0 job made every cycle raise ZeroDivisionError (spillway's order)."""
    _node(rt)
    cpu = _submit(rt, "cpu", 0, cpus=2.0, memory_gb=4.0)
    gpu = _submit(rt, "gpu", 1)
    leading()
    wait_for(lambda: _state(rt, cpu) is not JobState.PENDING
             and _state(rt, gpu) is not JobState.PENDING, what="both to start")
    placed = rt.store.get(cpu.id).allocations
    assert [(a.node_id, a.gpu_ids) for a in placed] == [("n1", ())]
    assert sample("spillway_cycle_failures_total") == 0
    assert sample("spillway_set_aside_jobs") == 0
    code, out, _ = run_cli(rt.redis_url, "status", "--json")
    assert code == 0 and json.loads(out)["cycles"]["failed"] == 0


def test_a_job_a_policy_fails_on_is_set_aside_and_shown(
        rt: Runtime, leading: Callable[[], None], monkeypatch: pytest.MonkeyPatch) -> None:
    size = policies.order.orderings.order_size

    def broken(job: Job) -> int:
        if job.spec.name == "odd":
            raise ArithmeticError("no size for odd")
        return size(job)
    monkeypatch.setattr(policies.order.orderings, "order_size", broken)
    _node(rt)
    odd, ok = _submit(rt, "odd", 1), _submit(rt, "ok", 1)
    leading()
    wait_for(lambda: _state(rt, ok) is not JobState.PENDING, what="the other job to start")
    wait_for(lambda: (rt.store.explain(odd.id) or Reason("", "")).code == "PolicyError",
             what="the reason")
    assert _state(rt, odd) is JobState.PENDING
    # (the store has the reason a moment before the leader's metrics see the cycle's plan)
    wait_for(lambda: sample("spillway_set_aside_jobs") == 1, what="the set-aside gauge")
    assert (sample("spillway_jobs_set_aside_total", role="order", policy="spillway") or 0) >= 1
    assert sample("spillway_cycle_failures_total") == 0

    code, out, _ = run_cli(rt.redis_url, "explain", odd.id)
    assert code == 0 and "PolicyError" in out, out
    assert "the order policy 'spillway' failed on this job (ArithmeticError: no size for " \
           "odd at" in " ".join(out.split()), out
    assert "running?" not in out
    code, out, _ = run_cli(rt.redis_url, "status", "--json")
    assert code == 0
    data = json.loads(out)
    assert [a["job"] for a in data["set_aside"]] == [odd.id]
    assert "ArithmeticError" in data["set_aside"][0]["message"]
    code, out, _ = run_cli(rt.redis_url, "status")
    assert code == 0 and f"Set aside  1 job(s) a policy failed on: {odd.id}" in out


def test_cycles_that_fail_are_counted_recorded_and_shown(
        rt: Runtime, leading: Callable[[], None], monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy failing whatever it is given (a broken setting, say): the cycle fails as a
    whole; the leader counts it, records it, and status and explain say so."""
    def broken(cycle: object, jobs: object) -> list[Job]:
        raise RuntimeError("fairshare_weight must be a number")
    monkeypatch.setitem(registry._REGISTRY["order"], "spillway", broken)
    registry._codes.cache_clear()
    _node(rt)
    job = _submit(rt, "waits", 1)
    leading()
    wait_for(lambda: (sample("spillway_cycle_failures_total") or 0) >= 2, what="2 failures")
    registry._codes.cache_clear()
    failures = rt.store.cycle_failures()
    assert len(failures) >= 2
    assert failures[0][1].startswith("RuntimeError: fairshare_weight must be a number at ")
    assert _state(rt, job) is JobState.PENDING

    code, out, _ = run_cli(rt.redis_url, "status", "--json")
    assert code == 0
    cycles = json.loads(out)["cycles"]
    assert cycles["failed"] >= 2 and cycles["window_s"] == 600
    assert cycles["last_failure"]["error"].startswith("RuntimeError: fairshare_weight")
    code, out, _ = run_cli(rt.redis_url, "status")
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("Cycles"))
    assert " failed in the last 10m00s, the last " in line and "RuntimeError" in line, out
    code, out, _ = run_cli(rt.redis_url, "explain", job.id)
    assert code == 0 and "CyclesFailing" in out and "fairshare_weight must be a number" in out, out
    assert "scheduler running?" not in out


def test_the_metrics_count_set_aside_jobs_by_role_and_policy() -> None:
    m = SchedulerMetrics(Config().classes)
    store = MemoryStore()
    snap = store.snapshot(1000.0)
    aside = {f"j{i}": SetAside("burst", "sla", "KeyError: 'x'", Reason("PolicyError", "..."))
             for i in range(3)}
    m.observe_cycle(snap, Plan(set_aside=aside), store.apply(Plan(), 1000.0), {})
    read = m.registry.get_sample_value
    assert read("spillway_set_aside_jobs") == 3
    assert read("spillway_jobs_set_aside_total", {"role": "burst", "policy": "sla"}) == 3
    m.observe_cycle(snap, Plan(), store.apply(Plan(), 1001.0), {})
    assert read("spillway_set_aside_jobs") == 0
    assert read("spillway_jobs_set_aside_total", {"role": "burst", "policy": "sla"}) == 3
    m.observe_cycle_failure()
    assert read("spillway_cycle_failures_total") == 1


def test_the_store_keeps_the_newest_failures() -> None:
    from broker.store import base

    store = MemoryStore()
    for i in range(base.FAILURES_KEPT + 5):
        store.record_cycle_failure(float(i), f"E{i}")
    kept = store.cycle_failures()
    assert len(kept) == base.FAILURES_KEPT and kept[0] == (float(base.FAILURES_KEPT + 4),
                                                          f"E{base.FAILURES_KEPT + 4}")
    assert store.cycle_failures(since=float(base.FAILURES_KEPT + 3)) == kept[:2]
