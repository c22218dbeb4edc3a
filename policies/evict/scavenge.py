"""Scavenging: a job that would outlive the reservation may still use the reserved GPUs if it
is preemptible and checkpoints; it is evicted (SIGTERM, grace, requeue) when the reservation
is due, so the reservation holds and its GPUs do not sit idle while they drain.

Not when the reservation is due within ``min_runtime_s`` (the job would barely run). When the
reservation is due and the holder does not fit on the devices free or being freed, as few
scavengers as make room are evicted (the victim rule of :mod:`policies.evict.preemption`), with the
kind ``scavenge``.
"""

from __future__ import annotations

from broker.cycle.plan import Preempt
from broker.model import Allocation, Job, Reason
from broker.model.state import EvictionKind, JobState
from policies.cycle import Cycle, deciding
from policies.evict import base as E
from policies.evict.preemption import choose
from policies.registry import register


@register("evict", "scavenge")
class Scavenge(E.Evictor):
    def may_use_reserved(self, cycle: Cycle, job: Job) -> bool:
        return job.priority in cycle.preemptible and job.spec.checkpoint_dir is not None

    def use_reserved(self, cycle: Cycle, job: Job) -> tuple[Allocation, ...] | None:
        sh = cycle.shadow
        if (sh is None or not self.may_use_reserved(cycle, job)
                or sh.reservation.start_at - cycle.now < cycle.snap.min_runtime_s):
            return None
        allocs = cycle.index.find(job.res, job.spec.sites, horizon=cycle.horizon,
                                  end=cycle.now + min(cycle.estimate(job), 1e9))
        if allocs is not None and any(a.node_id in sh.cap for a in allocs):
            sh.scavengers.append(job.id)
        return allocs

    def evict(self, cycle: Cycle) -> list[Preempt]:
        """The reservation is due: evict the jobs let into its GPUs, as few as make room."""
        sh = cycle.shadow
        if sh is None or sh.reservation.start_at > cycle.now or not sh.scavengers:
            return []
        holder = E.holder(cycle)
        if holder is None:
            return []
        with deciding(cycle, holder):
            soon = E.soon_free(cycle)
            if E.fits(cycle, holder, soon):
                return []
            ids = set(sh.scavengers)
            pool = [j for j in cycle.snap.active
                    if j.id in ids and j.state is not JobState.STOPPING]
            chosen = choose(holder, cycle.index, soon, E.victims(cycle, pool), lambda v: True)
            if not chosen:
                return []
            cycle.pending[holder.id] = Reason("Resources", "its reservation is due: evicting "
                                              f"{len(chosen)} job(s) that used its GPUs meanwhile")
            return [Preempt(v.job.id, v.job.attempt, f"backfill window closed: the reservation of "
                            f"{holder.id} is due", cycle.snap.grace_s, EvictionKind.SCAVENGE,
                            holder.id)
                    for v in chosen]
        return []  # (it failed on the holder: set aside)
