"""Benchmarks behind ``spillway bench``: each returns a JSON-able dict.

* ``bench_cycle``: the pure scheduling cycle over a synthetic mixed queue and cluster.
* ``bench_dispatch``: real Redis, a real scheduler and real worker-agent processes running
  trivial jobs; job starts per second, submit-to-running latency, and raw Celery throughput.
"""

from __future__ import annotations

import itertools
import random
import statistics
import time
from collections import defaultdict
from typing import Any

from broker.bus import commands
from broker.config.core import DEFAULT_CLASSES
from broker.cycle.plan import Snapshot
from broker.cycle.scheduler import Memory, run_cycle
from broker.model import Allocation, Gpu, Job, JobSpec, Node
from broker.model.state import JobState
from broker.waiting import poll_until

_MODELS = ("V100-32GB", "A100-80GB", "H100-80GB")
_TYPES = ((), (), (), ("A100",), ("H100",), ("A100", "H100"), ("V100",))
_GPUS = (1, 1, 1, 1, 2, 2, 4, 8)
_CLASSES = ("critical", "high", "normal", "normal", "normal", "low", "low")


def synthetic_snapshot(pending: int, nodes: int, gpus_per_node: int, seed: int = 0,
                       busy_fraction: float = 0.5) -> Snapshot:
    """A cluster of mixed GPU models, about half busy, and a mixed queue of waiting jobs."""
    rng = random.Random(seed)
    node_list = []
    for i in range(nodes):
        model = _MODELS[i % len(_MODELS)]
        gpus = tuple(Gpu(f"GPU-{i}-{g}", g, model, 80.0) for g in range(gpus_per_node))
        node_list.append(Node(f"node-{i:05d}", gpus, lease_expires=1e12))
    allocated: dict[str, dict[str, str]] = {n.id: {} for n in node_list}
    active = []
    for n in node_list:
        busy = int(gpus_per_node * busy_fraction * rng.random() * 2)
        if busy > 0:
            busy = min(busy, gpus_per_node)
            jid = f"run-{n.id}"
            ids = tuple(g.id for g in n.gpus[:busy])
            spec = JobSpec(command="true", gpus=busy, priority="normal", team="t0")
            active.append(Job(jid, spec, JobState.RUNNING, 0.0,
                              allocations=(Allocation(n.id, ids),)))
            allocated[n.id] = {g: f"{jid}:1" for g in ids}
    jobs = []
    specs: dict[tuple[Any, ...], JobSpec] = {}
    for i in range(pending):
        key = (rng.choice(_GPUS), rng.choice(_TYPES), rng.choice(_CLASSES), f"t{rng.randrange(8)}",
               2 if rng.random() < 0.02 else 1)
        cached = specs.get(key)
        if cached is None:
            cached = specs[key] = JobSpec(command="true", gpus=key[0], gpu_types=key[1],
                                          priority=key[2], team=key[3], nodes=key[4])
        jobs.append(Job(f"job-{i:06d}", cached, JobState.PENDING, float(rng.randrange(100000))))
    return Snapshot(1e6, tuple(jobs), tuple(active), tuple(node_list), allocated,
                    DEFAULT_CLASSES)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench_cycle(pending: int = 10000, nodes: int = 1000, gpus_per_node: int = 8,
                cycles: int = 20, seed: int = 0, store: bool = False, policy: str = "spillway",
                **_ignored: Any) -> dict[str, Any]:
    """Time ``run_cycle`` with a policy bundle on a synthetic snapshot; with ``store``, also
    the whole cycle through a real Redis store (snapshot, plan, compare-and-set apply)."""
    from policies.registry import PolicySet

    policies = PolicySet.named(policy)
    snap = synthetic_snapshot(pending, nodes, gpus_per_node, seed)
    times: list[float] = []
    starts = 0
    memory = Memory()  # kept across cycles, as the scheduler keeps it
    for _ in range(cycles):
        t0 = time.perf_counter()
        plan = run_cycle(snap, policies, memory=memory)
        times.append((time.perf_counter() - t0) * 1000)
        starts = len(plan.starts)
    extra = _store_cycle(snap, cycles, policy) if store else {}
    return {
        "benchmark": "cycle",
        "policy": policy,
        "pending": pending,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "free_gpus_at_start": nodes * gpus_per_node - sum(len(v) for v in snap.allocated.values()),
        "starts_per_cycle": starts,
        "cycles": cycles,
        "p50_ms": round(statistics.median(times), 2),
        "p95_ms": round(_pct(times, 0.95), 2),
        "max_ms": round(max(times), 2),
        "target_p50_ms": 200,
        **extra,
    }


