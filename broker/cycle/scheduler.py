"""The scheduling cycle: ``plan = run_cycle(snapshot, policies, now)``. Pure: no I/O, no clock.

The recipe and the cycle's state only; every decision is a registered policy
(policies/registry.py has the roles), whose logic lives in ``policies/``::

    1 order     the pending jobs, first to last                       (order)
    2-3 place   walk the queue: admit, place on free capacity; the first job that cannot be
                placed gets a reservation (or, in strict order, blocks everyone behind it),
                later jobs backfill without delaying it; evictors plan what must happen
                before backfill (defragmentation moves)    (admit, place, reserve, evict)
    4 evict     the ordered evictors: scavenger eviction, class preemption and quota
                reclaim, defragmentation moves, relief                (evict)
    5 burst     rent cloud capacity where the SLA would break        (burst: sla, baselines)
    5b budget   keep those launches within the teams' caps           (budget)
    6 defer     hold deferrable work for a cleaner window            (defer: carbon...)
    7 plan      a reason for every job left pending, the reservation, wake_at

A policy that fails on one job does not stop the cycle: the job is set aside with a
``PolicyError`` reason naming the policy and the exception, and the cycle is run again without
it (:func:`run_cycle`; docs/policies.md, "A cycle never dies of one job", draws the boundary).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import cached_property
from types import CodeType
from typing import Any

from broker.cycle.plan import Launch, Plan, Preempt, SetAside, Snapshot, Start, Terminate
from broker.errors import CycleFailed
from broker.model import Allocation, Job, Reason
from broker.model.state import JobState
from policies.cycle import Evictor, Memory, Memos, Placer, Reserver, each_alone
from policies.order.fairshare import fairshare_factors
from policies.order.predictor import expected_end
from policies.place.backfill import outlived, release_profile
from policies.place.capacity import FreeIndex, Shadow
from policies.place.queue import place_queue
from policies.reasons import exception_text, policy_error
from policies.registry import PolicySet, code_of, policy_at, settings_of

__all__ = ["CycleState", "Memory", "estimator", "run_cycle", "runtime_estimate"]


#: a cycle runs at most this many times over one snapshot: the first, and once more each time
#: policies set jobs aside; failing on jobs still after that, the failure is the policies', not
#: the jobs' (it shows on whichever job is asked about), and the cycle fails
MAX_PASSES = 4


def run_cycle(snapshot: Snapshot, policies: PolicySet | None = None,
              now: float | None = None, memory: Memory | None = None) -> Plan:
    """One scheduling pass over a snapshot (the module docstring has the phases). ``memory``
    carries caches across cycles (a scheduler keeps one; None: a fresh one).

    A job that a policy fails on (an exception raised while deciding about it:
    :meth:`CycleState.fail`) is set aside, and the cycle runs again on the snapshot without
    the jobs set aside, so that nothing half decided about them is kept; the Plan gives them
    in ``set_aside`` and, with the same ``PolicyError`` reason, in ``pending``. An exception
    that is not one job's (a broken setting, a bug outside the per-job loops) propagates: the
    cycle fails, as does one that still sets jobs aside after :data:`MAX_PASSES` passes, or
    that sets aside every pending job (two or more) (:class:`~broker.errors.CycleFailed`)."""
    policies = policies or PolicySet()
    now = snapshot.now if now is None else now
    aside: dict[str, SetAside] = {}
    for _ in range(MAX_PASSES):
        snap = snapshot if not aside else replace(
            snapshot, pending=tuple(j for j in snapshot.pending if j.id not in aside))
        state = CycleState(snap, policies, now, memory)
        try:
            plan = _phases(state)
        except Exception:
            if not state.failed:
                raise  # not one job's: the cycle fails
            plan = None  # (what failed may follow from a job it set aside: run again)
        if not state.failed:
            assert plan is not None
            return plan if not aside else replace(plan, set_aside=aside, pending={
                **plan.pending, **{k: a.reason for k, a in aside.items()}})
        aside.update(state.failed)
        if len(aside) == len(snapshot.pending) > 1:
            break  # every job: the failure is not theirs
    first = next(iter(state.failed.values()))
    raise CycleFailed(f"the policies failed on {len(aside)} of {len(snapshot.pending)} pending "
                      f"jobs, more in each pass of the cycle, or on all of them (first in the "
                      f"last pass: the {first.role} policy {first.policy!r}, {first.error})"
                      ) from state.errors[0]


def _phases(state: CycleState) -> Plan:
    """The phases of one pass (the module docstring)."""
    pol = state.policies
    state.queue = state.ordered(state.snap.pending)  # 1
    state.phase = ("place", pol.place)
    place_queue(state)  # 2, 3
    for name, evictor in zip(pol.evict, state.evictors):  # 4
        state.phase = ("evict", name)
        state.evictions.extend(evictor.evict(state))
    state.phase = ("burst", pol.burst)
    state.burst(state)  # 5
    state.phase = ("budget", pol.budget)
    state.budget(state)  # 5b keep its launches within the teams' caps
    state.phase = ("defer", pol.defer)
    state.defer(state)  # 6
    return state.plan()  # 7


def estimator(snap: Snapshot, policies: PolicySet) -> Callable[[Job], float]:
    """How a cycle estimates a job's runtime (the ``estimate`` role)."""
    return policies.resolve("estimate")(snap)  # type: ignore[no-any-return]


