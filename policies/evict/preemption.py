"""Preemption: the smallest set of running jobs whose eviction makes room for a blocked job.

One rule for every site. A job may evict another when its class may preempt and the victim's
class is lower-ranked and preemptible, or when its team is below its guaranteed quota and the
victim's team is above its own (reclaiming a quota others borrowed; the victim's class must be
preemptible). A job that started less than ``min_runtime_s`` ago is never a victim (no
thrashing). Two other evictions use the same victim order, for the reservation holder only:
defragmentation moves (policies/evict/defrag.py) and relief (policies/evict/relief.py).

Victims are tried in a documented, deterministic order (after Kubernetes' preemption, which
likewise prefers the fewest, lowest-priority, most recently started victims):
checkpointable first, then least work lost (GPU-seconds since the attempt started; a
checkpointing job loses only its grace period), then lowest class rank, then youngest, then id.
On each node the victims are taken in that order until the job fits (its GPUs, and its CPUs
and memory where the node is short of them: a victim frees its own), then any victim the job
does not need after all is spared again, latest first. The nodes needing the fewest victims
(then the least work lost) are chosen.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.model import Job
from broker.model.fit import Kind
from policies.place.capacity import FreeIndex


@dataclass(frozen=True)
class Victim:
    job: Job
    key: tuple[object, ...]
    lost: float  # GPU-seconds of work its eviction throws away
    devices: dict[str, dict[Kind, int]]  # node -> kind -> devices it frees there


def victim_key(job: Job, rank: int, now: float,
               grace_s: float) -> tuple[bool, float, int, float, str]:
    checkpointable = job.spec.checkpoint_dir is not None
    start = job.started_at if job.started_at is not None else now
    elapsed = max(0.0, now - start)
    lost = job.res.total_gpus * (min(elapsed, grace_s) if checkpointable else elapsed)
    return (not checkpointable, lost, rank, -start, job.id)


def make_victims(jobs: Iterable[Job], kinds: dict[str, dict[str, Kind]],
                 key: Callable[[Job], tuple[bool, float, int, float, str]]) -> list[Victim]:
    out = []
    for job in jobs:
        devices: dict[str, dict[Kind, int]] = defaultdict(lambda: defaultdict(int))
        done = {r for r, _ in job.parts_exited}
        for a in job.allocations:
            if a.rank in done:
                continue
            for gid in a.gpu_ids:
                kind = kinds.get(a.node_id, {}).get(gid)
                if kind is not None:
                    devices[a.node_id][kind] += 1
        k = key(job)
        out.append(Victim(job, k, k[1], {n: dict(d) for n, d in devices.items()}))
    out.sort(key=lambda v: v.key)
    return out


def take_until_fits(have: int, need: int, offers: Iterable[tuple[Victim, int]]
                    ) -> list[Victim] | None:
    """On one node: take ``offers`` (victim, devices it frees there), in order, until ``have``
    free devices reach ``need``, then spare any not needed after all, latest first; None if
    they never reach it. ``offers`` is consumed lazily: nothing past the fit is looked at."""
    chosen: list[tuple[Victim, int]] = []
    if have < need:
        for v, got in offers:
            chosen.append((v, got))
            have += got
            if have >= need:
                break
        else:
            return None
    for i in range(len(chosen) - 1, -1, -1):
        if have - chosen[i][1] >= need:
            have -= chosen.pop(i)[1]
    return [v for v, _ in chosen]


def take_until_host_fits(have: int, need: int, cpus_short: float, mem_short: float,
                         offers: Iterable[tuple[Victim, int]]) -> list[Victim] | None:
    """:func:`take_until_fits` on a node that is also short of CPUs or memory: victims are
    taken until the devices fit and the CPUs and memory they free (their per-node request)
    cover the shortfall; then any not needed for all three is spared, latest first."""
    chosen: list[tuple[Victim, int]] = []

    def enough(vs: list[tuple[Victim, int]]) -> bool:
        return (have + sum(g for _, g in vs) >= need
                and sum(v.job.spec.cpus for v, _ in vs) >= cpus_short
                and sum(v.job.spec.memory_gb for v, _ in vs) >= mem_short)

    if not enough(chosen):
        for offer in offers:
            chosen.append(offer)
            if enough(chosen):
                break
        else:
            return None
    for i in range(len(chosen) - 1, -1, -1):
        if enough(chosen[:i] + chosen[i + 1:]):
            chosen.pop(i)
    return [v for v, _ in chosen]


def choose(job: Job, index: FreeIndex, soon_free: dict[str, dict[Kind, int]],
           victims: list[Victim], allowed: Callable[[Victim], bool]) -> list[Victim] | None:
    """The victims to evict so that ``job`` fits, or None if no allowed set makes room.

    ``soon_free`` counts devices already free or being freed (by earlier evictions)."""
    res = job.res
    best: tuple[tuple[int, float], list[str], list[Victim]] | None = None
    for kind in index.wanted(res):
        per_node: list[tuple[tuple[int, float], str, list[Victim]]] = []
        for nid, f in index.nodes.items():
            if not index.site_ok(f, job.spec.sites):
                continue
            offers = ((v, got) for v in victims
                      if (got := v.devices.get(nid, {}).get(kind, 0)) and allowed(v))
            have = soon_free.get(nid, {}).get(kind, 0)
            if f.cpus >= res.cpus and f.mem >= res.memory_gb:
                chosen = take_until_fits(have, res.gpus, offers)
            else:  # short of CPUs or memory too: the victims free theirs
                chosen = take_until_host_fits(have, res.gpus, res.cpus - f.cpus,
                                              res.memory_gb - f.mem, offers)
            if chosen is None:
                continue
            cost = (len(chosen), sum(v.lost for v in chosen))
            per_node.append((cost, nid, chosen))
        if len(per_node) < res.nodes:
            continue
        per_node.sort(key=lambda t: (t[0], sorted(v.key for v in t[2]), t[1]))
        picked = per_node[: res.nodes]
        union: dict[str, Victim] = {}
        for _, _, vs in picked:
            union.update({v.job.id: v for v in vs})
        total = (len(union), sum(v.lost for v in union.values()))
        if best is None or total < best[0]:
            best = (total, [nid for _, nid, _ in picked], list(union.values()))
    return None if best is None else best[2]
