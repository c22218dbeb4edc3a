"""Move a job from on-demand to spot when spot comes back (policies/burst/sla.py, ``spot_move``).

A long job that reached its burst decision while no spot zone had capacity runs on on-demand,
about three times the price, for the rest of its run. When spot comes back, a checkpointable
job alone on its on-demand machine (on each, for a gang) moves, if the saving over its
remaining predicted runtime beats what the move costs (:func:`move_gain`):

1. spot instances are launched for it (one a node, of the offer with the largest gain) while
   it keeps running on on-demand; booting instances launched for a running job are kept out
   of the queue's reach (:func:`moving_bins`);
2. once that instance is up and free, the job is stopped (eviction kind ``spot-move``, in its
   history and ``explain``): it checkpoints, goes back to the front of the queue and restarts
   on the spot machine. Its on-demand machine is drained at once by the scale-down rule
   (broker/cloud/lifecycle.py ``NodeUse.leaving``): it takes no new job and goes once the job left.

Jobs with a ``deadline`` are left to the deadline rule (policies/burst/spot_deadline.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.cycle.plan import Launch, Preempt
from broker.model import Instance, InstanceState, Job, Offer
from broker.model.state import EvictionKind, JobState
from policies.burst.offers import (
    Bin,
    CostModel,
    Phase,
    alone_on,
    holds,
    job_share_per_hour,
    market_allowed,
    may_burst,
    offers_by_id,
    request_id,
    runtime_on,
)
from policies.cycle import Cycle

MOVE_DEFAULTS: dict[str, float] = {
    "spot_move": 0.0,  # 1: move checkpointable jobs from on-demand to spot when it pays
    # (off: measured on 2026-12-06 it cut every bill, the busiest 14 days of seeds 0-2 by
    # 17-47%, but the two months of seed 1 started a job late (attainment 0.9997 against
    # burst-immediate's 1.0) and left on-prem less busy than without clouds; docs/burst.md)
    "spot_move_min_gain_usd": 0.0,  # the expected saving a move must exceed
}


def move_gain(remaining_s: float, speed_ratio: float, ondemand_per_h: float,
              spot_per_h: float, boot_s: float, restart_s: float, rate_per_h: float,
              lost_s: float) -> float:
    """Expected dollars saved by moving a job with ``remaining_s`` to run on on-demand (at
    ``ondemand_per_h``, the whole machine: it is released when the job leaves) to a spot
    machine (``spot_per_h``) on which it runs ``speed_ratio`` times as long. The job keeps
    running on on-demand while the spot machine boots; on spot it pays a restart, and each
    expected interruption (``rate_per_h``) loses ``lost_s`` of work, a restart and a boot."""
    if remaining_s <= boot_s:
        return -math.inf  # it ends before the spot machine is up
    on_spot = (remaining_s - boot_s) * speed_ratio + restart_s
    interruptions = rate_per_h * on_spot / 3600.0
    stay = ondemand_per_h * (remaining_s - boot_s)
    move = spot_per_h * (boot_s + on_spot + interruptions * (lost_s + restart_s + boot_s))
    return (stay - move) / 3600.0


def moving_bins(cycle: Cycle, booting: list[Bin]) -> list[Bin]:
    """``booting`` less the instances launched to move a running job (kept for it)."""
    moving = {i.request_id for held in _moves(cycle).values() for i in held
              if i.state is not InstanceState.READY}
    return [b for b in booting if b.request_id not in moving]


def spot_moves(p: Phase) -> None:
    """Launch spot for the jobs worth moving, and stop those whose spot machine is up."""
    cycle, cfg, costs, room = p.cycle, p.cfg, p.costs, p.room
    if not cfg["spot_move"]:
        return
    moves = _moves(cycle)
    by_node = {i.node_id: i for i in cycle.snap.instances
               if i.state is InstanceState.READY and i.node_id}
    for job in cycle.snap.active:
        if job.state is not JobState.RUNNING or job.spec.deadline is not None \
                or not job.spec.checkpoint_dir:
            continue
        held = [by_node.get(n) for n in job.node_ids]
        if not held or any(h is None or _ONDEMAND not in h.offer_id or not alone_on(cycle, job, n)
                           for h, n in zip(held, job.node_ids, strict=True)):
            continue
        here = [h for h in held if h is not None]
        spot = moves.get(job.id, [])
        if not spot:
            _launch(cycle, job, here, cfg, costs, room)
        elif len(spot) >= len(here) and all(i.state is InstanceState.READY
                                            and _free(cycle, i, job) for i in spot):
            cycle.evictions.append(Preempt(
                job.id, job.attempt, f"moves from on-demand {', '.join(h.id for h in here)} "
                f"to spot {', '.join(i.id for i in spot)}, cheaper for the rest of its run",
                cycle.snap.grace_s, EvictionKind.SPOT_MOVE))


_ONDEMAND = ":ondemand/"  # in offer ids: provider:region:zone:market/type


@dataclass
class _Moving:
    """A cycle's memo: :func:`_moves` once computed."""

    by_job: dict[str, list[Instance]] | None = None


