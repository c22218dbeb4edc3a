"""What the client returns besides the model's own records: :class:`Explanation` (why a job is
where it is), :class:`NodeView` (a node as an operator sees it), :class:`JobTimeout`, and how
both views are made from the store's records (:func:`node_view`, :func:`state_reason`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.errors import SpillwayError
from broker.model import Allocation, BurstOutlook, HistoryEntry, Job, Node, NodeState, Reason
from broker.model.state import JobState

__all__ = ["Explanation", "JobTimeout", "NodeView", "node_view", "state_reason"]


class JobTimeout(SpillwayError, TimeoutError):
    """``wait`` gave up before the job ended. ``job`` is its last seen record."""

    def __init__(self, job: Job, timeout: float) -> None:
        self.job = job
        super().__init__(
            f"job {job.id} is still {job.state.value} after {timeout:g}s; "
            f"`spillway explain {job.id}` says why"
        )


@dataclass(frozen=True)
class Explanation:
    """Why a job is where it is: the answer to "why is my job still pending?"."""

    job_id: str
    name: str
    state: JobState
    team: str
    priority: str
    rank: int
    sla_s: float
    attempt: int
    waited_s: float  # time queued in the current attempt (until it started, or until now)
    sla_breached: bool  # pending longer than its class accepts
    reason_code: str
    message: str
    # 1-based place in the pending queue as the last scheduling cycle ranked it (None: that
    # cycle did not rank it, e.g. it was submitted since), the queue's length then, and when
    # that cycle ran. Read from the store, never recomputed here.
    position: int | None = None
    pending_total: int | None = None
    ranked_at: float | None = None
    placement: tuple[Allocation, ...] = ()
    exit_code: int | None = None
    history: tuple[HistoryEntry, ...] = ()  # the last few entries
    policy: str = ""  # the policy bundle this client's config names
    team_usage_gpu_s: float | None = None  # the team's past GPU-seconds, decayed to now (what
    #                                        fair share weighs; 0: no recent usage)
    reservation: Mapping[str, Any] | None = None  # the reservation it holds, if any
    blocked_by: Mapping[str, Any] | None = None  # the reservation that holds it back
    # a pending job that may burst: its on-prem start forecast, when its SLA breaks, and when
    # and where it bursts if it still waits then (what the last cycle expected; None: no
    # such outlook, e.g. an on-prem-only job, or one bursting already)
    burst: BurstOutlook | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "team_usage_gpu_s": self.team_usage_gpu_s,
            "reservation": dict(self.reservation) if self.reservation else None,
            "blocked_by": dict(self.blocked_by) if self.blocked_by else None,
            "burst": self.burst.to_dict() if self.burst else None,
            "job_id": self.job_id, "name": self.name, "state": self.state.value,
            "team": self.team, "priority": self.priority, "rank": self.rank,
            "sla_s": self.sla_s, "attempt": self.attempt, "waited_s": round(self.waited_s, 3),
            "sla_breached": self.sla_breached, "reason_code": self.reason_code,
            "message": self.message, "position": self.position,
            "pending_total": self.pending_total, "ranked_at": self.ranked_at,
            "placement": [{"node_id": a.node_id, "gpu_ids": list(a.gpu_ids), "rank": a.rank}
                          for a in self.placement],
            "exit_code": self.exit_code,
            "history": [[h.state.value, h.time, h.reason, h.attempt] for h in self.history],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Explanation:
        """The inverse of :meth:`to_dict` (an API server's reply; ``sla_s`` None: no SLA)."""
        return cls(**{
            **{k: d[k] for k in cls.__dataclass_fields__ if k in d},
            "state": JobState(d["state"]),
            "sla_s": math.inf if d["sla_s"] is None else d["sla_s"],
            "burst": BurstOutlook.from_dict(d["burst"]) if d.get("burst") else None,
            "placement": tuple(Allocation(a["node_id"], tuple(a["gpu_ids"]), a["rank"])
                               for a in d["placement"]),
            "history": tuple(HistoryEntry(JobState(h[0]), h[1], h[2], h[3])
                             for h in d["history"])})


@dataclass(frozen=True)
class NodeView:
    """One node as an operator sees it."""

    id: str
    state: str  # READY, DRAINING, DOWN, or EXPIRED (lease ran out, not yet reconciled)
    site: str
    hostname: str
    gpus_total: Mapping[str, int]  # device kind ("A100-80GB", "A100-80GB/1g.10gb") -> count
    gpus_free: Mapping[str, int]
    jobs: tuple[str, ...]  # ids of jobs holding GPUs here
    lease_age_s: float  # seconds since the last heartbeat
    lease_left_s: float  # seconds until the lease runs out (negative: expired)
    cpus: float = 0.0
    memory_gb: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    instance_id: str = ""  # the cloud machine it runs on ("" on-prem)
    price_per_hour: float | None = None  # that machine's price (None: on-prem or unknown)
    instance_age_s: float | None = None  # since that machine was requested
    isolation: str = ""  # what keeps its jobs apart, as its agent says ("uid per team", or
    # why not: "none: agent not root, jobs run as its user"; workers/users.py)

    @property
    def total(self) -> int:
        return sum(self.gpus_total.values())

    @property
    def free(self) -> int:
        return sum(self.gpus_free.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "state": self.state, "site": self.site, "hostname": self.hostname,
            "gpus_total": dict(self.gpus_total), "gpus_free": dict(self.gpus_free),
            "jobs": list(self.jobs), "lease_age_s": round(self.lease_age_s, 3),
            "lease_left_s": round(self.lease_left_s, 3), "cpus": self.cpus,
            "memory_gb": self.memory_gb, "labels": dict(self.labels),
            **({"isolation": self.isolation} if self.isolation else {}),
            **({"instance_id": self.instance_id, "price_per_hour": self.price_per_hour,
                "instance_age_s": None if self.instance_age_s is None
                else round(self.instance_age_s, 3)} if self.instance_id else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NodeView:
        """The inverse of :meth:`to_dict` (an API server's reply)."""
        kept = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**{**kept, "jobs": tuple(kept.get("jobs", ()))})


def _kind(gpu: Any) -> str:
    return f"{gpu.model}/{gpu.mig_profile}" if gpu.mig_profile else gpu.model


def node_view(node: Node, held: Mapping[str, str], now: float, ttl: float) -> NodeView:
    """One node's view: its GPUs by kind (free: not in ``held``, GPU id -> owner), the jobs
    holding them, and its lease as of ``now`` (``ttl``: the lease's length)."""
    devices = node.allocatable
    total = Counter(_kind(g) for g in devices)
    free = Counter(_kind(g) for g in devices if g.id not in held)
    jobs = tuple(dict.fromkeys(owner.rsplit(":", 1)[0] for owner in held.values()))
    state = node.state.value
    if node.state is not NodeState.DOWN and node.lease_expires <= now:
        state = "EXPIRED"
    return NodeView(
        id=node.id, state=state, site=node.site, hostname=node.hostname,
        gpus_total=dict(sorted(total.items())),
        gpus_free={k: free.get(k, 0) for k in sorted(total)},
        jobs=jobs, lease_age_s=max(0.0, now - (node.lease_expires - ttl)),
        lease_left_s=node.lease_expires - now, cpus=node.cpus, memory_gb=node.memory_gb,
        labels=dict(node.labels), isolation=node.isolation,
    )


def state_reason(job: Job, now: float) -> Reason:
    """Why a job that is not pending is where it is, in one line (what ``explain`` says)."""
    nodes = ", ".join(job.node_ids) or "?"
    last = job.history[-1] if job.history else None
    why = last.reason if last else ""
    if job.state is JobState.STARTING:
        return Reason("Starting", f"placed on {nodes}; waiting for the agent to start it")
    if job.state is JobState.RUNNING:
        since = now - (job.started_at or now)
        return Reason("Running", f"running on {nodes} for {since:.0f}s (attempt {job.attempt})")
    if job.state is JobState.STOPPING:
        target = job.stop_target.value.lower() if job.stop_target else "stopped"
        return Reason("Stopping", f"being {target} on {nodes}: {why}; waiting for its "
                                  "process to exit")
    ran = ""
    if job.started_at is not None and job.finished_at is not None:
        ran = f" after running {job.finished_at - job.started_at:.0f}s"
    if job.state is JobState.SUCCEEDED:
        return Reason("Succeeded", f"exited 0{ran}")
    if job.state is JobState.FAILED:
        code = f", exit code {job.exit_code}" if job.exit_code is not None else ""
        return Reason("Failed", f"{why}{code}{ran}")
    if job.state is JobState.CANCELLED:
        return Reason("Cancelled", f"{why}{ran}")
    return Reason(job.state.value.title(), why)
