"""The scheduling cycle's input (Snapshot) and output (Plan)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from broker.config import PriorityClass
from broker.model import Allocation, Job, Node, Reason


@dataclass(frozen=True)
class Snapshot:
    """An immutable view of the cluster at ``now``: the only input of a scheduling cycle."""

    now: float
    pending: tuple[Job, ...]  # jobs waiting to be placed
    active: tuple[Job, ...]  # jobs holding GPUs (STARTING, RUNNING, STOPPING)
    nodes: tuple[Node, ...]  # live nodes (lease not expired)
    allocated: Mapping[str, Mapping[str, str]]  # node id -> GPU id -> "job:attempt"
    classes: tuple[PriorityClass, ...]

    @cached_property
    def class_by_name(self) -> dict[str, PriorityClass]:
        return {c.name: c for c in self.classes}

    @cached_property
    def node_by_id(self) -> dict[str, Node]:
        return {n.id: n for n in self.nodes}


@dataclass(frozen=True)
class Start:
    job_id: str
    attempt: int
    version: int  # the job's version in the snapshot: the start is compare-and-set on it
    allocations: tuple[Allocation, ...]


@dataclass(frozen=True)
class Preempt:
    job_id: str
    attempt: int
    reason: str
    grace_s: float


@dataclass(frozen=True)
class Launch:
    """Cloud capacity to start (used once bursting lands)."""

    offer_id: str
    count: int
    request_id: str
    for_jobs: tuple[str, ...]


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


@dataclass(frozen=True)
class Applied:
    """What the store actually did with a Plan (compare-and-set may skip stale entries)."""

    started: tuple[Job, ...] = ()
    stopping: tuple[Job, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()  # (job id, why)
