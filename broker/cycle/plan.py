"""The scheduling cycle's input (Snapshot) and output (Plan)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from broker.model import (
    Allocation,
    Instance,
    Job,
    Node,
    Offer,
    PriorityClass,
    Reason,
    Site,
    Team,
)
from broker.model.state import EvictionKind


class Estimator(Protocol):
    """Predicts runtimes from finished jobs (policies/order/predictor.py). Read-only in a cycle."""

    def estimate(self, job: Job, quantile: float | None = None) -> float: ...


@dataclass(frozen=True)
class Snapshot:
    """An immutable view of the cluster at ``now``: the only input of a scheduling cycle."""

    now: float
    pending: tuple[Job, ...]  # jobs waiting to be placed
    active: tuple[Job, ...]  # jobs holding GPUs (STARTING, RUNNING, STOPPING)
    nodes: tuple[Node, ...]  # live nodes (lease not expired)
    allocated: Mapping[str, Mapping[str, str]]  # node id -> GPU id -> "job:attempt"
    classes: tuple[PriorityClass, ...]
    teams: tuple[Team, ...] = ()
    usage: Mapping[str, float] = field(default_factory=dict)  # team -> decayed GPU-seconds
    predictor: Estimator | None = None
    reservation: Reservation | None = None  # what the last cycle reserved (it holds)
    settings: Mapping[str, Any] = field(default_factory=dict)  # policy knobs from the config
    half_life_s: float = 7 * 86400.0
    min_runtime_s: float = 600.0
    grace_s: float = 30.0
    # room for the cloud, money and carbon: all empty on an on-prem cluster (the cloud, budget
    # and carbon issues fill them)
    sites: tuple[Site, ...] = ()  # the sites capacity may come from (on-prem and clouds)
    offers: tuple[Offer, ...] = ()  # cloud capacity that could be rented now
    instances: tuple[Instance, ...] = ()  # cloud machines rented, in every state
    budgets: Mapping[str, float] = field(default_factory=dict)  # team -> $ cap, this window
    spend: Mapping[str, float] = field(default_factory=dict)  # team -> $ spent + reserved, now
    soft_budgets: frozenset[str] = frozenset()  # teams whose cap is soft (policies/burst/budget.py)
    prices: Mapping[str, float] = field(default_factory=dict)  # offer id -> $/hour now
    carbon: Mapping[str, float] = field(default_factory=dict)  # carbon zone -> gCO2e/kWh now
    # carbon zone -> forecast steps (unix time, gCO2e/kWh) from now: the carbon defer policy
    carbon_forecast: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    # spot zone ("provider:zone") -> what the scheduler has seen of its availability: a
    # policies.burst.spot_deadline.SpotMarket kept by broker/cloud/spot_signals.py (read it, never
    # feed it)
    spot_markets: Mapping[str, Any] = field(default_factory=dict)

    @cached_property
    def team_by_name(self) -> dict[str, Team]:
        return {t.name: t for t in self.teams}

    @cached_property
    def class_by_name(self) -> dict[str, PriorityClass]:
        return {c.name: c for c in self.classes}

    @cached_property
    def node_by_id(self) -> dict[str, Node]:
        return {n.id: n for n in self.nodes}


@dataclass(frozen=True)
class Reservation:
    """EASY backfill's reservation: the top blocked job starts by ``start_at`` on these nodes."""

    job_id: str
    start_at: float
    node_ids: tuple[str, ...]
    model: str  # the GPU model reserved
    scavengers: tuple[str, ...] = ()  # preemptible jobs let into its GPUs until it starts

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "start_at": self.start_at,
                "node_ids": list(self.node_ids), "model": self.model,
                "scavengers": list(self.scavengers)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Reservation:
        return cls(str(d["job_id"]), float(d["start_at"]), tuple(d["node_ids"]), str(d["model"]),
                   tuple(d.get("scavengers", ())))


@dataclass(frozen=True)
class Start:
    job_id: str
    attempt: int
    version: int  # the job's version in the snapshot: the start is compare-and-set on it
    allocations: tuple[Allocation, ...]
    # (node id, team, dollars) a start on rented machines is expected to cost, reserved before
    # it is applied (policies/burst/budget.py); () : no budget applies
    budget: tuple[tuple[str, str, float], ...] = ()


@dataclass(frozen=True)
class Preempt:
    job_id: str
    attempt: int
    reason: str  # for people: who it makes room for
    grace_s: float
    kind: EvictionKind = EvictionKind.PRIORITY  # why, typed: recorded in the job's history
    for_job: str | None = None  # the pending job it makes room for (None: no one job)


@dataclass(frozen=True)
class Launch:
    """Cloud capacity to start (used once bursting lands)."""

    offer_id: str
    count: int
    request_id: str
    for_jobs: tuple[str, ...]
    # (team, dollars) the budget step expects the launch to cost each team, reserved in the
    # store before it is sent (policies/burst/budget.py); () : no budget applies
    budget: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Terminate:
    instance_ids: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Plan:
    starts: tuple[Start, ...] = ()
    preemptions: tuple[Preempt, ...] = ()
    launches: tuple[Launch, ...] = ()
    terminations: tuple[Terminate, ...] = ()
    pending: Mapping[str, Reason] = field(default_factory=dict)  # every job not started, and why
    reservation: Reservation | None = None
    order: tuple[str, ...] = ()  # the pending queue as ranked this cycle (for explain)
    # the cycle would decide otherwise at this time even if nothing else changed (relief
    # waiting for running jobs to pass the minimum runtime); None: only an event can change it.
    # The simulator, which skips cycles that cannot change anything, runs one then; production
    # runs a cycle every cycle_s anyway
    wake_at: float | None = None
    # nothing but a job leaving (an end, an eviction) can change this plan: arrivals queue
    # behind a job left waiting (strict order, arrivals last, nothing evicts). The simulator
    # skips cycles until one; production runs a cycle every cycle_s anyway
    until_event: bool = False
    # job id -> why it was set aside this cycle: a policy raised an exception deciding about it
    # (each is also in ``pending``, with the ``PolicyError`` reason); the others were planned
    # without them (broker/cycle/scheduler.py run_cycle)
    set_aside: Mapping[str, SetAside] = field(default_factory=dict)


#: the reason code of a job set aside: a policy raised an exception deciding about it
POLICY_ERROR = "PolicyError"


@dataclass(frozen=True)
class SetAside:
    """A job a policy failed on, set aside for one cycle: the policy (its role and registered
    name), the exception (type, message, where raised) and the job's ``PolicyError`` reason."""

    role: str
    policy: str
    error: str
    reason: Reason


@dataclass(frozen=True)
class Applied:
    """What the store actually did with a Plan (compare-and-set may skip stale entries)."""

    started: tuple[Job, ...] = ()
    stopping: tuple[Job, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()  # (job id, why)
