"""EASY backfill (Lifka 1995; Mu'alem and Feitelson, IEEE TPDS 2001).

The top blocked job gets a reservation: the earliest time enough GPUs of one model free up on
enough nodes, given when running jobs are expected to end. A later job may start now only if
it does not delay that reservation: it ends before the reservation starts (by its estimate), or
it uses only GPUs the reserved job will not need (other nodes, or the reserved nodes' extra).
A job that outruns its estimate is not killed: the next cycle recomputes the reservation.

The reservation being honoured (:class:`Shadow`) and the release :data:`Profile` are
policies/place/capacity.py's, the role's interface (:class:`Reserver`) policies/cycle.py's;
all three are importable from here too.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable

from broker.cycle.plan import Reservation
from broker.model import Allocation, Job, Resources
from broker.model.fit import Kind
from policies.cycle import Cycle, Reserver
from policies.place.capacity import FreeIndex, Profile, Shadow
from policies.registry import register

__all__ = ["Easy", "Profile", "Reserver", "Shadow", "Strict", "guard", "guards_allow",
           "outlived", "release_profile", "reserve"]


def release_profile(index: FreeIndex,
                    running: Iterable[tuple[tuple[Allocation, ...], float]]) -> Profile:
    """When each node's busy devices are expected back, by kind, soonest first."""
    kinds, uniform = index.kinds_by_gpu, index.uniform
    acc: dict[str, dict[Kind, dict[float, int]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(int)))
    for allocs, end in running:
        for a in allocs:
            node_kinds = kinds.get(a.node_id)
            if node_kinds is None or not a.gpu_ids:
                continue
            one = uniform.get(a.node_id)
            if one is not None and a.gpu_ids[0] in node_kinds:  # one kind there: count at once
                acc[a.node_id][one][end] += len(a.gpu_ids)
                continue
            for gid in a.gpu_ids:
                kind = node_kinds.get(gid)
                if kind is not None:
                    acc[a.node_id][kind][end] += 1
    return {nid: {k: sorted(ends.items()) for k, ends in per.items()}
            for nid, per in acc.items()}


HostProfile = dict[str, list[tuple[float, float, float]]]  # node -> [(end, CPUs, memory)]


def host_profile(running: Iterable[tuple[Job, float]]) -> HostProfile:
    """When each node's CPUs and memory held by running jobs are expected back, soonest
    first (jobs that ask for neither are left out)."""
    acc: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for job, end in running:
        if job.spec.cpus or job.spec.memory_gb:
            done = {r for r, _ in job.parts_exited}
            for a in job.allocations:
                if a.rank not in done:
                    acc[a.node_id].append((end, job.spec.cpus, job.spec.memory_gb))
    return {nid: sorted(v) for nid, v in acc.items()}


def _host_at(f: object, res: Resources, now: float, released: list[tuple[float, float, float]]
             ) -> float:
    """When the node has CPUs and memory for ``res``: now, the end that frees enough, or inf."""
    cpus, mem = f.cpus, f.mem  # type: ignore[attr-defined]
    if cpus >= res.cpus and mem >= res.memory_gb:
        return now
    for end, c, m in released:
        cpus, mem = cpus + c, mem + m
        if cpus >= res.cpus and mem >= res.memory_gb:
            return max(now, end)
    return math.inf


