"""Bring a job home from a rented machine when on-prem GPUs stand idle (policies/burst/sla.py,
``home_move``).

A job bursts because, when it was decided, on-prem could not start it within its SLA. Days
later on-prem may have GPUs that no queued job wants (at night, at a weekend, once a peak
has passed) while the job still runs on a rented machine, on-demand at about three times
the price of spot, for the rest of its run: the busiest 14 days of seed 0 spend 82% of their
cloud bill on on-demand machines of normal jobs that run longer than a day. A checkpointable
job alone on its rented machines (on each, for a gang) moves home when, with nothing left
pending in this cycle, the on-prem GPUs free after the cycle's starts hold it now and still
leave ``home_move_headroom_gpus`` free for the jobs that arrive next (a long job that fills
the last free GPUs sends the next arrivals to the cloud) besides the GPUs of the jobs a carbon
wait holds back (:func:`held_for_carbon`: they are pending, not blocked, and their window
comes), and the rent it would still pay
(its machines' price x its remaining predicted runtime) beats what the move costs
(:func:`home_gain`):

1. the job is stopped (eviction kind ``home``, in its history and ``explain``): it
   checkpoints and goes back to the front of the queue, where the next cycle starts it on the
   free on-prem GPUs, which this cycle keeps from the rest of its phases;
2. its rented machines drain at once (broker/cloud/lifecycle.py ``NodeUse.leaving``, as for a move
   to spot) and go once it has left.

A job moves home at most ``home_move_max`` times (a higher class may take its on-prem GPUs
again, and it bursts again only if its SLA would break). Jobs with a ``deadline`` are left
to the deadline rule (policies/burst/spot_deadline.py).
"""

from __future__ import annotations

import math

from broker.cycle.plan import Preempt
from broker.model import Instance, InstanceState, Job
from broker.model.state import EvictionKind, JobState
from policies import reasons
from policies.burst.offers import Phase, alone_on, billed_gpus
from policies.cycle import Cycle

HOME_DEFAULTS: dict[str, float] = {
    "home_move": 1.0,  # 1: bring checkpointable jobs home from rented machines when it pays
    "home_move_min_gain_usd": 20.0,  # the expected saving a move must exceed
    "home_move_max": 2.0,  # moves home per job at most
    "home_move_headroom_gpus": 8.0,  # on-prem GPUs left free after a move, for arrivals
}


def home_gain(remaining_s: float, rent_per_h: float, gpus: int, restart_s: float,
              lost_s: float, onprem_gpu_hour_usd: float) -> float:
    """Expected dollars saved by stopping a job with ``remaining_s`` to run on rented
    machines (``rent_per_h``, all of them: they go when it leaves) and restarting it on
    on-prem GPUs (not billed: a slower on-prem model only delays it). The move costs the
    work lost since its last checkpoint and the restart, valued as on-prem GPU-hours of its
    ``gpus``."""
    if not math.isfinite(remaining_s) or remaining_s <= 0:
        return -math.inf
    stay = rent_per_h * remaining_s / 3600.0
    move = onprem_gpu_hour_usd * gpus * (lost_s + restart_s) / 3600.0
    return stay - move


def home_moves(p: Phase) -> None:
    """Stop the jobs worth bringing home, each onto on-prem GPUs this cycle leaves free."""
    cycle, cfg, costs = p.cycle, p.cfg, p.costs
    if not cfg["home_move"] or cycle.blocked:
        return
    by_node = {i.node_id: i for i in cycle.snap.instances
               if i.state is InstanceState.READY and i.node_id}
    stopping = {p.job_id for p in cycle.evictions}
    found: list[tuple[float, Job, list[Instance]]] = []
    for job in cycle.snap.active:
        if job.state is not JobState.RUNNING or job.spec.deadline is not None \
                or not job.spec.checkpoint_dir or job.id in stopping \
                or _homes(job) >= int(cfg["home_move_max"]):
            continue
        held = [by_node.get(n) for n in job.node_ids]
        here = [h for h in held if h is not None]
        if not here or len(here) != len(held) \
                or not all(alone_on(cycle, job, n) for n in job.node_ids):
            continue
        gain = home_gain(cycle.end_of(job) - cycle.now, sum(h.price_per_hour for h in here),
                         billed_gpus(job), costs.restart_s,
                         costs.checkpoint_interval_s / 2, float(cfg["onprem_gpu_hour_usd"]))
        if gain > float(cfg["home_move_min_gain_usd"]):
            found.append((gain, job, here))
    if not found:
        return
    free = sum(len(devs) for f in cycle.index.nodes.values() if f.node.site == "onprem"
               for devs in f.devices.values()) - held_for_carbon(cycle)
    headroom = float(cfg["home_move_headroom_gpus"])
    for gain, job, here in sorted(found, key=lambda f: (-f[0], f[1].id)):
        gpus = billed_gpus(job)
        if free - gpus < headroom:
            continue
        allocs = cycle.index.find(job.res, ("onprem",))
        if allocs is None:
            continue
        cycle.index.take(allocs, job.res)  # kept for it until it restarts
        free -= gpus
        cycle.evictions.append(Preempt(
            job.id, job.attempt, f"comes home from {', '.join(h.id for h in here)}: on-prem "
            f"GPUs stand idle, ${gain:,.0f} of rent saved over the rest of its run",
            cycle.snap.grace_s, EvictionKind.HOME))


def held_for_carbon(cycle: Cycle) -> int:
    """The GPUs of the pending jobs held back this cycle by a carbon wait
    (``DeferredForCarbon``: policies/carbon/wait.py): idle on-prem GPUs are theirs when their
    window comes, not a long job's from the cloud."""
    held = 0
    for job in cycle.snap.pending:
        why = cycle.pending.get(job.id)
        if why is not None and why.code == reasons.DEFERRED_FOR_CARBON:
            held += billed_gpus(job)
    return held


def _homes(job: Job) -> int:
    return sum(h.kind is EvictionKind.HOME for h in job.history)
