"""Benchmarks behind ``spillway bench``: each returns a JSON-able dict.

* ``bench_cycle``: the pure scheduling cycle over a synthetic mixed queue and cluster.
* ``bench_dispatch``: real Redis, a real scheduler and real worker-agent processes running
  trivial jobs; job starts per second, submit-to-running latency, and raw Celery throughput.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from broker.config import DEFAULT_CLASSES
from broker.model import Allocation, Gpu, Job, JobSpec, Node
from broker.plan import Snapshot
from broker.scheduler import run_cycle
from broker.state import JobState

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
        spec = specs.get(key)
        if spec is None:
            spec = specs[key] = JobSpec(command="true", gpus=key[0], gpu_types=key[1],
                                        priority=key[2], team=key[3], nodes=key[4])
        jobs.append(Job(f"job-{i:06d}", spec, JobState.PENDING, float(rng.randrange(100000))))
    return Snapshot(1e6, tuple(jobs), tuple(active), tuple(node_list), allocated,
                    DEFAULT_CLASSES)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench_cycle(pending: int = 10000, nodes: int = 1000, gpus_per_node: int = 8,
                cycles: int = 20, seed: int = 0, **_: Any) -> dict[str, Any]:
    snap = synthetic_snapshot(pending, nodes, gpus_per_node, seed)
    times, starts = [], 0
    for _ in range(cycles):
        t0 = time.perf_counter()
        plan = run_cycle(snap)
        times.append((time.perf_counter() - t0) * 1000)
        starts = len(plan.starts)
    return {
        "benchmark": "cycle",
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
    }
