"""What a policy sees of a scheduling cycle in progress, and what lives across cycles.

The cycle's state is built and owned by ``broker/scheduler.py``; policies read the snapshot
and write their decisions only through :class:`Cycle` (this module imports nothing from the
broker's cycle, so policies do not depend on it). :class:`Memory` holds what a scheduler keeps
from one cycle to the next: caches that make a cycle cheaper and never change a decision's
inputs. It is passed beside the Snapshot, which nothing writes into.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from broker.model import Allocation, Job, Reason
from broker.plan import Launch, Preempt, Snapshot, Start, Terminate

if TYPE_CHECKING:  # (types only: these modules register policies and import this one)
    from policies.backfill import Reserver, Shadow
    from policies.evict import Evictor
    from policies.placement import FreeIndex, Placer
    from policies.registry import PolicySet


@dataclass
class Memory:
    """Caches a scheduler keeps across cycles (one per scheduler process, or per simulation).

    ``order_rates``: spillway's order, job id -> (predictor epoch, rate); ``layouts``: node id
    -> its devices by kind, while the node object is the same (policies/placement.py)."""

    order_rates: dict[str, tuple[object, float]] = field(default_factory=dict)
    layouts: dict[str, Any] = field(default_factory=dict)


class Cycle(Protocol):
    """A scheduling cycle in progress (``broker.scheduler.CycleState``)."""

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
    notes: dict[str, Any]  # scratch a policy keeps for later phases of the same cycle

    @property
    def fairshare(self) -> dict[str, float]: ...

    def estimate(self, job: Job) -> float: ...

    def end_of(self, job: Job) -> float: ...

    def settings(self, name: str) -> Mapping[str, Any]: ...

    def start(self, job: Job, allocs: tuple[Allocation, ...], long: bool) -> None: ...

    def reserve(self, job: Job) -> Shadow | None: ...
