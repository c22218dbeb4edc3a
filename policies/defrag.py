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
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.model import Job
from broker.state import JobState
from policies.placement import FreeIndex, Kind
from policies.preemption import Victim, take_until_fits

MOVED = "moved to make whole nodes for"  # how a move's preemption reason starts


def was_moved(job: Job) -> bool:
    """Was the job's last stop a move by defragmentation?"""
    for h in reversed(job.history):
        if h.state is JobState.STOPPING:
            return h.reason.startswith(MOVED)
    return False


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


__all__ = ["MOVED", "Landing", "plan_landings", "plan_moves", "was_moved"]