def reserve(job: Job, index: FreeIndex, profile: Profile, now: float,
            hosts: HostProfile | Callable[[], HostProfile] | None = None) -> Shadow | None:
    """The earliest reservation for ``job``, or None if it can never be computed (jobs with
    no limit and no estimate hold the GPUs it needs). ``hosts``: when running jobs give back
    CPUs and memory (a node short of them now is ready once enough are back), or a function
    that computes it (called only if a node is short)."""
    res = job.res
    made: list[HostProfile] = []

    def released(nid: str) -> list[tuple[float, float, float]]:
        if hosts is None:
            return []
        if not made:
            made.append(hosts() if callable(hosts) else hosts)
        return made[0].get(nid, [])

    best: tuple[float, Kind, list[str]] | None = None
    for kind in index.wanted(res):
        ready: list[tuple[float, str]] = []
        for nid, f in index.nodes.items():
            if not index.site_ok(f, job.spec.sites):
                continue
            host_at = now if f.cpus >= res.cpus and f.mem >= res.memory_gb \
                else _host_at(f, res, now, released(nid))
            if not math.isfinite(host_at):
                continue
            have = len(f.devices.get(kind, ()))
            at = now if have >= res.gpus else math.inf
            if at > now:
                for end, count in profile.get(nid, {}).get(kind, ()):
                    have += count
                    if have >= res.gpus:
                        at = max(now, end)
                        break
            if math.isfinite(at):
                ready.append((max(at, host_at), nid))
        if len(ready) < res.nodes:
            continue
        ready.sort()
        start = ready[res.nodes - 1][0]
        if best is None or start < best[0]:
            best = (start, kind, [nid for _, nid in ready[: res.nodes]])
    if best is None:
        return None
    start, kind, nodes = best
    cap = {}
    for nid in nodes:
        free_then = len(index.nodes[nid].devices.get(kind, ())) + sum(
            c for end, c in profile.get(nid, {}).get(kind, ()) if end <= start)
        cap[nid] = max(0, free_then - res.gpus)
    return Shadow(Reservation(job.id, start, tuple(nodes), kind[0]), kind, cap)


def guard(cycle: Cycle, job: Job, long: bool) -> None:
    """Give a blocked job behind the head a guard, if the reserve policy protects it, it
    would not outlive the head's reservation (else the head drains those GPUs first), and
    fewer guards than its limit are held."""
    r = cycle.reserver
    if long or len(cycle.guards) >= r.max_guards(cycle) or not r.protects(cycle, job):
        return
    shadow = cycle.reserve(job)
    if shadow is not None and math.isfinite(shadow.reservation.start_at):
        cycle.guards.append(shadow)


def outlived(cycle: Cycle, job: Job) -> list[Shadow]:
    """The guards ``job`` would still run at the start of."""
    est = cycle.estimate(job)
    return [g for g in cycle.guards if not g.allows(cycle.now, est)]


def guards_allow(cycle: Cycle, guards: list[Shadow], allocs: Iterable[Allocation]) -> bool:
    """Do these allocations leave each guard the GPUs it needs (its ``cap``)?"""
    kinds = cycle.index.kinds_by_gpu
    for a in allocs:
        node_kinds = kinds.get(a.node_id, {})
        for g in guards:
            cap = g.cap.get(a.node_id)
            if cap is not None and sum(1 for gid in a.gpu_ids
                                       if node_kinds.get(gid) == g.kind) > cap:
                return False
    return True


@register("reserve", "easy", settings={"backfill_relax": 0.0})
class Easy(Reserver):
    """EASY backfill (the module docstring). Setting ``backfill_relax`` (0): a backfilled job
    may end up to this x the head's wait past the reservation's start (relaxed backfill)."""

    def reserve(self, cycle: Cycle, job: Job, profile: Profile) -> Shadow | None:
        def hosts() -> HostProfile:  # when running jobs give CPUs and memory back (if asked)
            return host_profile([(j, cycle.end_of(j)) for j in cycle.snap.active]
                                + cycle.started)

        shadow = reserve(job, cycle.index, profile, cycle.now, hosts)
        relax = float(cycle.settings("easy")["backfill_relax"])
        if shadow is not None and relax > 0:
            shadow.slack_s = relax * max(0.0, cycle.now - job.submitted_at)
        return shadow


@register("reserve", "strict")
class Strict(Reserver):
    """No reservation and no backfill: the first blocked job blocks every later one."""

    strict = True

    def reserve(self, cycle: Cycle, job: Job, profile: Profile) -> Shadow | None:
        del cycle, job, profile
        return None