def _moves(cycle: Cycle) -> dict[str, list[Instance]]:
    """Job id -> the live spot instances launched for it while it runs on on-demand machines
    (those that will take it when it moves)."""
    kept = cycle.memo(_Moving)
    memo = kept.by_job
    if memo is None:
        ondemand = {i.node_id for i in cycle.snap.instances if i.state is InstanceState.READY
                    and i.node_id and _ONDEMAND in i.offer_id}
        running = {j.id: j for j in cycle.snap.active
                   if j.node_ids and set(j.node_ids) <= ondemand}
        memo = {}
        for i in cycle.snap.instances:
            if not i.ended and ":spot/" in i.offer_id and len(i.for_jobs) == 1 \
                    and i.for_jobs[0] in running:
                memo.setdefault(i.for_jobs[0], []).append(i)
        kept.by_job = memo
    return memo



def _free(cycle: Cycle, inst: Instance, job: Job) -> bool:
    """Is the spot machine up, with nothing on it and nothing started there this cycle?"""
    if cycle.snap.allocated.get(inst.node_id):
        return False
    if any(a.node_id == inst.node_id for s in cycle.starts for a in s.allocations):
        return False
    node = cycle.snap.node_by_id.get(inst.node_id)
    return node is not None and len(node.allocatable) >= job.res.gpus


def _launch(cycle: Cycle, job: Job, held: list[Instance], cfg: Mapping[str, Any],
            costs: CostModel, room: dict[tuple[str, str], float]) -> None:
    """Launch spot for ``job`` (one instance a node) if moving there gains the most."""
    cls = may_burst(cycle, job)
    if cls is None or not cls.spot_allowed:
        return
    offers = offers_by_id(cycle)
    here = offers.get(held[0].offer_id)
    nodes = len(held)
    unknown = float(cfg["unknown_runtime_s"])
    remaining = cycle.end_of(job) - cycle.now
    if here is None or not math.isfinite(remaining):
        return
    run_here = runtime_on(cycle, job, here.gpu_model, unknown)
    best: tuple[float, Offer] | None = None
    for o in cycle.snap.offers:
        if o.market.value != "spot" or not holds(o, job) or not market_allowed(o, job, cls):
            continue
        limit = job.spec.max_price_per_hour
        if limit is not None and job_share_per_hour(o, job) > limit:
            continue
        if room.get((o.provider, o.region), math.inf) < o.gpu_count * nodes:
            continue
        ratio = runtime_on(cycle, job, o.gpu_model, unknown) / max(run_here, 1e-9)
        lost = costs.checkpoint_interval_s / 2
        gain = move_gain(remaining, ratio, sum(h.price_per_hour for h in held),
                         o.price_per_hour * nodes, costs.boot(o), costs.restart_s,
                         costs.rate(o) * nodes, lost)
        if gain > float(cfg["spot_move_min_gain_usd"]) and (best is None or gain > best[0]):
            best = (gain, o)
    if best is None:
        return
    o = best[1]
    room[(o.provider, o.region)] = room.get((o.provider, o.region), math.inf) \
        - o.gpu_count * nodes
    cycle.launches.append(Launch(o.id, nodes, request_id([job.id], {job.id: job}, cycle.now),
                                 (job.id,)))
