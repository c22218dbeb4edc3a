"""What the system tracks about a job: its state, attempts, placement and history.

Every record is a frozen dataclass changed with ``dataclasses.replace``; a state change goes
through :meth:`Job.with_state`, which follows the table in :mod:`broker.model.state`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from operator import attrgetter
from typing import Any

from broker.errors import InvalidTransition
from broker.model.spec import JobSpec, Resources
from broker.model.state import EvictionKind, JobState, can_move


@dataclass(frozen=True)
class Allocation:
    """The GPUs one job holds on one node; ``rank`` orders the nodes of a gang."""

    node_id: str
    gpu_ids: tuple[str, ...]
    rank: int = 0


@dataclass(frozen=True)
class HistoryEntry:
    state: JobState
    time: float
    reason: str
    attempt: int
    kind: EvictionKind | None = None  # an eviction's kind, on the STOPPING entry it caused


@dataclass(frozen=True)
class Attempt:
    """One placement of a job, kept after it ends so GPU use can be audited."""

    number: int
    allocations: tuple[Allocation, ...]
    started_at: float
    ended_at: float | None = None
    outcome: str | None = None


@dataclass(frozen=True)
class BurstOutlook:
    """What the burst phase expects of a pending job that may burst and waits (policies/
    burst_outlook.py): its on-prem start forecast, when its SLA breaks, and the moment it
    bursts if it is still waiting then, to which offer. Times are absolute (seconds since the
    epoch), so the record stays the same from cycle to cycle while the forecast does."""

    burst_at: float  # when the burst policy decides, if the job is still waiting then
    sla_at: float  # when the job's SLA breaks (its queueing plus its class's SLA)
    onprem_start: float | None  # its forecast on-prem start (None: never: cloud-only, or
    #                             no on-prem GPU could hold it)
    offer_id: str  # the offer it would rent, as things stand now
    provider: str
    region: str
    zone: str
    market: str  # "spot" or "ondemand"
    instance_type: str
    price_per_hour: float  # the offer's price, the whole instance
    boot_s: float  # the offer's boot estimate (the providers' machines' observed boots)
    cloud_only: bool = False  # its sites allow no on-prem node

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BurstOutlook:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    @property
    def where(self) -> str:
        """The offer for a sentence: ``gcp us-central1-a spot a2-highgpu-1g``."""
        return f"{self.provider} {self.zone or self.region} {self.market} {self.instance_type}"


@dataclass(frozen=True)
class Reason:
    """Why a job is still pending. ``code`` is stable (Priority, Resources, NoFeasibleNode...).
    ``burst``: for a job that may burst and waits, what the burst phase expects of it."""

    code: str
    message: str
    burst: BurstOutlook | None = None

    def to_list(self) -> list[Any]:
        """As stored: ``[code, message]``, with the outlook's dict third when there is one."""
        out: list[Any] = [self.code, self.message]
        return [*out, self.burst.to_dict()] if self.burst is not None else out

    @classmethod
    def from_list(cls, raw: Sequence[Any]) -> Reason:
        burst = BurstOutlook.from_dict(raw[2]) if len(raw) > 2 and raw[2] else None
        return cls(str(raw[0]), str(raw[1]), burst)