def _store_cycle(snap: Snapshot, cycles: int, policy: str) -> dict[str, Any]:
    """Load the synthetic cluster into an embedded Redis and time whole cycles: the first
    writes every start; later ones find the cluster full and change nothing."""
    import shutil
    import tempfile

    from broker.control.embedded import EmbeddedRedis
    from broker.cycle.plan import Plan, Start
    from broker.cycle.snapshots import SnapshotBuilder
    from broker.store.redis import RedisStore
    from policies.registry import PolicySet

    tmp = tempfile.mkdtemp(prefix="spillway-bench-")
    server = EmbeddedRedis(tmp)
    try:
        st = RedisStore(server.url)
        for node in snap.nodes:
            st.heartbeat(node, 1e9, snap.now)
        running = st.submit_many([j.spec for j in snap.active], snap.now,
                                 [j.id for j in snap.active])
        st.apply(Plan(starts=tuple(Start(j.id, 1, j.version, a.allocations)
                                   for j, a in zip(running, snap.active))), snap.now)
        for i in range(0, len(snap.pending), 1000):
            chunk = snap.pending[i:i + 1000]
            st.submit_many([j.spec for j in chunk], snap.now, [j.id for j in chunk])
        times, parts = [], []
        builder = SnapshotBuilder(st)
        for _ in range(cycles):
            t0 = time.perf_counter()
            live = builder.build(snap.now + 1)
            t1 = time.perf_counter()
            plan = run_cycle(live, PolicySet.named(policy), memory=builder.memory)
            t2 = time.perf_counter()
            applied = st.apply(plan, snap.now + 1)
            t3 = time.perf_counter()
            times.append((t3 - t0) * 1000)
            parts.append((t1 - t0, t2 - t1, t3 - t2, len(applied.started)))
        steady = times[1:] or times
        snap_ms, plan_ms, apply_ms, started = parts[0]
        st.close()
        return {
            "store_first_cycle_ms": round(times[0], 1),
            "store_first_cycle_parts_ms": {"snapshot": round(snap_ms * 1000, 1),
                                           "plan": round(plan_ms * 1000, 1),
                                           "apply": round(apply_ms * 1000, 1)},
            "store_first_cycle_starts": started,
            "store_steady_p50_ms": round(statistics.median(steady), 1),
            "store_steady_p95_ms": round(_pct(steady, 0.95), 1),
        }
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# dispatch: the real system


def _spawn(url: str, log_dir: str, name: str, *args: str) -> Any:
    import os
    import subprocess
    import sys

    env = {**os.environ, "SPILLWAY_REDIS_URL": url, "SPILLWAY_HEARTBEAT_S": "1",
           "SPILLWAY_LEASE_TTL_S": "3", "PYTHONUNBUFFERED": "1"}
    log = open(os.path.join(log_dir, f"{name}.log"), "ab")  # noqa: SIM115
    return subprocess.Popen([sys.executable, "-m", "broker.cli", "--redis-url", url, *args],
                            env=env, stdout=log, stderr=subprocess.STDOUT)




NOOP_QUEUE = "bench.noop"


def _turnaround(jobs: list[Any]) -> dict[str, float]:
    """Where a GPU's time goes in the burst, from the jobs' histories (p50s, ms): STARTING to
    RUNNING (the cycle's apply, the message, the agent's start), RUNNING to the end, and how
    long a GPU stays free between a job's end and the next start on it; starts per cycle."""
    def at(job: Any, state: str) -> float | None:
        return next((h.time for h in job.history if h.state.value == state), None)

    to_run, run, free, gpu = [], [], [], defaultdict(list)
    for j in jobs:
        start, end = at(j, "STARTING"), j.finished_at
        running = at(j, "RUNNING") or end
        if start is None or end is None or running is None:
            continue
        to_run.append(running - start)
        run.append(end - running)
        for a in j.allocations:
            for g in a.gpu_ids:
                gpu[(a.node_id, g)].append((start, end))
    for spans in gpu.values():
        spans.sort()
        free += [b[0] - a[1] for a, b in itertools.pairwise(spans)]
    cycles = len({round(at(j, "STARTING") or 0.0, 6) for j in jobs})

    def p50(xs: list[float]) -> float:
        return round(statistics.median(xs) * 1000, 1) if xs else 0.0

    return {"starting_to_running_p50_ms": p50(to_run), "running_to_end_p50_ms": p50(run),
            "gpu_free_gap_p50_ms": p50(free),
            "starts_per_cycle": round(len(jobs) / max(1, cycles), 2)}


