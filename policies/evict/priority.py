"""Class preemption and quota reclaim: the ``priority`` evictor.

A blocked job whose class may preempt evicts running jobs of lower-ranked preemptible
classes; a blocked job whose team is below its guaranteed GPUs (``quota_gpus``) reclaims them
from teams above theirs. Both are one pass over the first :data:`MAX_PREEMPTORS` blocked jobs
in queue order, because they share what has been taken already: a job that may do both uses
either rule per victim. Victims are chosen by the rule of :mod:`policies.evict.preemption` (running,
preemptible, started at least ``min_runtime_s`` ago; fewest, least work lost, ...). Each
eviction's kind says which rule allowed it (``priority`` or ``quota``).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice

from broker.cycle.plan import Preempt
from broker.model import Job, Reason
from broker.model.state import EvictionKind, JobState
from policies.cycle import Cycle, deciding
from policies.evict import base as E
from policies.evict.preemption import Victim, choose
from policies.order.fairshare import gpus_in_use
from policies.registry import register

MAX_PREEMPTORS = 8  # blocked jobs that may look for victims in one cycle


@register("evict", "priority")
class Priority(E.Evictor):
    """Class preemption and quota reclaim (see the module docstring)."""

    def evict(self, cycle: Cycle) -> list[Preempt]:
        snap, now = cycle.snap, cycle.now
        quota = {t.name: t.quota_gpus for t in snap.teams if t.quota_gpus}
        in_use = gpus_in_use(snap) if quota else {}
        may = {c.name for c in snap.classes if c.may_preempt}
        if not may and not quota:
            return []
        wanting = (j for j in cycle.blocked if j.priority in may or in_use.get(j.team, 0)
                   + j.res.total_gpus <= quota.get(j.team, 0)) if quota else (
            j for j in cycle.blocked if j.priority in may)
        preemptors = list(islice(wanting, MAX_PREEMPTORS))
        if not preemptors:
            return []
        soon = E.soon_free(cycle)
        pool = [j for j in snap.active
                if j.state is JobState.RUNNING and j.priority in cycle.preemptible
                and j.started_at is not None and now - j.started_at >= snap.min_runtime_s]
        victims = E.victims(cycle, pool)
        taken = {p.job_id for p in cycle.evictions}
        out: list[Preempt] = []
        for job in preemptors:
            with deciding(cycle, job):
                if E.fits(cycle, job, soon):  # room is already being made for it
                    E.claim(cycle, job, soon)
                    cycle.pending[job.id] = Reason("Preempting", "waiting for evicted jobs to stop")
                    continue
                by_class = job.priority in may
                chosen = choose(job, cycle.index, soon, victims,
                                _allowed(cycle, job, by_class, quota, in_use, taken))
                if chosen is None:
                    continue
                for v in chosen:
                    taken.add(v.job.id)
                    for nid, per in v.devices.items():
                        for kind, n in per.items():
                            soon[nid][kind] += n
                    out.append(Preempt(v.job.id, v.job.attempt,
                                       f"preempted by {job.id} ({job.priority}, team {job.team})",
                                       snap.grace_s, _kind(cycle, job, by_class, v.job), job.id))
                E.claim(cycle, job, soon)
                code = "Preempting" if by_class else "Quota"
                cycle.pending[job.id] = Reason(code, f"evicting {len(chosen)} job(s) to make room: "
                                                     + ", ".join(v.job.id for v in chosen))
        return out


def _kind(cycle: Cycle, job: Job, by_class: bool, victim: Job) -> EvictionKind:
    lower = cycle.rank.get(victim.priority, 0) < cycle.rank.get(job.priority, 0)
    return EvictionKind.PRIORITY if by_class and lower else EvictionKind.QUOTA


def _allowed(cycle: Cycle, job: Job, by_class: bool, quota: dict[str, int],
             in_use: dict[str, int], taken: set[str]) -> Callable[[Victim], bool]:
    rank = cycle.rank
    my_rank = rank.get(job.priority, 0)
    reclaim = in_use.get(job.team, 0) + job.res.total_gpus <= quota.get(job.team, 0)

    def ok(v: Victim) -> bool:
        if v.job.id in taken or (v.job.team == job.team and not by_class):
            return False
        if by_class and rank.get(v.job.priority, 0) < my_rank:
            return True
        return reclaim and in_use.get(v.job.team, 0) > quota.get(v.job.team, 0)

    return ok
