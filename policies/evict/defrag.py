"""Defragmentation by checkpoint migration: make whole nodes for a wide job out of scattered
free GPUs.

A job that needs 8 GPUs on one node can wait for hours while 8 or more GPUs sit free, split
across nodes that each run a small job. EASY backfill cannot help (nothing behind the job fits
in the holes either, when only wide jobs wait), and waiting for the small jobs to end drains the
cluster. Spillway instead *moves* small jobs: it evicts them with SIGTERM so they checkpoint,
and they restart at once on the free GPUs of other nodes (attempt + 1, ``SPILLWAY_RESUME=1``),
which leaves whole nodes for the wide job. It is the migration of Gandiva (Xiao et al., OSDI
2018) done with the checkpoint-restart that preemption already uses.

The rule, deterministic and the same on every site:

- only for the job holding the reservation (the first blocked job), when its reservation is at
  least ``min_gain_s`` away (a move costs a checkpoint and a restart; it must buy more);
- movable jobs: running, of a preemptible class, checkpointable, single-node, whole GPUs,
  started at least the minimum runtime ago (a job just moved is not moved again: no thrashing),
  and not expected to end within ``min_gain_s`` anyway;
- on each node, movable jobs are taken in the preemption victim order (checkpointable first,
  least work lost, lowest rank, youngest, id) until the wide job fits, then any not needed are
  spared; the nodes that need the fewest moved GPUs (then the fewest jobs, then the victim
  order) are chosen;
- every moved job must fit *now* on the free GPUs of the other nodes (of a type it allows),
  packed largest first, best fit; otherwise nothing moves.

The cycle plans the moves as soon as the holder is found blocked, before backfill (which would
take the free GPUs the moved jobs need), keeps the landing GPUs out of backfill, and moves the
reservation to the nodes being freed; while a moved job checkpoints, later cycles keep free
GPUs for it, and once requeued it restarts right after the holder (:func:`was_moved`).

Registered as the ``move`` evictor; its setting (``policy_settings: {move: {...}}``):
``defrag_min_gain_s`` (600), the ``min_gain_s`` above.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from broker.cycle.plan import Preempt
from broker.model import Allocation, Job, Reason
from broker.model.fit import Kind
from broker.model.state import EvictionKind, JobState
from policies.cycle import Cycle
from policies.evict import base as E
from policies.evict.preemption import Victim, take_until_fits
from policies.place.capacity import FreeIndex
from policies.registry import register

MOVE_DEFAULTS = {"defrag_min_gain_s": 600.0}


def was_moved(job: Job) -> bool:
    """Was the job's last stop a move by defragmentation?"""
    for h in reversed(job.history):
        if h.state is JobState.STOPPING:
            return h.kind is EvictionKind.MOVE
    return False


@dataclass
class _Planned:
    """A cycle's memo: the reservation holder and the jobs planned to move for it."""

    moves: tuple[Job, list[Victim]] | None = None


@register("evict", "move", settings=MOVE_DEFAULTS)
class Move(E.Evictor):
    """Defragmentation moves for the reservation holder (see the module docstring)."""

    def before_place(self, cycle: Cycle) -> None:
        """Jobs being moved restart on free GPUs once they have checkpointed: keep free GPUs
        for them meanwhile (off the reserved nodes), so that backfill does not take them."""
        stopping, requeued = JobState.STOPPING, JobState.PREEMPTED  # (not if since cancelled)
        moving = [j for j in cycle.snap.active if j.state is stopping
                  and j.stop_target is requeued and was_moved(j)]
        if not moving:
            return
        sh = cycle.snap.reservation
        off = set(sh.node_ids) if sh is not None else set()
        index = cycle.index
        only = {nid for nid in index.nodes if nid not in off}
        for j in sorted(moving, key=lambda j: (-j.res.gpus, j.id)):
            allocs = index.find(j.res, j.spec.sites, only=only)
            if allocs is not None:
                index.take(allocs, j.res)

    def head_blocked(self, cycle: Cycle, job: Job) -> None:
        """Plan the moves for the reservation holder before backfill takes the free GPUs
        they would land on, and keep those GPUs free for them."""
        planned = _plan(cycle, job)
        if not planned:
            return
        index = cycle.index
        for v, nid, kind in planned:
            devs = index.nodes[nid].devices.get(kind, [])
            if len(devs) >= v.job.res.gpus:  # (not if it lands on GPUs being freed)
                index.take((Allocation(nid, tuple(g.id for g in devs[: v.job.res.gpus]), 0),),
                           v.job.res)
        moved = [v for v, _, _ in planned]
        for v in moved:  # they free their GPUs within the grace period: reserve those
            cycle.ends[v.job.id] = cycle.now + cycle.snap.grace_s
        cycle.shadow = cycle.reserve(job) or cycle.shadow
        cycle.memo(_Planned).moves = (job, moved)

    def evict(self, cycle: Cycle) -> list[Preempt]:
        """The moves planned at the head, unless an earlier evictor is making room already."""
        planned = cycle.memo(_Planned).moves
        if planned is None or cycle.evictions:
            return []
        holder, moved = planned
        ids = ", ".join(v.job.id for v in moved)
        cycle.pending[holder.id] = Reason(
            "Resources", f"first in line; moving {len(moved)} job(s) to free GPUs on other "
                         f"nodes to make whole nodes for it: {ids}")
        return [Preempt(v.job.id, v.job.attempt, f"moved to make whole nodes for {holder.id}: "
                        "restarts from its checkpoint on free GPUs elsewhere",
                        cycle.snap.grace_s, EvictionKind.MOVE, holder.id)
                for v in moved]


