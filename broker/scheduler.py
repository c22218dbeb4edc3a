"""The scheduling cycle: ``plan = run_cycle(snapshot, policies, now)``. Pure: no I/O, no clock.

1 order the pending jobs (a registered order policy)
2 admit (quotas, budgets)
3 place in order on free capacity, best fit; the first job that cannot be placed gets
4 a reservation (EASY backfill): later jobs start only if they do not delay it; with
  ``backfill: none`` the first blocked job blocks every later one (strict order)
  (with defragmentation, the moves that make whole nodes for that job are planned right
  then, before backfill, and their landing GPUs kept; see policies/defrag.py)
5 preempt where a class allows it, or to reclaim a team's guaranteed quota; else move jobs
  for the reservation holder (defragmentation, planned in 4); else, with relief, let a holder
  starved far past its runtime evict long checkpointable jobs (see policies/relief.py)
6 burst (later)   7 defer for carbon (later)
8 a reason for every job left pending
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from itertools import islice

from broker.model import Allocation, Job, Reason, Resources
from broker.plan import Plan, Preempt, Snapshot, Start
from broker.state import JobState
from policies import ordering as _ordering  # noqa: F401  (registers the built-in policies)
from policies import placement as _placement  # noqa: F401
from policies.backfill import Shadow, release_profile, reserve
from policies.defrag import MOVED, Landing, plan_landings, was_moved
from policies.fairshare import fairshare_factors, gpus_in_use
from policies.ordering import SPILLWAY_DEFAULTS
from policies.placement import FreeIndex, Kind
from policies.predictor import expected_end
from policies.preemption import Victim, choose, make_victims, victim_key
from policies.registry import PolicySet
from policies.relief import YIELDED, cost, gain, worth_it

MAX_PREEMPTORS = 8  # blocked jobs that may look for victims in one cycle
_FULL = Reason("Resources", "no GPU is free; waiting behind higher-ranked jobs")
_FIFO = Reason("Priority", "strict first-come-first-served: waiting for an earlier job to start")


def _shape(res: Resources, sites: tuple[str, ...], long: object) -> tuple[object, ...]:
    return (res.key, sites, long)


def _used_cpu_mem(active: tuple[Job, ...]) -> dict[str, tuple[float, float]]:
    used: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for job in active:
        if not (job.spec.cpus or job.spec.memory_gb):
            continue  # nothing to account (GPU-only jobs, every simulated one)
        done = {r for r, _ in job.parts_exited}
        for a in job.allocations:
            if a.rank not in done:
                used[a.node_id][0] += job.spec.cpus
                used[a.node_id][1] += job.spec.memory_gb
    return {k: (v[0], v[1]) for k, v in used.items()}


def run_cycle(snapshot: Snapshot, policies: PolicySet | None = None,
              now: float | None = None, explain: bool = False) -> Plan:
    """One scheduling pass over a snapshot (see the module docstring for the phases).
    ``explain`` also returns the ranked queue (``Plan.order``), for ``spillway explain``."""
    cycle = _Cycle(snapshot, policies or PolicySet(), snapshot.now if now is None else now)
    return cycle.run(explain)


def estimator(snap: Snapshot, policies: PolicySet) -> Callable[[Job], float]:
    """How a cycle estimates a job's runtime: the predictor's, or the time limit (inf: none)."""
    if policies.estimate == "predictor" and snap.predictor is not None:
        return snap.predictor.estimate
    return _time_limit


def _time_limit(job: Job) -> float:
    return job.spec.time_limit or math.inf


def runtime_estimate(snap: Snapshot, policies: PolicySet, job: Job) -> float:
    """The runtime a cycle expects of a job (see :func:`estimator`)."""
    return estimator(snap, policies)(job)


class _Cycle:
    def __init__(self, snap: Snapshot, policies: PolicySet, now: float) -> None:
        self.snap, self.policies, self.now = snap, policies, now
        self.order, self.admit, self.place = (policies.resolve(r)
                                              for r in ("order", "admit", "place"))
        self.index = FreeIndex(snap.nodes, snap.allocated,  # (only read)
                               _used_cpu_mem(snap.active))
        self.rank = {c.name: c.rank for c in snap.classes}
        self.starts: list[Start] = []
        self.started: list[tuple[Job, float]] = []  # (job, expected end) started this cycle
        self.pending: dict[str, Reason] = {}
        self.shadow: Shadow | None = None
        self.blocked: list[Job] = []  # feasible jobs left pending, in queue order
        self._estimates: dict[str, float] = {}
        self._estimate = estimator(snap, policies)  # chosen once: every lookup goes through it
        self._ends: dict[str, float] = {}
        self._fs: dict[str, float] | None = None
        self.preemptible = {c.name for c in snap.classes if c.preemptible}
        self.early_moves: tuple[Job, list[Victim]] | None = None  # planned before backfill
        self.wake_at: float | None = None  # see Plan.wake_at
        self.defrag = policies.defrag and policies.preempt != "none"
        self.relief = policies.relief and policies.preempt != "none"
        self.horizon: dict[str, float] | None = None  # node -> expected end of its last job
        if policies.place == "aligned":
            self.horizon = {}
            for j in snap.active:
                end = self._end_of(j)
                for a in j.allocations:
                    self.horizon[a.node_id] = max(self.horizon.get(a.node_id, now), end)

    # -- estimates -------------------------------------------------------------------------

    def estimate(self, job: Job) -> float:
        est = self._estimates.get(job.id)
        if est is None:
            est = self._estimates[job.id] = self._estimate(job)
        return est

    # -- phases ----------------------------------------------------------------------------

    def run(self, explain: bool = False) -> Plan:
        queue: list[Job] = self.order(self.snap, self.snap.pending)  # 1
        if self.defrag:
            self._hold_landings()
        strict = self.policies.backfill == "none"
        failed: dict[tuple[object, ...], Reason] = {}  # request shape -> why it failed
        head_blocked = False
        for pos, job in enumerate(queue):
            if self.index.free_devices == 0:
                self._rest_full(queue[pos:], head_blocked)
                break
            if head_blocked and strict:  # everyone behind a blocked head waits
                self.pending.update((j.id, _FIFO) if self.index.feasible_ever(j.res)
                                    else (j.id, _infeasible(j.res)) for j in queue[pos:])
                self.blocked.extend(queue[pos:])
                break
            refusal = self.admit(self.snap, job)  # 2
            if refusal is not None:
                self.pending[job.id] = Reason(refusal, f"not admitted: {refusal}")
                continue
            res = job.res
            if not self.index.feasible_ever(res):
                self.pending[job.id] = _infeasible(res)
                continue
            long = self.shadow is not None and not self.shadow.allows(self.now,
                                                                     self.estimate(job))
            shape = _shape(res, job.spec.sites, long and self._may_scavenge(job))
            if shape in failed:
                self.pending[job.id] = failed[shape]
                self.blocked.append(job)
                continue
            allocs = self._place(job, long)  # 3, 4
            if allocs is not None:
                self._start(job, allocs, long)
                continue
            self.blocked.append(job)
            if not head_blocked:
                head_blocked = True
                if not strict:
                    self.shadow = self._reserve(job)
                self.pending[job.id] = self._head_reason(res)
                if self.defrag:
                    self._defrag_early(job)
                continue
            failed[shape] = self.pending[job.id] = self._blocked_reason(job, long)
        preemptions = self._preempt() if self.policies.preempt != "none" else ()  # 5
        return Plan(starts=tuple(self.starts), preemptions=preemptions, pending=self.pending,
                    reservation=replace(self.shadow.reservation,
                                        scavengers=tuple(self.shadow.scavengers))
                    if self.shadow else None,
                    order=tuple(j.id for j in queue) if explain else (),  # 8
                    wake_at=self.wake_at)

    def _may_scavenge(self, job: Job) -> object:
        """For the shape cache: a long job's outcome also depends on whether it may scavenge."""
        return ("scavenge" if self.policies.scavenge and job.priority in self.preemptible
                and job.spec.checkpoint_dir is not None else True)

    def _scavenge(self, job: Job) -> tuple | None:  # type: ignore[type-arg]
        """A long job may use the reserved GPUs if it checkpoints and may be preempted: it is
        evicted when the reservation is due (never sooner than the minimum runtime)."""
        sh = self.shadow
        if (sh is None or not self.policies.scavenge or job.priority not in self.preemptible
                or job.spec.checkpoint_dir is None
                or sh.reservation.start_at - self.now < self.snap.min_runtime_s):
            return None
        allocs = self.index.find(job.res, job.spec.sites, horizon=self.horizon,
                                 end=self.now + min(self.estimate(job), 1e9))
        if allocs is not None and any(a.node_id in sh.cap for a in allocs):
            sh.scavengers.append(job.id)
        return allocs

    def _place(self, job: Job, long: bool) -> tuple | None:  # type: ignore[type-arg]
        end = self.now + min(self.estimate(job), 1e9)
        if self.shadow is not None and not long and self.policies.place == "aligned":
            # packing around the reservation: a job that ends before it starts goes first
            # into the reserved nodes' idle GPUs, keeping the other nodes for longer jobs
            inside = self.index.find(job.res, job.spec.sites, only=self.shadow.node_set)
            if inside is not None:
                return inside
        if self.shadow is None or not long:
            return self.place(self.index, job, self.horizon, end)  # type: ignore[no-any-return]
        return self.index.find(job.res, job.spec.sites, self.shadow.cap, self.shadow.kind,
                               self.horizon, end) or self._scavenge(job)

    def _start(self, job: Job, allocs: tuple, long: bool) -> None:  # type: ignore[type-arg]
        self.index.take(allocs, job.res)
        if self.horizon is not None:
            end = self.now + min(self.estimate(job), 1e9)
            for a in allocs:
                self.horizon[a.node_id] = max(self.horizon.get(a.node_id, self.now), end)
        if long and self.shadow is not None:
            self.shadow.charge(allocs)
        self.starts.append(Start(job.id, job.attempt, job.version, allocs))
        est = self.estimate(job)
        self.started.append((job, self.now + est))

    def _reserve(self, job: Job) -> Shadow | None:
        prev = self.snap.reservation
        active_ids = {j.id for j in self.snap.active}
        kept = [i for i in prev.scavengers if i in active_ids] \
            if prev is not None and prev.job_id == job.id else []
        evictable = set(kept)  # they leave when the reservation is due: count them free now
        ends, end_of = self._ends, self._end_of  # (its memo, inlined: every running job)
        running = [(j.allocations, self.now if j.id in evictable
                    else ends[j.id] if j.id in ends else end_of(j)) for j in self.snap.active]
        running += [(s.allocations, end) for s, (_, end) in zip(self.starts, self.started)]
        shadow = reserve(job, self.index, release_profile(self.index, running), self.now)
        if shadow is not None:
            shadow.scavengers = kept
        relax = float(self.snap.settings.get(self.policies.name, {}).get("backfill_relax", 0.0))
        if shadow is not None and relax > 0:
            shadow.slack_s = relax * max(0.0, self.now - job.submitted_at)
        return shadow

    def _end_of(self, job: Job) -> float:
        """When a running job is expected to free its GPUs (computed once per cycle: the
        packing horizon and the reservation both ask)."""
        end = self._ends.get(job.id)
        if end is None:
            end = self._ends[job.id] = (
                self.now + self.snap.grace_s if job.state is JobState.STOPPING
                else expected_end(job, self.estimate(job), self.now))
        return end

    def _rest_full(self, rest: list[Job], head_done: bool) -> None:
        """No GPU is free: the rest of the queue waits (cheap, for long queues). The first
        feasible job still gets its reservation, so that it holds from cycle to cycle; a job
        that needs no GPU may still start (under strict order only at the head)."""
        strict = self.policies.backfill == "none"
        feasible = self.index.feasible_ever
        for pos, job in enumerate(rest):
            if head_done:  # the common case: the whole tail waits, in one step
                tail = rest[pos:]
                known = self.index.feasible_memo  # inlined: long tails, every cycle
                ok = [j for j in tail if j.res.gpus and (known.get(j.res.key) or feasible(j.res))]
                self.pending.update(dict.fromkeys([j.id for j in ok], _FIFO if strict else _FULL))
                self.blocked.extend(ok)
                if len(ok) != len(tail):  # CPU-only or infeasible jobs: one by one
                    for j in tail:
                        if j.res.gpus and feasible(j.res):
                            continue
                        if not feasible(j.res):
                            self.pending[j.id] = _infeasible(j.res)
                            continue
                        allocs = None if strict else self.place(self.index, j, self.horizon,
                                                                self.now)
                        if allocs is not None:
                            self._start(j, allocs, False)
                        else:
                            self.pending[j.id] = _FIFO if strict else _FULL
                            self.blocked.append(j)
                return
            if not feasible(job.res):
                self.pending[job.id] = _infeasible(job.res)
                continue
            if job.res.gpus == 0 and not (strict and head_done):  # only at the head or below
                allocs = self.place(self.index, job, self.horizon, self.now)
                if allocs is not None:
                    self._start(job, allocs, False)
                    continue
            if not head_done:
                head_done = True
                if not strict:
                    self.shadow = self._reserve(job)
                self.pending[job.id] = self._head_reason(job.res)
            else:
                self.pending[job.id] = _FIFO if strict else _FULL
            self.blocked.append(job)

    # -- reasons ---------------------------------------------------------------------------

    def _fairshare(self) -> dict[str, float]:
        if self._fs is None:
            self._fs = fairshare_factors(self.snap) if self.policies.order in (
                "spillway", "multifactor") else {}
        return self._fs

    def _head_reason(self, res: Resources) -> Reason:
        what = f"{res.gpus} GPU(s) of {_types(res)}" + (
            f" on {res.nodes} nodes" if res.nodes > 1 else "")
        sh = self.shadow
        if sh is None:
            return Reason("Resources", f"first in line; waiting for {what} to free up")
        when = "now" if sh.reservation.start_at <= self.now else (
            f"in ~{_dur(sh.reservation.start_at - self.now)}")
        return Reason("Resources", f"first in line, holds the reservation: {what} on "
                                   f"{', '.join(sh.reservation.node_ids)} expected free {when}")

    def _blocked_reason(self, job: Job, long: bool) -> Reason:
        res = job.res
        if long and self.index.find(res, job.spec.sites) is not None:
            assert self.shadow is not None
            return Reason("Reservation",
                          f"would fit now but would delay the reservation of "
                          f"{self.shadow.reservation.job_id} (its estimate ends after "
                          f"{_dur(self.shadow.reservation.start_at - self.now)})")
        if self._fairshare().get(job.team, 1.0) < 0.5:
            return Reason("FairShare", f"team {job.team} used more than its share lately; "
                                       f"waiting behind other teams' jobs for {res.gpus} GPU(s) "
                                       f"of {_types(res)}")
        return Reason("Priority", f"waiting behind higher-ranked jobs for {res.gpus} GPU(s) of "
                                  f"{_types(res)}" + (f" on {res.nodes} nodes"
                                                      if res.nodes > 1 else ""))

    # -- preemption ------------------------------------------------------------------------

    def _evict_scavengers(self) -> list[Preempt]:
        """The reservation is due: evict the jobs let into its GPUs, as few as make room."""
        sh = self.shadow
        if sh is None or sh.reservation.start_at > self.now or not sh.scavengers:
            return []
        holder = next((j for j in self.blocked if j.id == sh.reservation.job_id), None)
        if holder is None:
            return []
        kinds = self.index.kinds_by_gpu
        soon = self._soon_free(kinds)
        if self._fits(holder, soon):
            return []
        ids = set(sh.scavengers)
        pool = [j for j in self.snap.active if j.id in ids and j.state is not JobState.STOPPING]
        victims = make_victims(pool, kinds, lambda j: victim_key(
            j, self.rank.get(j.priority, 0), self.now, self.snap.grace_s))
        chosen = choose(holder, self.index, soon, victims, lambda v: True)
        if not chosen:
            return []
        self.pending[holder.id] = Reason("Resources", "its reservation is due: evicting "
                                         f"{len(chosen)} job(s) that used its GPUs meanwhile")
        return [Preempt(v.job.id, v.job.attempt, f"backfill window closed: the reservation of "
                        f"{holder.id} is due", self.snap.grace_s) for v in chosen]

    def _preempt(self) -> tuple[Preempt, ...]:
        early = self._evict_scavengers()
        out = tuple(early) + self._preempt_for_class({p.job_id for p in early})
        if self.early_moves is not None and not out:  # (planned before backfill)
            out = self._move(*self.early_moves)
        if self.relief and not out:
            out = self._relieve()
        return out

    def _relieve(self) -> tuple[Preempt, ...]:
        """The reservation holder, a short job starved far past its runtime, evicts long
        checkpointable jobs when it gains many times what they lose (policies/relief.py)."""
        sh, snap, now = self.shadow, self.snap, self.now
        if sh is None:
            return ()
        s = {**SPILLWAY_DEFAULTS, **snap.settings.get(self.policies.name, {})}
        min_sd, ratio = float(s["relief_slowdown"]), float(s["relief_ratio"])
        floor, far = float(s["min_estimate_s"]), float(s["defrag_min_gain_s"])
        start = sh.reservation.start_at
        if min_sd <= 0 or start - now < far:
            return ()
        holder = next((j for j in self.blocked if j.id == sh.reservation.job_id), None)
        if holder is None:
            return ()
        est = max(floor, min(self.estimate(holder), 1e9))
        spared = gain(start, now, snap.grace_s, est)
        if spared < min_sd:
            return ()
        kinds = self.index.kinds_by_gpu
        soon = self._soon_free(kinds)
        if self._fits(holder, soon):  # room is already being made for it
            return ()
        pool: list[Job] = []
        young: list[Job] = []
        for j in snap.active:
            if (j.state is JobState.RUNNING and j.priority in self.preemptible
                    and j.spec.checkpoint_dir is not None and j.started_at is not None
                    and self._end_of(j) - now >= far):
                (pool if now - j.started_at >= snap.min_runtime_s else young).append(j)
        victims = make_victims(pool, kinds, lambda j: victim_key(
            j, self.rank.get(j.priority, 0), now, snap.grace_s))
        chosen = choose(holder, self.index, soon, victims, lambda v: True) if pool else None
        if not chosen:
            # jobs too young to evict now may make room later: say when (the holder's gain
            # only shrinks meanwhile, so not past the time it falls below the threshold)
            last = start - snap.grace_s - min_sd * est
            soonest = min((j.started_at + snap.min_runtime_s for j in young
                           if j.started_at is not None), default=math.inf)
            if soonest <= last:
                self.wake_at = soonest
            return ()
        lost = cost(est, snap.grace_s, (max(floor, min(self.estimate(v.job), 1e9))
                                        for v in chosen))
        if not worth_it(spared, lost, min_sd, ratio):
            return ()
        ids = ", ".join(v.job.id for v in chosen)
        self.pending[holder.id] = Reason(
            "Resources", f"first in line; its reservation is {_dur(start - now)} away, "
                         f"{spared:.0f}x its expected runtime: evicting {len(chosen)} long "
                         f"checkpointable job(s) that lose far less: {ids}")
        return tuple(Preempt(v.job.id, v.job.attempt,
                             f"{YIELDED} {holder.id}, which had waited {spared:.0f}x its "
                             "runtime: restarts from its checkpoint ahead of the queue",
                             snap.grace_s)
                     for v in chosen)

    def _hold_landings(self) -> None:
        """Jobs being moved restart on free GPUs once they have checkpointed: keep free GPUs
        for them meanwhile (off the reserved nodes), so that backfill does not take them."""
        stopping, requeued = JobState.STOPPING, JobState.PREEMPTED  # (not if since cancelled)
        moving = [j for j in self.snap.active if j.state is stopping
                  and j.stop_target is requeued and was_moved(j)]
        if not moving:
            return
        sh = self.snap.reservation
        off = set(sh.node_ids) if sh is not None else set()
        only = {nid for nid in self.index.nodes if nid not in off}
        for j in sorted(moving, key=lambda j: (-j.res.gpus, j.id)):
            allocs = self.index.find(j.res, j.spec.sites, only=only)
            if allocs is not None:
                self.index.take(allocs, j.res)

    def _defrag_early(self, holder: Job) -> None:
        """Plan the moves for the reservation holder before backfill takes the free GPUs
        they would land on, and keep those GPUs free for them."""
        planned = self._plan_moves(holder)
        if not planned:
            return
        for v, nid, kind in planned:
            devs = self.index.nodes[nid].devices.get(kind, [])
            if len(devs) >= v.job.res.gpus:  # (not if it lands on GPUs being freed)
                self.index.take((Allocation(nid, tuple(g.id for g in devs[: v.job.res.gpus]),
                                            0),), v.job.res)
        moved = [v for v, _, _ in planned]
        for v in moved:  # they free their GPUs within the grace period: reserve those
            self._ends[v.job.id] = self.now + self.snap.grace_s
        self.shadow = self._reserve(holder) or self.shadow
        self.early_moves = (holder, moved)

    def _plan_moves(self, holder: Job) -> list[Landing] | None:
        """Which small checkpointable jobs to move off the nodes the holder needs, and onto
        which free GPUs, when its reservation is far off (policies/defrag.py has the rule)."""
        sh, snap, now = self.shadow, self.snap, self.now
        gain = float(snap.settings.get(self.policies.name, {}).get(
            "defrag_min_gain_s", SPILLWAY_DEFAULTS["defrag_min_gain_s"]))
        if sh is None or sh.reservation.start_at - now < gain:
            return None
        # moved jobs land on free GPUs, so at least the holder's count must be free somewhere
        if self.index.free_devices < holder.res.total_gpus:
            return None
        kinds = self.index.kinds_by_gpu
        soon = self._soon_free(kinds)
        if self._fits(holder, soon):  # room is already being made for it
            return None
        pool = [j for j in snap.active
                if j.state is JobState.RUNNING and j.priority in self.preemptible
                and j.spec.checkpoint_dir is not None and j.res.nodes == 1
                and j.res.mig_profile is None and j.started_at is not None
                and now - j.started_at >= snap.min_runtime_s
                and self._end_of(j) - now >= gain]
        # only nodes where the holder could fit once their movable jobs left (the same test
        # plan_moves makes per device kind; this one, on all kinds, is a cheap superset)
        need = holder.res.gpus
        on_node: dict[str, int] = defaultdict(int)
        for j in pool:
            on_node[j.allocations[0].node_id] += j.res.gpus
        pool = [j for j in pool if on_node[j.allocations[0].node_id]
                + sum(soon[j.allocations[0].node_id].values()) >= need]
        if not pool:
            return None
        movable = make_victims(pool, kinds, lambda j: victim_key(
            j, self.rank.get(j.priority, 0), now, snap.grace_s))
        return plan_landings(holder, self.index, soon, movable)

    def _move(self, holder: Job, moved: list[Victim]) -> tuple[Preempt, ...]:
        ids = ", ".join(v.job.id for v in moved)
        self.pending[holder.id] = Reason(
            "Resources", f"first in line; moving {len(moved)} job(s) to free GPUs on other "
                         f"nodes to make whole nodes for it: {ids}")
        return tuple(Preempt(v.job.id, v.job.attempt,
                             f"{MOVED} {holder.id}: restarts from its "
                             "checkpoint on free GPUs elsewhere", self.snap.grace_s)
                     for v in moved)

    def _preempt_for_class(self, taken: set[str]) -> tuple[Preempt, ...]:
        snap, now = self.snap, self.now
        quota = {t.name: t.quota_gpus for t in snap.teams if t.quota_gpus}
        in_use = gpus_in_use(snap) if quota else {}
        may = {c.name for c in snap.classes if c.may_preempt}
        if not may and not quota:
            return ()
        wanting = (j for j in self.blocked if j.priority in may or in_use.get(j.team, 0)
                   + j.res.total_gpus <= quota.get(j.team, 0)) if quota else (
            j for j in self.blocked if j.priority in may)
        preemptors = list(islice(wanting, MAX_PREEMPTORS))
        if not preemptors:
            return ()
        kinds = self.index.kinds_by_gpu
        soon = self._soon_free(kinds)
        pool = [j for j in snap.active
                if j.state is JobState.RUNNING and j.priority in self.preemptible
                and j.started_at is not None and now - j.started_at >= snap.min_runtime_s]
        victims = make_victims(pool, kinds, lambda j: victim_key(
            j, self.rank.get(j.priority, 0), now, snap.grace_s))
        out: list[Preempt] = []
        for job in preemptors:
            if self._fits(job, soon):  # room is already being made for it
                self._claim(job, soon)
                self.pending[job.id] = Reason("Preempting", "waiting for evicted jobs to stop")
                continue
            allowed = self._allowed(job, quota, in_use, taken)
            chosen = choose(job, self.index, soon, victims, allowed)
            if chosen is None:
                continue
            for v in chosen:
                taken.add(v.job.id)
                for nid, per in v.devices.items():
                    for kind, n in per.items():
                        soon[nid][kind] += n
                out.append(Preempt(v.job.id, v.job.attempt,
                                   f"preempted by {job.id} ({job.priority}, team {job.team})",
                                   snap.grace_s))
            self._claim(job, soon)
            code = "Preempting" if job.priority in may else "Quota"
            self.pending[job.id] = Reason(code, f"evicting {len(chosen)} job(s) to make room: "
                                                + ", ".join(v.job.id for v in chosen))
        return tuple(out)

    def _soon_free(self, kinds: dict[str, dict[str, Kind]]) -> dict[str, dict[Kind, int]]:
        """Free devices plus those held by jobs already stopping for a preemption."""
        soon: dict[str, dict[Kind, int]] = defaultdict(lambda: defaultdict(int))
        for nid, f in self.index.nodes.items():
            for k, devs in f.devices.items():
                soon[nid][k] += len(devs)
        for job in self.snap.active:
            if job.state is JobState.STOPPING and job.stop_target is JobState.PREEMPTED:
                for a in job.allocations:
                    for gid in a.gpu_ids:
                        kind = kinds.get(a.node_id, {}).get(gid)
                        if kind is not None:
                            soon[a.node_id][kind] += 1
        return soon

    def _fits(self, job: Job, soon: dict[str, dict[Kind, int]]) -> bool:
        res = job.res
        return any(sum(1 for nid in soon if soon[nid].get(k, 0) >= res.gpus) >= res.nodes
                   for k in self.index.wanted(res))

    def _claim(self, job: Job, soon: dict[str, dict[Kind, int]]) -> None:
        res = job.res
        for k in self.index.wanted(res):
            nodes = sorted((soon[n].get(k, 0), n) for n in soon if soon[n].get(k, 0) >= res.gpus)
            if len(nodes) >= res.nodes:
                for _, nid in nodes[: res.nodes]:
                    soon[nid][k] -= res.gpus
                return

    def _allowed(self, job: Job, quota: dict[str, int], in_use: dict[str, int],
                 taken: set[str]) -> Callable[[Victim], bool]:
        my_rank = self.rank.get(job.priority, 0)
        by_class = job.priority in {c.name for c in self.snap.classes if c.may_preempt}
        reclaim = in_use.get(job.team, 0) + job.res.total_gpus <= quota.get(job.team, 0)

        def ok(v: Victim) -> bool:
            if v.job.id in taken or (v.job.team == job.team and not by_class):
                return False
            if by_class and self.rank.get(v.job.priority, 0) < my_rank:
                return True
            return reclaim and in_use.get(v.job.team, 0) > quota.get(v.job.team, 0)

        return ok


def _infeasible(res: Resources) -> Reason:
    return Reason(
        "NoFeasibleNode",
        f"no live node has {res.gpus} free-able GPU(s) of {_types(res)}"
        + (f" on {res.nodes} nodes" if res.nodes > 1 else "")
        + "; check `spillway nodes` and the job's gpu_types / min_gpu_memory_gb",
    )


def _types(res: Resources) -> str:
    what = "/".join(res.gpu_types) if res.gpu_types else "any type"
    if res.mig_profile:
        what = f"MIG {res.mig_profile} ({what})"
    if res.min_gpu_memory_gb:
        what += f", >= {res.min_gpu_memory_gb:g} GB"
    return what


def _dur(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "unknown"
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
