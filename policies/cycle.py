"""What a policy sees of a scheduling cycle in progress, the interfaces of the roles the cycle
holds (:class:`Placer`, :class:`Reserver`, :class:`Evictor`), and what lives across cycles.

The cycle's state is built and owned by ``broker/cycle/scheduler.py``; policies read the snapshot
and write their decisions only through :class:`Cycle` (this module imports nothing from the
broker's cycle, so policies do not depend on it). :class:`Memory` holds what a scheduler keeps
from one cycle to the next: caches that make a cycle cheaper and never change a decision's
inputs. It is passed beside the Snapshot, which nothing writes into.

State a policy keeps for later phases (or later jobs) of the same cycle is typed: each concern
defines a dataclass of it beside its policy (every field with a default), and asks the cycle for
its one instance with ``cycle.memo(ThatClass)`` (:meth:`Cycle.memo`).

A policy that loops over pending jobs wraps what it decides about each in
``with deciding(cycle, job):``: an exception raised there sets that job aside for the cycle
(:meth:`Cycle.fail`) and the loop goes on with the next job (docs/policies.md, "A cycle never
dies of one job").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from broker.cycle.plan import Launch, Preempt, Snapshot, Start, Terminate
from broker.model import Allocation, Job, Reason
from policies.place.capacity import FreeIndex, Profile, Shadow

if TYPE_CHECKING:  # (the registry names the roles; it imports no policy)
    from policies.registry import PolicySet

M = TypeVar("M")


@dataclass
class Memory:
    """Caches a scheduler keeps across cycles (one per scheduler process, or per simulation).

    ``order_rates``: spillway's order, job id -> (predictor epoch, rate); ``layouts``: node id
    -> its devices by kind, while the node object is the same (policies/place/capacity.py);
    ``outlooks``: the offer a waiting job of a shape would rent, while the offers, the quotas
    and its estimate are the same, and the reason each waiting job was last told, while what
    its sentence is made of is the same (policies/burst/outlook.py); ``carbon_waits``: the plan
    of a deferrable job, per (job, attempt, zone), while the forecast's horizon is the same
    (policies/carbon/wait.py)."""

    order_rates: dict[str, tuple[object, float]] = field(default_factory=dict)
    layouts: dict[str, Any] = field(default_factory=dict)
    outlooks: dict[Any, Any] = field(default_factory=dict)
    carbon_waits: dict[Any, Any] = field(default_factory=dict)


class Cycle(Protocol):
    """A scheduling cycle in progress (``broker.cycle.scheduler.CycleState``)."""

    snap: Snapshot
    now: float
    policies: PolicySet
    memory: Memory
    index: FreeIndex  # free capacity, updated as jobs are placed
    rank: dict[str, int]  # class -> rank
    preemptible: frozenset[str]  # classes that may be preempted
    placer: Placer
    reserver: Reserver
    evictors: tuple[Evictor, ...]
    admit: Callable[[Cycle, Job], str | None]
    # what the cycle decides
    starts: list[Start]
    started: list[tuple[Job, float]]  # (job, expected end) started this cycle
    pending: dict[str, Reason]  # every job left pending, and why
    blocked: list[Job]  # feasible jobs left pending, in queue order
    shadow: Shadow | None  # the reservation being honoured
    guards: list[Shadow]  # reservations of protected jobs behind the head (Reserver.protects)
    evictions: list[Preempt]
    launches: list[Launch]
    terminations: list[Terminate]
    wake_at: float | None  # see Plan.wake_at
    until_event: bool  # see Plan.until_event
    horizon: dict[str, float] | None  # node -> expected end of its last job (aligned packing)
    ends: dict[str, float]  # running job id -> expected end (memo; moves set theirs)

    @property
    def fairshare(self) -> dict[str, float]: ...

    def estimate(self, job: Job) -> float: ...

    def end_of(self, job: Job) -> float: ...

    def settings(self, name: str) -> Mapping[str, Any]: ...

    def memo(self, kind: type[M]) -> M:
        """This cycle's one ``kind()`` (a concern's typed per-cycle state: a dataclass whose
        fields all have defaults), made on the first ask."""

    def start(self, job: Job, allocs: tuple[Allocation, ...], long: bool) -> None: ...

    def reserve(self, job: Job) -> Shadow | None: ...

    def fail(self, job: Job, exc: Exception) -> bool:
        """A policy raised ``exc`` while deciding about ``job``: set the job aside (True), or
        False when ``job`` is not one of the snapshot's pending jobs (then ``exc`` is not
        one pending job's, and the caller lets it propagate)."""