def _plan(cycle: Cycle, holder: Job) -> list[Landing] | None:
    """Which small checkpointable jobs to move off the nodes the holder needs, and onto which
    free GPUs, when its reservation is far off (the rule in the module docstring)."""
    sh, snap, now, index = cycle.shadow, cycle.snap, cycle.now, cycle.index
    gain = float(cycle.settings("move")["defrag_min_gain_s"])
    if sh is None or sh.reservation.start_at - now < gain:
        return None
    # moved jobs land on free GPUs, so at least the holder's count must be free somewhere
    if index.free_devices < holder.res.total_gpus:
        return None
    soon = E.soon_free(cycle)
    if E.fits(cycle, holder, soon):  # room is already being made for it
        return None
    pool = [j for j in snap.active
            if j.state is JobState.RUNNING and j.priority in cycle.preemptible
            and j.spec.checkpoint_dir is not None and j.res.nodes == 1
            and j.res.mig_profile is None and j.started_at is not None
            and now - j.started_at >= snap.min_runtime_s
            and cycle.end_of(j) - now >= gain]
    # only nodes where the holder could fit once their movable jobs left (the same test
    # plan_landings makes per device kind; this one, on all kinds, is a cheap superset)
    need = holder.res.gpus
    on_node: dict[str, int] = defaultdict(int)
    for j in pool:
        on_node[j.allocations[0].node_id] += j.res.gpus
    pool = [j for j in pool if on_node[j.allocations[0].node_id]
            + sum(soon[j.allocations[0].node_id].values()) >= need]
    if not pool:
        return None
    return plan_landings(holder, index, soon, E.victims(cycle, pool))


Landing = tuple[Victim, str, Kind]  # a moved job, the node and the device kind it restarts on


def plan_moves(job: Job, index: FreeIndex, soon_free: Mapping[str, Mapping[Kind, int]],
               movable: list[Victim]) -> list[Victim] | None:
    """The jobs to move so that ``job`` can start on whole nodes, or None.

    ``movable`` is sorted in victim order; ``soon_free`` counts devices free or being freed."""
    planned = plan_landings(job, index, soon_free, movable)
    return None if planned is None else [v for v, _, _ in planned]


def plan_landings(job: Job, index: FreeIndex, soon_free: Mapping[str, Mapping[Kind, int]],
                  movable: list[Victim]) -> list[Landing] | None:
    """:func:`plan_moves`, with where each moved job lands."""
    res = job.res
    if not res.gpus or res.mig_profile is not None:
        return None
    on_node: dict[tuple[str, Kind], list[tuple[Victim, int]]] = {}  # in victim order
    for v in movable:
        for nid, per in v.devices.items():
            for kind, n in per.items():
                on_node.setdefault((nid, kind), []).append((v, n))
    best: tuple[tuple[int, int], list[Landing]] | None = None
    for kind in index.wanted(res):
        per_node: list[tuple[tuple[int, int], str, list[Victim]]] = []
        for nid, f in index.nodes.items():
            have = soon_free.get(nid, {}).get(kind, 0)
            here = on_node.get((nid, kind), ())
            if have + sum(n for _, n in here) < res.gpus \
                    or not index.fits_host(f, res, job.spec.sites):
                continue
            chosen = take_until_fits(have, res.gpus, here)
            if chosen is None:
                continue
            per_node.append(((sum(v.job.res.total_gpus for v in chosen), len(chosen)), nid,
                             chosen))
        if len(per_node) < res.nodes:
            continue
        per_node.sort(key=lambda t: (t[0], sorted(v.key for v in t[2]), t[1]))
        picked = per_node[: res.nodes]
        moved = [v for _, _, vs in picked for v in vs]
        if not moved:
            continue  # it fits without moving anything: placement's business, not ours
        others = {nid for nid in index.nodes} - {nid for _, nid, _ in picked}
        spots = _lands(moved, index, soon_free, others)
        if spots is None:
            continue
        cost = (sum(v.job.res.total_gpus for v in moved), len(moved))
        if best is None or cost < best[0]:
            best = (cost, [(v, spots[v.job.id][0], spots[v.job.id][1]) for v in moved])
    return None if best is None else best[1]


def _lands(moved: list[Victim], index: FreeIndex, soon_free: Mapping[str, Mapping[Kind, int]],
           nodes: set[str]) -> dict[str, tuple[str, Kind]] | None:
    """Where every moved job starts now on ``nodes``' free devices (job id -> node, kind), or
    None if one cannot. Largest first, best fit."""
    free = {nid: dict(soon_free.get(nid, {})) for nid in sorted(nodes)}
    out: dict[str, tuple[str, Kind]] = {}
    for v in sorted(moved, key=lambda v: (-v.job.res.gpus, v.job.id)):
        res = v.job.res
        wanted = index.wanted(res)
        spot: tuple[int, str, Kind] | None = None
        for nid, per in free.items():
            f = index.nodes.get(nid)
            if f is None or not index.fits_host(f, res, v.job.spec.sites):
                continue
            for kind in wanted:
                n = per.get(kind, 0)
                if n >= res.gpus and (spot is None or (n, nid) < spot[:2]):
                    spot = (n, nid, kind)
        if spot is None:
            return None
        free[spot[1]][spot[2]] -= res.gpus
        out[v.job.id] = (spot[1], spot[2])
    return out


__all__ = ["Landing", "Move", "plan_landings", "plan_moves", "was_moved"]
