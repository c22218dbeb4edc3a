"""Plain records the simulator passes between its parts (trace -> engine -> metrics -> report),
and the progress a run reports to its caller."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TraceJob:
    """One job of a workload trace, after time limits, classes and load scaling are applied."""

    id: str  # stable and unique within the trace, e.g. "philly-000123"
    submit_s: float  # seconds since the trace's start (after --load-scale)
    duration_s: float  # actual runtime, on ``gpu_type`` if given, else on any GPU
    gpus: int  # GPUs per node
    nodes: int  # > 1: a gang across nodes
    team: str
    priority: str  # a class name
    time_limit_s: float  # the user's limit (given, or derived: always >= duration_s)
    gpu_type: str | None = None  # the model the duration was measured on; also pins the job
    preemptible: bool | None = None  # None: as its class says
    name: str | None = None

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.nodes


@dataclass(frozen=True)
class Trace:
    name: str  # "philly" or the file's path
    origin: float  # epoch seconds of submit_s == 0 (the first kept job's original submit time)
    jobs: tuple[TraceJob, ...]  # sorted by (submit_s, id)
    notes: tuple[str, ...] = ()  # what was derived: limits, classes, splits, the window


@dataclass
class JobRecord:
    """How one job fared in a simulation."""

    id: str
    team: str
    priority: str
    gpus: int  # total GPUs (gpus per node x nodes)
    submit_s: float
    duration_s: float  # the runtime it needed (on the GPUs it got)
    sla_s: float  # its class's SLA
    first_start_s: float | None = None  # None: never started (infeasible or unfinished)
    end_s: float | None = None
    preemptions: int = 0  # evictions of any kind, defragmentation moves included
    moves: int = 0  # of which defragmentation moves (it restarted elsewhere at once)
    yields: int = 0  # of which relief evictions (it made room for a starved short job)
    lost_gpu_s: float = 0.0  # GPU-seconds of work thrown away by preemptions
    infeasible: bool = False  # could never fit the cluster
    failed: bool = False  # gave up (``max_preemptions``): it never finishes


@dataclass(frozen=True)
class Sample:
    """The cluster at time ``t`` (one sample per change)."""

    t: float
    busy_gpus: int
    queued_jobs: int  # feasible jobs waiting
    queued_gpus: int


@dataclass
class SimResult:
    policy: str
    capacity_gpus: int
    records: list[JobRecord]
    samples: list[Sample]
    metrics: dict[str, Any] = field(default_factory=dict)  # what --json writes
    meta: Mapping[str, Any] = field(default_factory=dict)  # trace name, window, load scale


@dataclass(frozen=True)
class Progress:
    """How far a run is: what a progress callback receives (it changes nothing in the run)."""

    policy: str
    arrived: int  # jobs submitted so far
    total: int  # jobs the run will submit (the feasible ones)
    sim_s: float  # simulated seconds since the trace's start
    span_s: float  # the trace's last submit time (seconds since its start)
    wall_s: float
    origin: float = 0.0  # epoch seconds of sim_s == 0
    done: bool = False


ProgressFn = Callable[[Progress], None]