class Placer:
    """The place role: where a job starts on free capacity (policies/place/placement.py).

    ``prepare`` runs once as the cycle starts; ``place`` finds GPUs for a job expected to end
    at ``end`` (or None); ``packs_around_reservation``: a job that ends before the reservation
    starts goes first into the reserved nodes' idle GPUs (policies/place/queue.py)."""

    packs_around_reservation = False

    def prepare(self, cycle: Cycle) -> None:
        del cycle

    def place(self, cycle: Cycle, job: Job, end: float) -> tuple[Allocation, ...] | None:
        raise NotImplementedError


class Reserver:
    """The reserve role: what the first job that cannot be placed (the head) gets
    (policies/place/backfill.py).

    ``strict``: the head blocks every later job (strict order); otherwise ``reserve`` gives it
    a reservation from the release ``profile`` and later jobs backfill around it.

    ``protecting``: some blocked jobs behind the head get a reservation of their own (a
    *guard*, policies/place/backfill.py ``guard``) when :meth:`protects` says so; a job
    later in the queue that would outlive a guard's start may not take the GPUs that guard
    needs (conservative backfill for those jobs only)."""

    strict = False
    protecting = False

    def reserve(self, cycle: Cycle, job: Job, profile: Profile) -> Shadow | None:
        raise NotImplementedError

    def protects(self, cycle: Cycle, job: Job) -> bool:
        """Does this blocked job behind the head get a guard? (``protecting`` only)"""
        del cycle, job
        return False

    def max_guards(self, cycle: Cycle) -> int:
        del cycle
        return 0


class Evictor:
    """The evict role: an evictor that does nothing; subclasses override the points of the
    cycle they act at (policies/evict/base.py says which)."""

    def before_place(self, cycle: Cycle) -> None:
        del cycle

    def head_blocked(self, cycle: Cycle, job: Job) -> None:
        del cycle, job

    def evict(self, cycle: Cycle) -> list[Preempt]:
        del cycle
        return []

    def may_use_reserved(self, cycle: Cycle, job: Job) -> bool:
        del cycle, job
        return False

    def use_reserved(self, cycle: Cycle, job: Job) -> tuple[Allocation, ...] | None:
        del cycle, job
        return None

    #: an arrival may change what this evictor does even on a full cluster with nothing
    #: ending (relief: a new job may become the reservation holder); the simulator runs a
    #: cycle at such an arrival
    acts_on_arrival = False


class Memos:
    """The per-cycle memos of a cycle, one per class (:meth:`Cycle.memo`); a cycle state
    inherits it."""

    def __init__(self) -> None:
        self._memos: dict[type, object] = {}

    def memo(self, kind: type[M]) -> M:
        """This cycle's one ``kind()``, made on the first ask."""
        got = self._memos.get(kind)
        if got is None:
            got = self._memos[kind] = kind()
        return cast(M, got)


class deciding:  # (a context manager, named to read as a clause: with deciding(...))
    """``with deciding(cycle, job):`` around what a policy decides about one pending job: an
    exception raised inside sets the job aside (:meth:`Cycle.fail`) and is swallowed, so the
    policy goes on with the next job. (The cycle then runs again without the jobs set aside:
    what the failed decision left half done is not kept.) An exception about a job that is
    not pending, and any ``BaseException`` (KeyboardInterrupt...), propagate."""

    __slots__ = ("cycle", "job")

    def __init__(self, cycle: Cycle, job: Job) -> None:
        self.cycle, self.job = cycle, job

    def __enter__(self) -> Job:
        return self.job

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        return isinstance(exc, Exception) and self.cycle.fail(self.job, exc)


def wake(cycle: Cycle, at: float) -> None:
    """Ask for a cycle at ``at`` (``Plan.wake_at``: the soonest asked wins)."""
    if cycle.wake_at is None or at < cycle.wake_at:
        cycle.wake_at = at


def each_alone(cycle: Cycle, jobs: Sequence[Job], fn: Callable[[list[Job]], object],
               exc: Exception) -> None:
    """``fn(jobs)`` raised ``exc``: call ``fn`` on each job alone, setting aside the jobs it
    raises on. None does: ``exc`` is not one job's, and is raised again. (What the calls
    decided is not kept: a cycle that set jobs aside runs again without them.)"""
    failed = False
    for job in jobs:
        try:
            fn([job])
        except Exception as e:
            failed = cycle.fail(job, e) or failed
    if not failed:
        raise exc
