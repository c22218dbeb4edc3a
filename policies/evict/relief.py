"""Relief: a short job starved far past its runtime may make room by evicting long
checkpointable jobs, when what it gains outweighs what they lose many times over.

EASY backfill gives the first blocked job a reservation at the time enough GPUs of one model
free up on enough nodes. When every node is held by jobs running for days, a wide job that runs
for minutes gets a reservation days away: a 32-GPU job of 6 minutes may wait 30 hours, a
slowdown of 300, while evicting the 1-GPU jobs of 20 hours on its four nodes would cost each of
them a checkpoint and a wait of about 6 minutes (a slowdown of 1.005). Defragmentation cannot
help on a full cluster (the moved jobs have nowhere to land), and class preemption does not
apply between jobs of the same class. This is the trade that Tiresias (Gu et al., NSDI 2019)
and Gandiva's time-slicing (Xiao et al., OSDI 2018) make for deep-learning jobs, which
checkpoint: a job that has had little service goes ahead of one that has had much, by
preemption. Spillway makes it only where the trade is lopsided, by a documented test:

- only for the job holding the reservation (one per cycle), when nothing else is being evicted
  or moved in the cycle, and when its reservation is at least ``defrag_min_gain_s`` away;
- its *gain* is the slowdown it is spared: ``(reservation start - now - grace) / e``, with
  ``e`` its runtime estimate (at least ``min_estimate_s``); it must be at least
  ``relief_slowdown``;
- victims: running, checkpointable, of a preemptible class of any rank (the classes that share
  spillway's queue are not ranked against each other there, so neither are they here),
  started at least ``min_runtime_s`` ago (no thrashing) and not expected to end within
  ``defrag_min_gain_s`` anyway; chosen by the preemption rule's order
  (``policies/evict/preemption.py``:
  fewest victims, least work lost, ...);
- each victim's *cost* is the slowdown it takes by waiting for the holder: ``(e + grace) / r``,
  with ``r`` its own runtime estimate; the eviction happens only if the gain is at least
  ``relief_ratio`` times the victims' summed cost;
- a victim is evicted like any preempted job (SIGTERM, grace to checkpoint, requeue with its
  attempt raised and ``SPILLWAY_RESUME=1``), with the eviction kind ``relief``, and it goes
  back to the front of the queue, right after the reservation holder (as jobs moved by
  defragmentation do), so it restarts as soon as GPUs free up: usually on the same GPUs, when
  the holder ends.

The test is deterministic and knows nothing of sites: it holds on cloud nodes as on-prem.

Registered as the ``relief`` evictor; it acts only when no evictor before it in the list
evicted anything this cycle. Its settings (``policy_settings: {relief: {...}}``):
``relief_slowdown`` (20; 0 turns it off), ``relief_ratio`` (10), ``min_gain_s`` (600: the
reservation's minimum distance, and the least a victim must still have to run) and
``min_estimate_s`` (60: the floor of every runtime estimate in the test).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from broker.cycle.plan import Preempt
from broker.model import Job, Reason
from broker.model.state import RESUMES_FIRST, EvictionKind, JobState
from policies.cycle import Cycle, deciding
from policies.evict import base as E
from policies.evict.preemption import choose
from policies.reasons import dur
from policies.registry import register

RELIEF_DEFAULTS = {"relief_slowdown": 20.0, "relief_ratio": 10.0, "min_gain_s": 600.0,
                   "min_estimate_s": 60.0}


def resumes_first(job: Job) -> bool:
    """Was the job requeued by a move (defragmentation) or by relief? Either way it lost its
    GPUs only for another job's sake, and it goes back to the front of the queue."""
    if job.attempt <= 1:
        return False
    for h in reversed(job.history):
        if h.state is JobState.STOPPING:
            return h.kind in RESUMES_FIRST
    return False


def gain(start_at: float, now: float, grace_s: float, estimate_s: float) -> float:
    """The slowdown a holder is spared by starting after ``grace_s`` instead of at its
    reservation's start."""
    return max(0.0, start_at - now - grace_s) / estimate_s


def cost(holder_estimate_s: float, grace_s: float, victim_estimates: Iterable[float]) -> float:
    """The slowdown the victims take in all: each waits about the holder's runtime and a
    grace period, against its own runtime."""
    return sum((holder_estimate_s + grace_s) / r for r in victim_estimates)


def worth_it(gain_: float, cost_: float, min_slowdown: float, ratio: float) -> bool:
    """The relief test: a large enough gain, and at least ``ratio`` times the cost."""
    return gain_ >= min_slowdown and gain_ >= ratio * cost_


@register("evict", "relief", settings=RELIEF_DEFAULTS)
class Relief(E.Evictor):
    """The reservation holder, a short job starved far past its runtime, evicts long
    checkpointable jobs when it gains many times what they lose (the module docstring)."""

    acts_on_arrival = True

    def evict(self, cycle: Cycle) -> list[Preempt]:
        sh, snap, now = cycle.shadow, cycle.snap, cycle.now
        if sh is None or cycle.evictions:
            return []
        s = cycle.settings("relief")
        min_sd, ratio = float(s["relief_slowdown"]), float(s["relief_ratio"])
        floor, far = float(s["min_estimate_s"]), float(s["min_gain_s"])
        start = sh.reservation.start_at
        if min_sd <= 0 or start - now < far:
            return []
        holder = E.holder(cycle)
        if holder is None:
            return []
        with deciding(cycle, holder):
            est = max(floor, min(cycle.estimate(holder), 1e9))
            spared = gain(start, now, snap.grace_s, est)
            if spared < min_sd:
                return []
            soon = E.soon_free(cycle)
            if E.fits(cycle, holder, soon):  # room is already being made for it
                return []
            pool: list[Job] = []
            young: list[Job] = []
            for j in snap.active:
                if (j.state is JobState.RUNNING and j.priority in cycle.preemptible
                        and j.spec.checkpoint_dir is not None and j.started_at is not None
                        and cycle.end_of(j) - now >= far):
                    (pool if now - j.started_at >= snap.min_runtime_s else young).append(j)
            chosen = choose(holder, cycle.index, soon, E.victims(cycle, pool),
                            lambda v: True) if pool else None
            if not chosen:
                # jobs too young to evict now may make room later: say when (the holder's gain
                # only shrinks meanwhile, so not past the time it falls below the threshold)
                last = start - snap.grace_s - min_sd * est
                soonest = min((j.started_at + snap.min_runtime_s for j in young
                               if j.started_at is not None), default=math.inf)
                if soonest <= last:
                    cycle.wake_at = soonest
                return []
            lost = cost(est, snap.grace_s, (max(floor, min(cycle.estimate(v.job), 1e9))
                                            for v in chosen))
            if not worth_it(spared, lost, min_sd, ratio):
                return []
            ids = ", ".join(v.job.id for v in chosen)
            cycle.pending[holder.id] = Reason(
                "Resources", f"first in line; its reservation is {dur(start - now)} away, "
                             f"{spared:.0f}x its expected runtime: evicting {len(chosen)} long "
                             f"checkpointable job(s) that lose far less: {ids}")
            return [Preempt(v.job.id, v.job.attempt,
                            f"yielded to {holder.id}, which had waited {spared:.0f}x its "
                            "runtime: restarts from its checkpoint ahead of the queue",
                            snap.grace_s, EvictionKind.RELIEF, holder.id)
                    for v in chosen]
        return []  # (it failed on the holder: set aside)


__all__ = ["Relief", "cost", "gain", "resumes_first", "worth_it"]