def _spawn_noop(url: str, log_dir: str) -> Any:
    """The raw Celery worker of the reference (broker/bench/noop.py)."""
    import os
    import subprocess
    import sys

    log = open(os.path.join(log_dir, "noop.log"), "ab")  # noqa: SIM115
    return subprocess.Popen([sys.executable, "-m", "broker.bench.noop", url, NOOP_QUEUE],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log,
                            stderr=subprocess.STDOUT)


def _noop_rate(client: Any, queue: str, n: int, noop: bool) -> float:
    """No-op tasks per second through ``queue``: ``n`` sent one at a time, timed until the
    queue is drained (after one task has gone through, so that the worker is up)."""
    from broker.bench.noop import NOOP

    def send(i: int) -> None:
        if noop:
            client.celery.send_task(NOOP, args=[i], queue=queue)
        else:
            commands.ping(client.celery, queue, i)

    send(-1)
    poll_until(lambda: client.store_redis.llen(queue) == 0, 60, f"a worker on {queue}")
    t1 = time.perf_counter()
    for i in range(n):
        send(i)
    poll_until(lambda: client.store_redis.llen(queue) == 0, 300, "no-op tasks to drain")
    return n / (time.perf_counter() - t1)


def _cpu_seconds(procs: list[Any], redis_pid: int | None = None) -> dict[str, float]:
    """CPU seconds used so far by each service process (and, apart, by the jobs it reaped),
    this process, and the Redis server when it runs here."""
    import psutil

    out = {}
    for i, p in enumerate(procs):
        name = "scheduler" if i == 0 else f"agent{i - 1}"
        t = psutil.Process(p.pid).cpu_times()
        out[name] = t.user + t.system
        out[name + "_jobs"] = t.children_user + t.children_system
    me = psutil.Process().cpu_times()
    out["bench_client"] = me.user + me.system
    if redis_pid:
        try:
            t = psutil.Process(redis_pid).cpu_times()
            out["redis"] = t.user + t.system
        except psutil.Error:  # not ours to read, or gone
            pass
    return out


def _redis_pid(server: Any, client: Any) -> int | None:
    """The Redis server's pid: the embedded one's, or the one INFO names if it is local."""
    if server is not None:
        return int(server.pid) or None
    try:
        info = client.store_redis.info("server")
        host = client.store_redis.connection_pool.connection_kwargs.get("host", "")
    except Exception:
        return None
    return int(info["process_id"]) if host in ("127.0.0.1", "localhost", "::1") else None


