"""Queue order: who is considered first in a cycle.

Every order puts higher class ranks first (like Slurm partitions' PriorityTier), except
``fifo``, the strict first-come-first-served baseline, which ignores classes altogether.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from broker.model import Job
from broker.plan import Snapshot
from policies.fairshare import fairshare_factors
from policies.predictor import RuntimePredictor
from policies.registry import register


def _ranks(snapshot: Snapshot) -> dict[str, int]:
    return {c.name: -c.rank for c in snapshot.classes}


@register("order", "priority-fifo")
def priority_fifo(snapshot: Snapshot, jobs: Sequence[Job]) -> list[Job]:
    """Higher class rank first, then earlier submission, then job id (deterministic)."""
    rank = _ranks(snapshot)
    return sorted(jobs, key=lambda j: (rank.get(j.priority, 0), j.submitted_at, j.id))


@register("order", "fifo")
def fifo(snapshot: Snapshot, jobs: Sequence[Job]) -> list[Job]:
    """Strict submission order, whatever the class (the ``fcfs`` baseline)."""
    del snapshot
    return sorted(jobs, key=lambda j: (j.submitted_at, j.id))


# Slurm's multifactor plugin with the weights of its documented configuration example
# (SchedMD, "Multifactor Priority Plugin", Configuration Example): age 1000 reaching its
# maximum after PriorityMaxAge = 14 days, fair share 10000, job size 1000 favouring large jobs
# (PriorityFavorSmall=NO), QOS 0. Classes play the part of partitions with a PriorityTier.
SLURM_DEFAULTS = {"weight_age": 1000.0, "max_age_s": 14 * 86400.0, "weight_fairshare": 10000.0,
                  "weight_jobsize": 1000.0}


def multifactor_priority(snapshot: Snapshot, job: Job, fs: dict[str, float],
                         cluster_gpus: int, s: dict[str, float]) -> float:
    age = min(1.0, max(0.0, snapshot.now - job.submitted_at) / s["max_age_s"])
    size = min(1.0, job.res.total_gpus / max(1, cluster_gpus))
    return (s["weight_age"] * age + s["weight_fairshare"] * fs.get(job.team, 1.0)
            + s["weight_jobsize"] * size)


def cluster_gpus(snapshot: Snapshot) -> int:
    return sum(1 for n in snapshot.nodes for g in n.allocatable if g.mig_profile is None) or 1


@register("order", "multifactor")
def multifactor(snapshot: Snapshot, jobs: Sequence[Job]) -> list[Job]:
    """Slurm-like: class (tier) first, then the multifactor priority, then submit time."""
    rank = _ranks(snapshot)
    fs = fairshare_factors(snapshot)
    total = cluster_gpus(snapshot)
    s = {**SLURM_DEFAULTS, **snapshot.settings.get("slurm", {})}
    return sorted(jobs, key=lambda j: (rank.get(j.priority, 0),
                                       -multifactor_priority(snapshot, j, fs, total, s),
                                       j.submitted_at, j.id))


SPILLWAY_DEFAULTS = {
    "min_estimate_s": 600.0,  # an estimate below this counts as this (bounds the slowdown)
    "fairshare_weight": 1.0,  # how strongly fair share scales the score
    "starve_after_s": 2 * 86400.0,  # a job waiting longer is served oldest first
}


def spillway_score(snapshot: Snapshot, job: Job, estimate: float, fs: float,
                   s: dict[str, float]) -> float:
    """Expected slowdown if started now, ``(wait + estimate) / estimate``, scaled by fair
    share. Short jobs rise fast, long jobs rise too and are never passed over for ever."""
    wait = max(0.0, snapshot.now - job.submitted_at)
    if wait >= s["starve_after_s"]:
        return 1e9 + wait  # starving: strictly by age, ahead of everything in its class
    est = max(s["min_estimate_s"], estimate if math.isfinite(estimate) else 7 * 86400.0)
    est *= job.res.total_gpus ** 0.5
    return (wait + est) / est * (0.5 + fs) ** s["fairshare_weight"]


@register("order", "spillway")
def spillway(snapshot: Snapshot, jobs: Sequence[Job]) -> list[Job]:
    """Class first; within a class the job holding the reservation, then the highest
    fair-share-weighted expected slowdown (estimates from the runtime predictor)."""
    rank = _ranks(snapshot)
    fs = fairshare_factors(snapshot)
    pred = snapshot.predictor
    holder = snapshot.reservation.job_id if snapshot.reservation else None
    s = {**SPILLWAY_DEFAULTS, **snapshot.settings.get("spillway", {})}

    def est(j: Job) -> float:
        if pred is not None:
            return pred.estimate(j)
        return j.spec.time_limit or math.inf

    return sorted(jobs, key=lambda j: (rank.get(j.priority, 0), j.id != holder,
                                       -spillway_score(snapshot, j, est(j), fs.get(j.team, 1.0), s),
                                       j.submitted_at, j.id))


@register("admit", "admit-all")
def admit_all(snapshot: Snapshot, job: Job) -> str | None:
    """Admission seam (quotas, budgets): return a refusal reason code, or None to admit."""
    del snapshot, job
    return None


__all__ = ["RuntimePredictor", "admit_all", "fifo", "multifactor", "priority_fifo", "spillway"]
