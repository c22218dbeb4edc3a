"""When would a pending job start on-prem? A forecast for the burst phase (policies/burst/sla.py).

A fluid model of the on-prem GPUs a job may use (its wanted kinds on on-prem nodes): the GPUs
free now (after this cycle's starts) plus those running jobs give back at their expected ends
(``cycle.end_of``: the predictor's runtimes, overruns included), and those this cycle's
starts give back. The jobs ahead of it in the queue that compete for the same kinds take
theirs first, in queue order, each holding them for its own estimate. The reservation
holder's forecast is its reservation's start. A job for which evictions are planned this
cycle (a class that may preempt) starts once its victims have stopped (``grace_s``).

Node boundaries are ignored (GPUs of one kind are pooled), which makes the forecast
optimistic for large jobs on a fragmented cluster; the burst policy keeps a margin for it.
Cost: one pass over the running jobs and the jobs ahead, per forecast asked; the burst loop
asks through :class:`QueueForecast`, one pass over the queue per cycle and set of kinds
(asking job by job was quadratic in a deep backlog: 88% of a two-month run's time).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from broker.model import Job
from broker.model.fit import Kind
from policies.burst.evictions import preempted_for
from policies.cycle import Cycle


@dataclass
class _Kept:
    """A cycle's memo of the forecasts: each job's on-prem kinds (with the resources and
    sites they were found for), the on-prem kinds, the releases of on-prem GPUs, and
    :func:`made_room_for` (with the count of evictions it was found for)."""

    kinds_by_job: dict[str, tuple[object, object, frozenset[Kind]]] = field(
        default_factory=dict)
    kinds: frozenset[Kind] | None = None
    releases: list[tuple[float, Kind, int]] | None = None
    room_for: tuple[int, frozenset[str]] | None = None


def onprem_kinds(cycle: Cycle, job: Job) -> frozenset[Kind]:
    """The on-prem device kinds that could hold ``job`` (none when its sites allow no on-prem
    node: a cloud-only job is never forecast on-prem, nor counted ahead of others there).
    Memoised in the cycle per job (the sweeps ask it of every job they pass)."""
    memo = cycle.memo(_Kept).kinds_by_job
    hit = memo.get(job.id)
    if hit is not None and hit[0] is job.res and hit[1] is job.spec.sites:
        return hit[2]
    if "onprem" not in job.spec.sites:
        out: frozenset[Kind] = frozenset()
    else:
        out = frozenset(cycle.index.wanted(job.res)) & _onprem_kinds(cycle)
    memo[job.id] = (job.res, job.spec.sites, out)
    return out


def _onprem_kinds(cycle: Cycle) -> frozenset[Kind]:
    memo = cycle.memo(_Kept)
    if memo.kinds is None:
        memo.kinds = frozenset(k for n in cycle.snap.nodes if n.site == "onprem"
                               for k in cycle.index.kinds_by_gpu.get(n.id, {}).values())
    return memo.kinds


def _releases(cycle: Cycle) -> list[tuple[float, Kind, int]]:
    """(expected end, kind, GPUs) of every on-prem GPU held now, soonest first (once a cycle)."""
    memo = cycle.memo(_Kept)
    if memo.releases is not None:
        return memo.releases
    onprem = {n.id for n in cycle.snap.nodes if n.site == "onprem"}
    kinds = cycle.index.kinds_by_gpu
    acc: list[tuple[float, Kind, int]] = []
    running = [(j.allocations, cycle.end_of(j)) for j in cycle.snap.active]
    running += [(s.allocations, end) for s, (_, end) in zip(cycle.starts, cycle.started)]
    for allocs, end in running:
        for a in allocs:
            if a.node_id not in onprem:
                continue
            per: dict[Kind, int] = {}
            for gid in a.gpu_ids:
                k = kinds.get(a.node_id, {}).get(gid)
                if k is not None:
                    per[k] = per.get(k, 0) + 1
            acc.extend((end, k, n) for k, n in per.items())
    acc.sort(key=lambda r: r[0])
    memo.releases = acc
    return acc


def _free_now(cycle: Cycle, kinds: Collection[Kind]) -> int:
    return sum(len(f.devices.get(k, ())) for f in cycle.index.nodes.values()
               if f.node.site == "onprem" for k in kinds)


def made_room_for(cycle: Cycle) -> frozenset[str]:
    """Jobs the evictors planned preemptions for this cycle (policies/burst/evictions.py)."""
    memo = cycle.memo(_Kept)
    kept = memo.room_for
    if kept is not None and kept[0] == len(cycle.evictions):
        return kept[1]
    out = frozenset(j for j in map(preempted_for, cycle.evictions) if j is not None)
    memo.room_for = (len(cycle.evictions), out)
    return out


def onprem_start(cycle: Cycle, job: Job, ahead: Iterable[Job],
                 leaving: Collection[str] = ()) -> float:
    """The forecast on-prem start of ``job`` (see the module docstring); ``ahead``: the jobs
    before it in the queue; ``leaving``: ids among them that will not run on-prem (bursting).
    ``math.inf`` when no on-prem GPU could ever hold it, or a job ahead never ends."""
    kinds = onprem_kinds(cycle, job)
    if not kinds or _shortcut(cycle, job):
        return _one(cycle, job, 0, [], cycle.now, True)  # (inf after the shortcuts)
    queue = list(ahead)
    sw = _Sweep(cycle, kinds)
    sw.advance(queue, len(queue), leaving)
    return _one(cycle, job, sw.free, sw.ends, sw.t, sw.stuck)


def _advance(free: int, need: int, ends: list[tuple[float, int]], t: float
             ) -> tuple[int, float]:
    """Take every release due by ``t``, then later ones until ``need`` GPUs are free:
    (free GPUs, the time then). Fewer than ``need`` when the releases run out."""
    while ends and (ends[0][0] <= t or free < need):
        end, n = heapq.heappop(ends)
        t = max(t, end)
        free += n
    return free, t


def onprem_starts(cycle: Cycle, jobs: Iterable[Job], leaving: Collection[str] = ()
                  ) -> dict[str, float]:
    """:func:`onprem_start` of every job in ``jobs`` (the queue, in order) in one sweep per
    set of on-prem kinds among them, instead of one pass per job."""
    queue = list(jobs)
    out: dict[str, float] = {}
    by_kinds: dict[frozenset[Kind], list[int]] = {}
    for i, job in enumerate(queue):
        by_kinds.setdefault(onprem_kinds(cycle, job), []).append(i)
    for kinds, mine in by_kinds.items():
        if not kinds:
            out.update((queue[i].id, math.inf) for i in mine)
            continue
        sw = _Sweep(cycle, kinds)
        for i in mine:
            sw.advance(queue, i, leaving)
            out[queue[i].id] = _one(cycle, queue[i], sw.free, sw.ends, sw.t, sw.stuck)
        # On to the end of the queue, though no job behind asks: the sweep asks the runtime
        # estimate of every job it passes, and the predictor keeps each job's estimate until
        # REFRESH runtimes after that job was first asked (policies/order/predictor.py), so which
        # jobs are asked in a cycle moves later estimates, and plans. Stopping at the last job
        # of ``kinds`` moved the busiest 14 days of seed 0 from 119,234 to 110,082 USD.
        sw.advance(queue, len(queue), leaving)
    return out


def _one(cycle: Cycle, job: Job, free: int, ends: list[tuple[float, int]], t: float,
         stuck: bool) -> float:
    """The start of ``job`` given the pool left by the jobs ahead (the pool is not changed)."""
    sh = cycle.shadow
    if sh is not None and sh.reservation.job_id == job.id:
        return max(cycle.now, sh.reservation.start_at)
    if job.id in made_room_for(cycle):
        return cycle.now + cycle.snap.grace_s
    if stuck:
        return math.inf
    need = job.res.total_gpus
    popped: list[tuple[float, int]] = []
    while ends and (ends[0][0] <= t or free < need):  # (as _advance, then undone)
        end, n = heapq.heappop(ends)
        popped.append((end, n))
        t, free = max(t, end), free + n
    for item in popped:
        heapq.heappush(ends, item)
    return max(cycle.now, t) if free >= need else math.inf


class QueueForecast:
    """:func:`onprem_start` of the jobs of ``queue`` asked in queue order while a set of
    ``leaving`` jobs grows (the burst phase's loop): one sweep per set of on-prem kinds, kept
    between calls and advanced to the job asked, instead of one pass over the jobs ahead per
    job. Exactly :func:`onprem_start` with ``ahead = queue[:pos]``. A sweep that already
    counted a job that has since joined ``leaving`` (one that bursts to make room for a job
    behind it), or that is asked about an earlier position, starts again from the front.
    ``leaving`` must only grow between calls."""

    def __init__(self, cycle: Cycle, queue: list[Job]) -> None:
        self.cycle, self.queue = cycle, queue
        self._sweeps: dict[frozenset[Kind], _Sweep] = {}
        self._known: set[str] = set()

    def start(self, pos: int, leaving: Collection[str]) -> float:
        cycle, job = self.cycle, self.queue[pos]
        kinds = onprem_kinds(cycle, job)
        if not kinds or _shortcut(cycle, job):
            return _one(cycle, job, 0, [], cycle.now, True)  # (inf after the shortcuts)
        if len(leaving) != len(self._known):
            new = set(leaving) - self._known
            for k in [k for k, s in self._sweeps.items() if not s.counted.isdisjoint(new)]:
                del self._sweeps[k]
            self._known |= new
        sw = self._sweeps.get(kinds)
        if sw is None or sw.next > pos:
            sw = self._sweeps[kinds] = _Sweep(cycle, kinds)
        sw.advance(self.queue, pos, leaving)
        return _one(cycle, job, sw.free, sw.ends, sw.t, sw.stuck)


def _shortcut(cycle: Cycle, job: Job) -> bool:
    """Is the job's forecast its reservation or its evictions', whatever the pool?"""
    sh = cycle.shadow
    return (sh is not None and sh.reservation.job_id == job.id) \
        or job.id in made_room_for(cycle)


class _Sweep:
    """The pool of one set of on-prem kinds after the queue's jobs before ``next``."""

    def __init__(self, cycle: Cycle, kinds: frozenset[Kind]) -> None:
        self.cycle, self.kinds = cycle, kinds
        self.free = _free_now(cycle, kinds)
        self.ends: list[tuple[float, int]] = [(t, n) for t, k, n in _releases(cycle)
                                              if k in kinds]
        heapq.heapify(self.ends)
        self.t = cycle.now
        self.stuck = False
        self.next = 0
        self.counted: set[str] = set()

    def advance(self, queue: list[Job], pos: int, leaving: Collection[str]) -> None:
        cycle = self.cycle
        while self.next < pos:
            other = queue[self.next]
            self.next += 1
            if self.stuck or other.id in leaving \
                    or not (onprem_kinds(cycle, other) & self.kinds):
                continue
            take = other.res.total_gpus
            self.counted.add(other.id)
            self.free, self.t = _advance(self.free, take, self.ends, self.t)
            if self.free < take:
                self.stuck = True  # a job ahead waits for GPUs that never free up
                continue
            self.free -= take
            heapq.heappush(self.ends, (self.t + min(cycle.estimate(other), 1e12), take))