@dataclass(frozen=True)
class Job:
    id: str
    spec: JobSpec
    state: JobState
    submitted_at: float
    attempt: int = 1
    version: int = 1
    history: tuple[HistoryEntry, ...] = ()
    allocations: tuple[Allocation, ...] = ()  # the current attempt's GPUs
    attempts: tuple[Attempt, ...] = ()  # every placement, past and current
    exit_code: int | None = None
    parts_exited: tuple[tuple[int, int], ...] = ()  # (rank, exit code) of the current attempt
    stop_target: JobState | None = None  # CANCELLED or PREEMPTED while STOPPING
    pending_reason: Reason | None = None
    started_at: float | None = None  # when the current attempt started RUNNING
    finished_at: float | None = None

    @cached_property
    def priority(self) -> str:
        return self.spec.priority or "normal"

    @cached_property
    def res(self) -> Resources:
        """``spec.resources``, computed once per record (the cycle asks often)."""
        return self.spec.resources

    @cached_property
    def kind_key(self) -> str:
        """What makes jobs alike for runtime prediction: the name, else the command."""
        return self.spec.name or self.spec.display_command

    @cached_property
    def team(self) -> str:
        return self.spec.team or "default"

    @property
    def name(self) -> str:
        return self.spec.name or self.id

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(a.node_id for a in self.allocations)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "spec": self.spec.model_dump(mode="json"),
            "state": self.state.value,
            "submitted_at": self.submitted_at,
            "attempt": self.attempt,
            "version": self.version,
            "history": [[h.state.value, h.time, h.reason, h.attempt]
                        + ([h.kind.value] if h.kind is not None else [])
                        for h in self.history],
            "allocations": [_alloc_dict(a) for a in self.allocations],
            "attempts": [
                {
                    "number": a.number,
                    "allocations": [_alloc_dict(x) for x in a.allocations],
                    "started_at": a.started_at,
                    "ended_at": a.ended_at,
                    "outcome": a.outcome,
                }
                for a in self.attempts
            ],
            "exit_code": self.exit_code,
            "parts_exited": [list(p) for p in self.parts_exited],
            "stop_target": self.stop_target.value if self.stop_target else None,
            "pending_reason": self.pending_reason.to_list() if self.pending_reason else None,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Job:
        return cls(
            id=d["id"],
            spec=JobSpec.model_construct(**_spec_fields(d["spec"])),
            state=JobState(d["state"]),
            submitted_at=d["submitted_at"],
            attempt=d["attempt"],
            version=d["version"],
            history=tuple(HistoryEntry(JobState(h[0]), h[1], h[2], h[3],
                                       EvictionKind(h[4]) if len(h) > 4 else None)
                          for h in d["history"]),
            allocations=tuple(_alloc(a) for a in d["allocations"]),
            attempts=tuple(
                Attempt(a["number"], tuple(_alloc(x) for x in a["allocations"]),
                        a["started_at"], a["ended_at"], a["outcome"])
                for a in d["attempts"]
            ),
            exit_code=d["exit_code"],
            parts_exited=tuple((r, c) for r, c in d["parts_exited"]),
            stop_target=JobState(d["stop_target"]) if d["stop_target"] else None,
            pending_reason=Reason.from_list(d["pending_reason"]) if d["pending_reason"]
            else None,
            started_at=d["started_at"],
            finished_at=d["finished_at"],
        )

    def with_state(self, new: JobState, now: float, reason: str,
                   kind: EvictionKind | None = None, **changes: Any) -> Job:
        """Move to ``new`` along a legal edge, recording history (``kind``: the eviction that
        caused it); raise InvalidTransition."""
        if not can_move(self.state, new):
            raise InvalidTransition(self.id, self.state.value, new.value)
        entry = HistoryEntry(new, now, reason, changes.get("attempt", self.attempt), kind)
        return replace(self, state=new, history=(*self.history, entry), **changes)


#: Sort key for jobs, oldest first: submission time, then id (C-level: long queues use it).
BY_AGE = attrgetter("submitted_at", "id")


def _alloc_dict(a: Allocation) -> dict[str, Any]:
    return {"node_id": a.node_id, "gpu_ids": list(a.gpu_ids), "rank": a.rank}


def _alloc(d: Mapping[str, Any]) -> Allocation:
    return Allocation(d["node_id"], tuple(d["gpu_ids"]), d.get("rank", 0))


def _spec_fields(d: Mapping[str, Any]) -> dict[str, Any]:
    """Stored specs were validated on submit: rebuild without re-validating (fast path)."""
    out = dict(d)
    for key in ("gpu_types", "sites"):
        if key in out and out[key] is not None:
            out[key] = tuple(out[key])
    return out