def runtime_estimate(snap: Snapshot, policies: PolicySet, job: Job) -> float:
    """The runtime a cycle expects of a job (see :func:`estimator`)."""
    return estimator(snap, policies)(job)


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


class CycleState(Memos):
    """Everything one cycle knows and decides (policies/cycle.py's ``Cycle``); the policies'
    typed per-cycle memos are kept by :class:`~policies.cycle.Memos`."""

    def __init__(self, snap: Snapshot, policies: PolicySet, now: float,
                 memory: Memory | None = None) -> None:
        super().__init__()
        self.snap, self.policies, self.now = snap, policies, now
        self.memory = memory if memory is not None else Memory()
        # the policies playing each role
        self.order = policies.resolve("order")
        self.admit = policies.resolve("admit")
        self.placer: Placer = policies.resolve("place")
        self.reserver: Reserver = policies.resolve("reserve")
        self.evictors: tuple[Evictor, ...] = policies.resolve("evict")
        self.burst = policies.resolve("burst")
        self.budget = policies.resolve("budget")
        self.defer = policies.resolve("defer")
        self._estimate: Callable[[Job], float] = policies.resolve("estimate")(snap)
        # what it knows
        self.index = FreeIndex(snap.nodes, snap.allocated, _used_cpu_mem(snap.active),
                               layouts=self.memory.layouts)
        self.rank = {c.name: c.rank for c in snap.classes}
        self.preemptible = frozenset(c.name for c in snap.classes if c.preemptible)
        self.queue: list[Job] = []
        self._estimates: dict[str, float] = {}
        self.ends: dict[str, float] = {}
        # what it decides
        self.starts: list[Start] = []
        self.started: list[tuple[Job, float]] = []
        self.pending: dict[str, Reason] = {}
        self.blocked: list[Job] = []
        self.shadow: Shadow | None = None
        self.guards: list[Shadow] = []
        self.evictions: list[Preempt] = []
        self.launches: list[Launch] = []
        self.terminations: list[Terminate] = []
        self.wake_at: float | None = None
        self.until_event = False
        self.horizon: dict[str, float] | None = None
        # jobs a policy failed on (set aside), the exceptions, and the role being played
        self.failed: dict[str, SetAside] = {}
        self.errors: list[Exception] = []
        self.phase: tuple[str, str] = ("order", policies.order)
        self.placer.prepare(self)

    @cached_property
    def fairshare(self) -> dict[str, float]:
        """Team -> fair-share factor, computed once per cycle (the order and the reasons ask)."""
        return fairshare_factors(self.snap)

    def ordered(self, jobs: Sequence[Job]) -> list[Job]:
        """The ``order`` policy's queue of ``jobs``. If it raises, each job is ordered alone:
        the jobs it fails on alone are set aside and the rest ordered without them; if it
        fails without any job, or on none alone, the failure is not a job's: it propagates."""
        order: Callable[[CycleState, Sequence[Job]], list[Job]] = self.order
        try:
            return order(self, jobs)
        except Exception as whole:
            try:
                order(self, [])
            except Exception:
                raise whole from None  # it fails whatever it is given
            each_alone(self, jobs, lambda some: order(self, some), whole)
        return order(self, [j for j in jobs if j.id not in self.failed])

    def fail(self, job: Job, exc: Exception) -> bool:
        """Set ``job`` aside: a policy raised ``exc`` deciding about it (see policies/cycle.py
        ``deciding``). The reason names the policy, found among the exception's frames, else
        the role the cycle was playing. False if ``job`` is not pending in the snapshot."""
        if job.id not in self._pending_ids:
            return False
        if job.id not in self.failed:
            role, name = policy_at(exc.__traceback__, self.policies, self._own_codes) \
                or self.phase
            error = exception_text(exc)
            self.failed[job.id] = SetAside(role, name, error, policy_error(role, name, error))
            self.errors.append(exc)
        return True

    @cached_property
    def _pending_ids(self) -> frozenset[str]:
        return frozenset(j.id for j in self.snap.pending)

    @cached_property
    def _own_codes(self) -> dict[CodeType, tuple[str, str]]:
        """The code of what the estimate policy made for this snapshot (its own function is
        not on the stack when the estimate fails)."""
        code = code_of(self._estimate)
        return {code: ("estimate", self.policies.estimate)} if code is not None else {}

    def settings(self, name: str) -> Mapping[str, Any]:
        """A policy's settings: its declared defaults and the configuration's values."""
        return settings_of(self.snap.settings, name)

    def estimate(self, job: Job) -> float:
        est = self._estimates.get(job.id)
        if est is None:
            est = self._estimates[job.id] = self._estimate(job)
        return est

    def end_of(self, job: Job) -> float:
        """When a running job is expected to free its GPUs (once per cycle: the packing
        horizon, the reservation and the evictors all ask)."""
        end = self.ends.get(job.id)
        if end is None:
            end = self.ends[job.id] = (
                self.now + self.snap.grace_s if job.state is JobState.STOPPING
                else expected_end(job, self.estimate(job), self.now))
        return end

    def start(self, job: Job, allocs: tuple[Allocation, ...], long: bool) -> None:
        """Start ``job`` on ``allocs`` this cycle (``long``: it outlives the reservation)."""
        self.index.take(allocs, job.res)
        if self.horizon is not None:
            end = self.now + min(self.estimate(job), 1e9)
            for a in allocs:
                self.horizon[a.node_id] = max(self.horizon.get(a.node_id, self.now), end)
        if long and self.shadow is not None:
            self.shadow.charge(allocs)
        for g in outlived(self, job) if self.guards else ():
            g.charge(allocs)
        self.starts.append(Start(job.id, job.attempt, job.version, allocs))
        self.started.append((job, self.now + self.estimate(job)))

    def reserve(self, job: Job) -> Shadow | None:
        """The reservation policy's answer for ``job``, given when every running job (and
        every job started this cycle) is expected to free its GPUs."""
        prev = self.snap.reservation
        active_ids = {j.id for j in self.snap.active}
        kept = [i for i in prev.scavengers if i in active_ids] \
            if prev is not None and prev.job_id == job.id else []
        evictable = set(kept)  # they leave when the reservation is due: count them free now
        ends, end_of = self.ends, self.end_of  # (its memo, inlined: every running job)
        running = [(j.allocations, self.now if j.id in evictable
                    else ends[j.id] if j.id in ends else end_of(j)) for j in self.snap.active]
        running += [(s.allocations, end) for s, (_, end) in zip(self.starts, self.started)]
        shadow = self.reserver.reserve(self, job, release_profile(self.index, running))
        if shadow is not None:
            shadow.scavengers = kept
        return shadow

    def plan(self) -> Plan:
        sh = self.shadow
        # strict order, arrivals last, nothing evicts: a job left waiting holds everyone back
        # until a job leaves, whatever arrives (the simulator skips cycles until then)
        self.until_event = self.until_event or (
            self.reserver.strict and not self.evictors and bool(self.blocked)
            and getattr(self.order, "arrivals_last", False))
        return Plan(starts=tuple(self.starts), preemptions=tuple(self.evictions),
                    launches=tuple(self.launches), terminations=tuple(self.terminations),
                    pending=self.pending,
                    reservation=replace(sh.reservation, scavengers=tuple(sh.scavengers))
                    if sh is not None else None,
                    order=tuple(j.id for j in self.queue),
                    wake_at=self.wake_at, until_event=self.until_event)

