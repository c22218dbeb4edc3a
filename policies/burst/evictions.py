"""Preempt or burst (policies/burst/sla.py, rule 5): what the evictions planned for a job cost,
and dropping them when it bursts instead. Only preemptions weigh against a burst (a class that
may preempt, or a team reclaiming its quota: :data:`PREEMPTIONS`), not the other evictions
made for one job (defragmentation moves, relief, a reservation's scavengers)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.cycle.plan import Preempt
from broker.model import Job
from broker.model.state import EvictionKind
from policies.cycle import Cycle

#: the kinds of eviction that preempt-or-burst weighs (those of policies/evict/priority.py)
PREEMPTIONS = frozenset({EvictionKind.PRIORITY, EvictionKind.QUOTA})


def preempted_for(p: Preempt) -> str | None:
    """The job ``p`` preempts for, if it is a preemption (:data:`PREEMPTIONS`)."""
    return p.for_job if p.kind in PREEMPTIONS else None


def victims_cost(cycle: Cycle, job: Job, cfg: Mapping[str, Any]) -> float:
    """Dollars of on-prem work the evictions planned for ``job`` throw away."""
    active = {j.id: j for j in cycle.snap.active}
    lost = 0.0
    for p in cycle.evictions:
        v = active.get(p.job_id)
        if v is None or preempted_for(p) != job.id:
            continue
        elapsed = max(0.0, cycle.now - (v.started_at or cycle.now))
        held = min(elapsed, p.grace_s) if v.spec.checkpoint_dir else elapsed
        lost += v.res.total_gpus * held
    return lost / 3600.0 * float(cfg["onprem_gpu_hour_usd"])


def drop_evictions_for(cycle: Cycle, bursting: set[str]) -> None:
    """A job that bursts no longer needs the room evictions were making for it."""
    if not cycle.evictions or not bursting:
        return
    cycle.evictions[:] = [p for p in cycle.evictions if preempted_for(p) not in bursting]