def bench_dispatch(jobs: int = 2000, agents: int = 2, gpus_per_agent: int = 8,
                   latency_samples: int = 50, redis_url: str | None = None,
                   **_ignored: Any) -> dict[str, Any]:
    """Start a scheduler and ``agents`` worker agents against a fresh embedded Redis (or
    ``redis_url``, whose database is flushed), run ``jobs`` trivial jobs (``true``), and
    measure job starts per second, submit-to-running latency on an idle cluster, and
    Celery's own throughput: no-op tasks through a stock Celery worker (broker/bench/noop.py),
    and through one agent's queue for the record."""
    import os
    import shutil
    import signal
    import tempfile

    from broker.client import Client
    from broker.control.embedded import EmbeddedRedis
    from broker.model import JobSpec

    tmp = tempfile.mkdtemp(prefix="spillway-bench-")
    os.chmod(tmp, 0o711)  # (agents as root run jobs as per-team users, who pass through)
    server = None if redis_url else EmbeddedRedis(tmp)
    url = redis_url or server.url  # type: ignore[union-attr]
    procs = []
    noop_worker = None
    client = Client(url)
    try:
        client.store_redis.flushdb()
        procs.append(_spawn(url, tmp, "scheduler", "scheduler"))
        for i in range(agents):
            procs.append(_spawn(url, tmp, f"agent{i}", "worker", "--node-id", f"bench-{i}",
                                "--gpus", f"{gpus_per_agent}xA100-80GB", "--cpus", "1024",
                                "--work-dir", f"{tmp}/agent{i}"))
        noop_worker = _spawn_noop(url, tmp)
        poll_until(lambda: len(client.nodes()) == agents, 60, "agents to register")

        # 1. latency on an idle cluster: one job at a time, submit -> RUNNING
        lat: list[float] = []
        for _ in range(latency_samples):
            job = client.submit(command=["true"], gpus=1, name="lat")
            done = client.wait(job.id, timeout=30)
            running = next(h.time for h in done.history if h.state.value in ("RUNNING",
                                                                               "SUCCEEDED"))
            lat.append((running - done.submitted_at) * 1000)

        # 2. throughput: a burst of trivial jobs through 2 x 8 GPUs
        specs = [JobSpec(command=["true"], gpus=1, name="burst") for _ in range(jobs)]
        redis_pid = _redis_pid(server, client)
        cpu0 = _cpu_seconds(procs, redis_pid)
        t0 = time.time()
        submitted = []
        for i in range(0, jobs, 500):
            submitted += client.submit_many(specs[i: i + 500])
        t_submit = time.time() - t0
        ids = [j.id for j in submitted]

        def all_done() -> bool:  # cheap: the bench must not steal the CPU it measures
            time.sleep(0.05)
            return client.store.count_ids("pending") == 0 \
                and client.store.count_ids("active") == 0

        poll_until(all_done, 600, "the burst to finish")
        cpu1 = _cpu_seconds(procs, redis_pid)
        final = client.store.get_many(ids)
        starts = sorted(next(h.time for h in j.history if h.state.value == "STARTING")
                        for j in final if j is not None)
        failed = sum(1 for j in final if j is not None and j.state.value != "SUCCEEDED")
        span = starts[-1] - t0
        burst_lat = sorted((next(h.time for h in j.history if h.state.value == "STARTING")
                            - j.submitted_at) * 1000 for j in final if j is not None)

        # 3. raw Celery: no-op tasks through a Celery worker of Celery's own making (acks on;
        # broker/bench/noop.py says why not through an agent's queue), same Redis and
        # settings; then, for the record, the same through an agent's queue
        # three times, the median: one measure takes about a second, and on a shared machine
        # single ones of the same code ranged over a factor of two within the hour
        noop_rates = [_noop_rate(client, NOOP_QUEUE, jobs, noop=True) for _ in range(3)]
        celery_rate = statistics.median(noop_rates)
        agent_queue_rate = _noop_rate(client, "node.bench-0", jobs, noop=False)
        return {
            "benchmark": "dispatch",
            "jobs": jobs,
            "agents": agents,
            "gpus_per_agent": gpus_per_agent,
            "failed": failed,
            "submit_s": round(t_submit, 3),
            "job_starts_per_s": round(len(starts) / span, 1),
            "burst_submit_to_start_p50_ms": round(statistics.median(burst_lat), 1),
            **_turnaround([j for j in final if j is not None]),
            "idle_submit_to_running_p50_ms": round(statistics.median(lat), 1),
            "idle_submit_to_running_p95_ms": round(_pct(lat, 0.95), 1),
            "celery_noop_tasks_per_s": round(celery_rate, 1),
            "celery_noop_runs_per_s": [round(r, 1) for r in noop_rates],
            "job_starts_vs_celery_ratio": round(len(starts) / span / celery_rate, 3),
            "agent_queue_noop_tasks_per_s": round(agent_queue_rate, 1),
            "burst_cpu_s": {name: round(cpu1[name] - cpu0[name], 2) for name in cpu0
                            if name in cpu1},
            "burst_cpu_ms_per_start": {name: round((cpu1[name] - cpu0[name]) * 1000
                                                   / max(1, len(starts)), 3)
                                       for name in cpu0 if name in cpu1},
            "target_job_starts_per_s": 300,
            "target_idle_p50_ms": 250,
        }
    finally:
        for p in [*procs, *([noop_worker] if noop_worker is not None else [])]:
            p.send_signal(signal.SIGTERM)
        for p in [*procs, *([noop_worker] if noop_worker is not None else [])]:
            try:
                p.wait(timeout=20)
            except Exception:
                p.kill()
        client.close()
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
