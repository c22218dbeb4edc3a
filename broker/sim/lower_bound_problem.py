"""The lower bound's problem and its answer (broker/sim/lower_bound.py solves it): the jobs as
the bound sees them, the on-prem GPU pools, the cloud offers with their quotas and spot
capacity, the carbon rate, and the result of one solve. Times in seconds on one clock (the
trace's); work in GPU-hours.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from broker.model.gpus import type_matches

OBJECTIVES = ("cost", "carbon")
SpotSeconds = Callable[[str, float, float], float]  # zone, t0, t1 -> seconds with spot
KgRate = Callable[[str, str, float, float], float]  # site, model, t0, t1 -> kg per GPU-hour


@dataclass(frozen=True)
class LbJob:
    """One job as the bound sees it. Times in seconds on one clock (the trace's)."""

    id: str
    submit_s: float
    runtime_s: float  # its work's duration on any GPU it may use
    gpus: int  # per node
    nodes: int = 1
    cls: str = "normal"
    sla_s: float = math.inf  # its class's longest wait
    deadline_s: float = math.inf  # it must have ended by then
    cloud: bool = False  # may run in the cloud at all
    spot: bool = False  # may run on spot
    gpu_types: tuple[str, ...] = ()  # families or models it is pinned to (empty: any)
    whole: bool = False  # runs uninterrupted at its full width from one start (never paused)

    @property
    def latest_start_s(self) -> float:
        """The latest start that still ends it within its window."""
        return max(self.submit_s, self.end_s - self.runtime_s)

    @property
    def end_s(self) -> float:
        """Its window's end: started within its SLA and run through, or its deadline."""
        return min(self.submit_s + self.sla_s + self.runtime_s, self.deadline_s)

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.nodes * self.runtime_s / 3600.0

    @property
    def type_key(self) -> tuple[Any, ...]:
        return (self.gpus, self.gpu_types, self.cloud, self.spot)


@dataclass(frozen=True)
class LbPool:
    """On-prem GPUs of one model."""

    model: str
    gpus: int
    site: str = "onprem"


@dataclass(frozen=True)
class LbOffer:
    """A cloud option: an instance type at a site, at its price per GPU-hour."""

    id: str
    region: str  # the quota's key, e.g. aws:us-east-1
    gpu_model: str
    gpu_count: int  # GPUs per instance: the widest node of a job it holds
    price_per_gpu_hour: float
    site: str  # e.g. aws:us-east-1:us-east-1c:spot (its carbon zone and PUE)
    spot_zone: str | None = None  # a spot offer: the zone whose capacity it needs

    @property
    def is_spot(self) -> bool:
        return self.spot_zone is not None or self.site.endswith(":spot")

    @property
    def capacity_key(self) -> tuple[str, str]:
        return (self.region, self.spot_zone or self.site)


@dataclass(frozen=True)
class LbProblem:
    jobs: tuple[LbJob, ...]
    pools: tuple[LbPool, ...]
    offers: tuple[LbOffer, ...] = ()
    quotas: Mapping[str, float] = field(default_factory=dict)  # region -> GPUs at once
    spot_seconds: SpotSeconds | None = None  # None: spot always there
    kg_per_gpu_hour: KgRate | None = None  # needed by the carbon objective
    horizon_s: float = 0.0  # the slots reach at least this far (a run's last end)


@dataclass
class LbResult:
    objective: str
    status: str  # "optimal", "infeasible", or HiGHS's message
    value: float | None  # dollars (cost) or kg (carbon); None unless optimal
    slot_s: float
    slots: int
    jobs: int
    groups: int
    variables: int
    constraints: int
    nonzeros: int
    build_s: float
    solve_s: float
    cloud_gpu_hours: float | None = None
    onprem_gpu_hours: float | None = None
    missed_gpu_hours: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def allowed_model(model: str, wanted: tuple[str, ...]) -> bool:
    return not wanted or any(type_matches(model, t) for t in wanted)


def check(problem: LbProblem, objective: str, misses: Mapping[str, int], slot_s: float
           ) -> None:
    if objective not in OBJECTIVES:
        raise ValueError(f"lower bound objective {objective!r} is not allowed; use one of "
                         f"{', '.join(OBJECTIVES)}")
    if not (slot_s > 0 and math.isfinite(slot_s)):
        raise ValueError(f"lower bound slot_s {slot_s!r} is not allowed; use seconds > 0")
    if objective == "carbon" and problem.kg_per_gpu_hour is None:
        raise ValueError("lower bound objective carbon: the problem has no kg_per_gpu_hour")
    for cls, k in misses.items():
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"lower bound misses[{cls!r}]: {k!r} is not allowed; use a whole "
                             "number of jobs >= 0")
    for j in problem.jobs:
        if not (j.runtime_s >= 0 and math.isfinite(j.runtime_s) and j.gpus >= 1
                and j.nodes >= 1 and math.isfinite(j.submit_s)):
            raise ValueError(f"lower bound job {j.id!r}: runtime_s, gpus, nodes or submit_s "
                             "is not allowed (runtime >= 0, whole GPUs and nodes >= 1)")
