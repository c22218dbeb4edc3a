"""Policy registry: each role has one signature; configuration picks an implementation by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

ROLES = ("order", "admit", "place")
_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {role: {} for role in ROLES}


def register(role: str, name: str) -> Callable[[F], F]:
    """Decorator: make ``fn`` selectable as ``name`` for ``role``."""
    if role not in _REGISTRY:
        raise ValueError(f"unknown policy role {role!r}; roles: {', '.join(ROLES)}")

    def deco(fn: F) -> F:
        _REGISTRY[role][name] = fn
        return fn

    return deco


def lookup(role: str, name: str) -> Callable[..., Any]:
    try:
        return _REGISTRY[role][name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY.get(role, {}))) or "none"
        raise ValueError(f"no {role} policy named {name!r}; registered: {known}") from None


BACKFILL = ("none", "easy")
PREEMPT = ("none", "priority")
ESTIMATE = ("limit", "predictor")


@dataclass(frozen=True)
class PolicySet:
    """One implementation per role, by name, and how the cycle backfills and preempts.

    ``backfill``: ``none`` (a blocked job blocks every later one: strict order) or ``easy``
    (the top blocked job gets a reservation; later jobs start only if they do not delay it).
    ``preempt``: ``none`` or ``priority`` (a class that may preempt evicts lower-ranked
    preemptible jobs; a team below its guaranteed quota reclaims it from borrowers).
    ``estimate``: runtimes for backfill come from the time ``limit`` or the ``predictor``.
    ``scavenge``: a job that would outlive the reservation may still use the reserved GPUs if
    it is preemptible and checkpoints; it is evicted (SIGTERM, grace, requeue) when the
    reservation is due, so the reservation holds and its GPUs do not sit idle while it drains.
    ``defrag``: when the reservation is far off but enough GPUs are free on other nodes, move
    small checkpointable jobs there (checkpoint, restart) to make whole nodes for it now
    (policies/defrag.py).
    ``relief``: when the head's reservation is so far off that its wait would be many times its
    runtime, let it evict long checkpointable jobs whose slowdown suffers far less
    (policies/relief.py).
    """

    order: str = "priority-fifo"
    admit: str = "admit-all"
    place: str = "best-fit"
    backfill: str = "easy"
    preempt: str = "priority"
    estimate: str = "limit"
    scavenge: bool = False  # let checkpointable preemptible jobs into a reservation's GPUs
    defrag: bool = False  # move small checkpointable jobs to make whole nodes for the head
    relief: bool = False  # a starved short head may evict long checkpointable jobs
    name: str = "custom"

    def __post_init__(self) -> None:
        for field_, allowed in (("backfill", BACKFILL), ("preempt", PREEMPT),
                                ("estimate", ESTIMATE)):
            if getattr(self, field_) not in allowed:
                raise ValueError(f"policy {field_} {getattr(self, field_)!r}: "
                                 f"allowed {', '.join(allowed)}")

    def resolve(self, role: str) -> Callable[..., Any]:
        return lookup(role, getattr(self, role))

    @classmethod
    def named(cls, name: str) -> PolicySet:
        try:
            return BUNDLES[name]
        except KeyError:
            raise ValueError(f"no policy named {name!r}; known: {', '.join(sorted(BUNDLES))}"
                             ) from None


BUNDLES: dict[str, PolicySet] = {
    # strict first come, first served: no classes, no backfill, no preemption
    "fcfs": PolicySet(order="fifo", backfill="none", preempt="none", name="fcfs"),
    # Slurm's multifactor priority (age, fair share, size) + EASY backfill on the user limits
    "slurm-like": PolicySet(order="multifactor", backfill="easy", preempt="none",
                            estimate="limit", name="slurm-like"),
    # expected-slowdown order with fair share, held reservations, predicted runtimes,
    # class preemption and quota reclaim, scavenging and defragmentation
    "spillway": PolicySet(order="spillway", place="aligned", backfill="easy",
                          preempt="priority", estimate="predictor", scavenge=True,
                          defrag=True, relief=True, name="spillway"),
}
