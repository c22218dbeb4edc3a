"""Queue order: who is considered first in a cycle.

``priority-fifo`` and ``multifactor`` (slurm-like) put higher class ranks first, like Slurm
partitions' PriorityTier; ``fifo`` (the fcfs baseline) ignores classes altogether; ``spillway``
puts the classes that may preempt first and lets the others share one queue (see its docstring).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from broker.cycle.plan import Snapshot
from broker.model import BY_AGE, Job
from policies.cycle import Cycle
from policies.evict.relief import resumes_first
from policies.order.fairshare import gpus_in_use
from policies.order.predictor import RuntimePredictor
from policies.reasons import Weighed
from policies.registry import register


def _ranks(snapshot: Snapshot) -> dict[str, int]:
    return {c.name: -c.rank for c in snapshot.classes}


@register("order", "priority-fifo")
def priority_fifo(cycle: Cycle, jobs: Sequence[Job]) -> list[Job]:
    """Higher class rank first, then earlier submission, then job id (deterministic)."""
    rank = _ranks(cycle.snap)
    return sorted(jobs, key=lambda j: (rank.get(j.priority, 0), j.submitted_at, j.id))


@register("order", "fifo")
def fifo(cycle: Cycle, jobs: Sequence[Job]) -> list[Job]:
    """Strict submission order, whatever the class (the ``fcfs`` baseline)."""
    del cycle
    return sorted(jobs, key=BY_AGE)


fifo.arrivals_last = True  # type: ignore[attr-defined]  # an arrival always goes last


# Slurm's multifactor plugin with the weights of its documented configuration example
# (SchedMD, "Multifactor Priority Plugin", Configuration Example): age 1000 reaching its
# maximum after PriorityMaxAge = 14 days, fair share 10000, job size 1000 favouring large jobs
# (PriorityFavorSmall=NO), QOS 0. Classes play the part of partitions with a PriorityTier.
SLURM_DEFAULTS = {"weight_age": 1000.0, "max_age_s": 14 * 86400.0, "weight_fairshare": 10000.0,
                  "weight_jobsize": 1000.0}


def multifactor_priority(snapshot: Snapshot, job: Job, fs: dict[str, float],
                         cluster_gpus: int, s: Mapping[str, float]) -> float:
    age = min(1.0, max(0.0, snapshot.now - job.submitted_at) / s["max_age_s"])
    size = min(1.0, job.res.total_gpus / max(1, cluster_gpus))
    return (s["weight_age"] * age + s["weight_fairshare"] * fs.get(job.team, 1.0)
            + s["weight_jobsize"] * size)


def cluster_gpus(snapshot: Snapshot) -> int:
    return sum(1 for n in snapshot.nodes for g in n.allocatable if g.mig_profile is None) or 1


@register("order", "multifactor", settings=SLURM_DEFAULTS)
def multifactor(cycle: Cycle, jobs: Sequence[Job]) -> list[Job]:
    """Slurm-like: class (tier) first, then the multifactor priority, then submit time.
    Settings (``policy_settings: {multifactor: {...}}``): :data:`SLURM_DEFAULTS`."""
    snapshot = cycle.snap
    rank = _ranks(snapshot)
    fs = cycle.memo(Weighed).fairshare = cycle.fairshare  # (the reasons say FairShare from it)
    total = cluster_gpus(snapshot)
    s = cycle.settings("multifactor")
    return sorted(jobs, key=lambda j: (rank.get(j.priority, 0),
                                       -multifactor_priority(snapshot, j, fs, total, s),
                                       j.submitted_at, j.id))


def order_size(job: Job) -> int:
    """The size spillway's order weighs a job by: its GPUs, and one for a job that needs none
    (a CPU-only job ranks as a one-GPU job of the same runtime: the smallest size there is,
    never a zero that the expected slowdown would divide by)."""
    return max(1, job.res.total_gpus)


SPILLWAY_DEFAULTS: dict[str, Any] = {
    "min_estimate_s": 60.0,  # an estimate below this counts as this (bounds the slowdown)
    "order_quantile": 0.5,  # rank by the predicted median runtime (backfill uses the p90)
    "size_exponent": 1.0,  # the estimate counts GPU-seconds: runtime x GPUs ** this (>= 1 GPU)
    "runtime_exponent": 1.0,  # < 1 ages long jobs relatively faster
    "fairshare_weight": 1.0,  # fair share scales the score by (0.5 + F) ** weight
    "fairshare_tier": 0.95,  # teams whose fair-share factor is at least this go first (0: off)
    "share_tier": 0.0,  # > 0: so do teams holding less than this x their share of the GPUs now
    "long_tier": 0.6,  # and teams with a factor of at least this, for their long jobs (0: off)
    "long_tier_s": 28800.0,  # ... those whose predicted median runtime is at least this
    "starve_after_s": 0.0,  # > 0: a job waiting longer is served oldest first (0: off; the
    # score grows without bound while a job waits, so no job starves without it)
    "class_weight": {},  # score weight per class in the shared tier (default 1)
}


def entitled_gpus(snapshot: Snapshot) -> tuple[dict[str, float], dict[str, int]]:
    """Each team's weighted share of the cluster's GPUs, among the teams that want GPUs now
    (running or waiting), and the GPUs each holds (max-min fairness, as in Kueue's fair
    sharing or YARN's fair scheduler)."""
    used = gpus_in_use(snapshot)
    teams = set(used) | {j.team for j in snapshot.pending}
    weight = {t: snapshot.team_by_name[t].weight if t in snapshot.team_by_name else 1.0
              for t in teams}
    total = sum(weight.values()) or 1.0
    gpus = cluster_gpus(snapshot)
    return {t: gpus * w / total for t, w in weight.items()}, used


@register("order", "spillway", settings=SPILLWAY_DEFAULTS)
def spillway(cycle: Cycle, jobs: Sequence[Job]) -> list[Job]:
    """Spillway's order, from first to last deciding key:

    1. the classes that may preempt (urgent by definition: minutes of SLA), highest rank first;
       every other class shares one queue;
    2. the job holding the reservation (it holds from cycle to cycle, so a wide job's drain is
       never wasted by a newcomer taking its place), then jobs requeued after being moved to
       make whole nodes for it (policies/evict/defrag.py: they restart on the GPUs kept for them)
       or evicted to relieve it (policies/evict/relief.py: they restart as soon as GPUs free up);
    3. teams that are owed service: a fair-share factor of at least ``fairshare_tier`` (or,
       with ``share_tier`` set, fewer GPUs held now than that x their weighted share); with
       ``long_tier`` set (the default), also the long jobs (predicted median at least
       ``long_tier_s``) of teams whose factor is at least ``long_tier`` (the score alone
       rarely lifts a light team's day-long job past a stream of short ones from heavier
       teams: its expected slowdown rises slowly);
    4. the highest expected slowdown if started now, ``1 + wait / (runtime x GPUs)``, with the
       runtime the predictor's median and a CPU-only job counted as one GPU (:func:`order_size`),
       scaled by ``(0.5 + F)`` and the class weight: the
       smallest jobs go first, and every job's priority keeps rising while it waits (with
       ``starve_after_s`` set, a job that waited that long goes ahead of its tier, oldest
       first);
    5. submit time, then id.

    Settings (``policy_settings: {spillway: {...}}``): :data:`SPILLWAY_DEFAULTS`."""
    snapshot = cycle.snap
    urgent = {c.name: -c.rank for c in snapshot.classes if c.may_preempt}
    fs = cycle.memo(Weighed).fairshare = cycle.fairshare  # (the reasons say FairShare from it)
    pred = snapshot.predictor
    holder = snapshot.reservation.job_id if snapshot.reservation else None
    s = cycle.settings("spillway")
    share, used = entitled_gpus(snapshot) if s["share_tier"] else ({}, {})
    fs_tier, share_tier = s["fairshare_tier"], s["share_tier"]
    owed = {t for t, f in fs.items()
            if (fs_tier and f >= fs_tier)
            or (share and used.get(t, 0) < share_tier * share.get(t, 0))}
    long_owed = {t for t, f in fs.items() if 0 < s["long_tier"] <= f} - owed
    long_s = s["long_tier_s"]
    mult = {t: (0.5 + f) ** s["fairshare_weight"] for t, f in fs.items()}
    q, now, floor = s["order_quantile"], snapshot.now, s["min_estimate_s"]
    rexp, sexp, cw, starve = (s["runtime_exponent"], s["size_exponent"], s["class_weight"],
                              s["starve_after_s"])
    week = 7 * 86400.0

    version = getattr(pred, "version", None)  # a predictor that says when it changes
    epoch = (version, q, floor, rexp, sexp, tuple(sorted(cw.items()))) \
        if version is not None else None
    # job id -> (epoch, rate), kept across cycles in the scheduler's Memory (one per predictor:
    # a scheduler process or a simulation); the epoch changes when the predictor's version
    # does. Not a pure cache: a rate keeps the estimate its job
    # had when first asked in the epoch, while the predictor refreshes each job's memo 32
    # runtimes after that job's own first ask, so dropping the cache can change the order
    # slightly (keying the predictor's memos on the version too would make it pure; measured on
    # 2026-12-04, it was no faster and moved docs/results.md's mean-wait ratios by up to 0.05)
    memo = cycle.memory.order_rates if epoch is not None else {}

    def median(j: Job) -> float:
        """The job's runtime estimate: the predictor's median, or its time limit."""
        return pred.estimate(j, q) if pred is not None else (j.spec.time_limit or math.inf)

    def rate(j: Job) -> float:
        """class weight / effective estimate: how fast the job's score rises while it waits
        (stored until the predictor refreshes its estimate; looked up below)."""
        e = median(j)
        e = max(floor, e if e < math.inf else week) ** rexp * order_size(j) ** sexp
        r = cw.get(j.priority, 1.0) / e
        if len(memo) > 200_000:
            memo.clear()
        memo[j.id] = (epoch, r)
        return r

    # score = mult x class weight x (1 + wait / e) = mult x (w + rate x wait), decorated so
    # that the sort compares tuples in C; the index keeps it stable and total
    none: dict[str, tuple[object, float]] = {}
    cached = (memo if epoch is not None else none).get  # rate(), inlined: long queues

    decorated = [
        (urgent.get(j.priority, 0),
         j.id != holder, not (j.attempt > 1 and resumes_first(j)),  # (its quick test inlined)
         j.team not in owed and not (j.team in long_owed and median(j) >= long_s),
         -(mult.get(j.team, 1.5) * (cw.get(j.priority, 1.0) + (
             m[1] if (m := cached(j.id)) is not None and m[0] == epoch else rate(j))
             * (now - j.submitted_at)))
         if not 0 < starve <= now - j.submitted_at else -1e12 - (now - j.submitted_at),
         j.submitted_at, j.id, i)
        for i, j in enumerate(jobs)]
    decorated.sort()
    return [jobs[t[7]] for t in decorated]


@register("admit", "admit-all")
def admit_all(cycle: Cycle, job: Job) -> str | None:
    """Admission seam (quotas, budgets): return a refusal reason code, or None to admit."""
    del cycle, job
    return None


__all__ = ["RuntimePredictor", "admit_all", "fifo", "multifactor", "priority_fifo", "spillway"]
