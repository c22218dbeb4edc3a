"""The evict role: what an evictor may do in a cycle, and what every evictor shares.

A PolicySet names an ordered list of evictors (``evict: [scavenge, priority, move, relief]``).
Each may act at three points of the cycle:

- ``before_place``: before the queue is walked (a move keeps free GPUs for the jobs it is
  moving while they checkpoint);
- ``head_blocked``: when the first job that cannot be placed is found, before backfill (a move
  plans where the moved jobs land and keeps those GPUs);
- ``evict``: after placement, in list order; it sees the evictions of the evictors before it
  (``cycle.evictions``) and returns its own, each with its :class:`EvictionKind`.

An evictor may also let a job that would outlive the reservation use the reserved GPUs until
the reservation is due (``may_use_reserved`` / ``use_reserved``: scavenging).

Victims are chosen by the one rule of :mod:`policies.evict.preemption` (``make_victims`` and
``choose``), whatever the evictor.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from broker.model import Job
from broker.model.fit import Kind
from broker.model.state import JobState
from policies.cycle import Cycle
from policies.cycle import Evictor as Evictor  # (the role's interface, where evictors look)
from policies.evict.preemption import Victim, make_victims, victim_key

SoonFree = dict[str, dict[Kind, int]]  # node -> kind -> devices free or being freed


def soon_free(cycle: Cycle) -> SoonFree:
    """Free devices plus those held by jobs already stopping for a preemption."""
    kinds = cycle.index.kinds_by_gpu
    soon: SoonFree = defaultdict(lambda: defaultdict(int))
    for nid, f in cycle.index.nodes.items():
        for k, devs in f.devices.items():
            soon[nid][k] += len(devs)
    for job in cycle.snap.active:
        if job.state is JobState.STOPPING and job.stop_target is JobState.PREEMPTED:
            for a in job.allocations:
                for gid in a.gpu_ids:
                    kind = kinds.get(a.node_id, {}).get(gid)
                    if kind is not None:
                        soon[a.node_id][kind] += 1
    return soon


def fits(cycle: Cycle, job: Job, soon: SoonFree) -> bool:
    """Would ``job`` fit on the devices free or being freed, on nodes of a site it may use
    (its ``sites``: a job kept off spot does not wait for a spot machine's GPUs) whose CPUs
    and memory, free or being freed, hold it too?"""
    res = job.res
    host = _host_soon(cycle) if res.cpus or res.memory_gb else None
    usable = _usable(cycle, job, soon)
    return any(sum(1 for nid in usable if soon[nid].get(k, 0) >= res.gpus and (
        host is None or (host[nid][0] >= res.cpus and host[nid][1] >= res.memory_gb)))
        >= res.nodes for k in cycle.index.wanted(res))


def _usable(cycle: Cycle, job: Job, soon: SoonFree) -> list[str]:
    """The nodes of ``soon`` on a site ``job`` may run on."""
    nodes, sites = cycle.index.nodes, job.spec.sites
    return [nid for nid in soon if nid in nodes and cycle.index.site_ok(nodes[nid], sites)]


@dataclass
class _HostSoon:
    """A cycle's memo: :func:`_host_soon` once computed."""

    by_node: dict[str, tuple[float, float]] | None = None


def _host_soon(cycle: Cycle) -> dict[str, tuple[float, float]]:
    """Node -> (CPUs, memory) free or held by jobs already stopping for a preemption (once
    per cycle)."""
    memo = cycle.memo(_HostSoon)
    out = memo.by_node
    if out is None:
        acc = {nid: [f.cpus, f.mem] for nid, f in cycle.index.nodes.items()}
        for job in cycle.snap.active:
            if job.state is JobState.STOPPING and job.stop_target is JobState.PREEMPTED:
                for a in job.allocations:
                    if a.node_id in acc:
                        acc[a.node_id][0] += job.spec.cpus
                        acc[a.node_id][1] += job.spec.memory_gb
        out = memo.by_node = {nid: (c, m) for nid, (c, m) in acc.items()}
    return out


def claim(cycle: Cycle, job: Job, soon: SoonFree) -> None:
    """Count the devices ``job`` will take out of ``soon`` (so the next job does not)."""
    res = job.res
    usable = _usable(cycle, job, soon)
    for k in cycle.index.wanted(res):
        nodes = sorted((soon[n].get(k, 0), n) for n in usable if soon[n].get(k, 0) >= res.gpus)
        if len(nodes) >= res.nodes:
            for _, nid in nodes[: res.nodes]:
                soon[nid][k] -= res.gpus
            return


def victims(cycle: Cycle, pool: Iterable[Job]) -> list[Victim]:
    """``pool`` as victims, in the one victim order (policies/evict/preemption.py)."""
    rank, now, grace = cycle.rank, cycle.now, cycle.snap.grace_s
    return make_victims(pool, cycle.index.kinds_by_gpu,
                        lambda j: victim_key(j, rank.get(j.priority, 0), now, grace))


def holder(cycle: Cycle) -> Job | None:
    """The blocked job that holds this cycle's reservation, if any."""
    sh = cycle.shadow
    if sh is None:
        return None
    return next((j for j in cycle.blocked if j.id == sh.reservation.job_id), None)
