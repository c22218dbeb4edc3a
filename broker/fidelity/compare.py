"""Both worlds in one shape: each job's history -> the simulator's records and samples, in
the trace's seconds, cut at a common horizon; then their metrics, the differences, Spearman's
rank correlation of start times and the jobs that diverge most.

Both the real store's jobs and the simulator's in-memory store's jobs are read the same way,
from their histories: a job's wait ends when its process first runs (RUNNING); its GPUs are
busy from the cycle's decision (STARTING) until the attempt ends (PREEMPTED, LOST, SUCCEEDED,
FAILED, CANCELLED); it is queued from its submission, and again from each requeue, until a
decision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from broker.model import Job
from broker.model.state import EvictionKind, JobState
from broker.sim.metrics import compute_metrics
from broker.sim.types import JobRecord, Sample, SimResult, TraceJob

_ENDS = frozenset({JobState.PREEMPTED, JobState.LOST, JobState.SUCCEEDED, JobState.FAILED,
                   JobState.CANCELLED})
_FINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
#: Metrics compared in ``diff`` (scalars of the simulator's metrics dict).
COMPARED = ("utilization", "busy_utilization", "wait_mean_s", "wait_p50_s", "wait_p95_s",
            "wait_p99_s", "jct_mean_s", "bounded_slowdown_mean", "sla_attainment",
            "jain_fairness", "preemptions", "started", "finished")


@dataclass(frozen=True)
class JobView:
    """One job as one world ran it (trace seconds since arrival 0)."""

    id: str
    submit: float
    decided: float | None  # the first cycle's decision to start it
    start: float | None  # its process first ran
    end: float | None  # it finished (None: not by the horizon)
    nodes: tuple[str, ...]  # of its first attempt
    gpu_ids: tuple[str, ...]
    attempts: int
    evictions: tuple[str, ...]  # the kinds, in order
    lost: bool  # a node was lost under it (heartbeat timing)
    dispatch_s: tuple[float, ...]  # decision -> process running, per attempt (trace s)


@dataclass
class World:
    views: dict[str, JobView]
    records: list[JobRecord]
    samples: list[Sample]


def view_of(job: Job, tj: TraceJob, origin: float, k: float, horizon: float) -> JobView:
    """``origin``: the world's time of arrival 0; times are ``(t - origin) * k``, cut at
    ``horizon`` (trace seconds): what happened later is as if it had not happened yet."""
    def t(x: float) -> float:
        return (x - origin) * k

    hist = [h for h in job.history if t(h.time) <= horizon]
    decided = next((t(h.time) for h in hist if h.state is JobState.STARTING), None)
    start = next((t(h.time) for h in hist if h.state is JobState.RUNNING), None)
    end = next((t(h.time) for h in hist if h.state in _FINAL), None)
    first = job.attempts[0].allocations if job.attempts and decided is not None else ()
    starting: dict[int, float] = {}
    dispatch: list[float] = []
    for h in hist:
        if h.state is JobState.STARTING:
            starting[h.attempt] = h.time
        elif h.state is JobState.RUNNING and h.attempt in starting:
            dispatch.append((h.time - starting[h.attempt]) * k)
    return JobView(
        id=tj.id, submit=t(job.submitted_at), decided=decided, start=start, end=end,
        nodes=tuple(a.node_id for a in first), gpu_ids=tuple(g for a in first
                                                             for g in a.gpu_ids),
        attempts=len(starting),
        evictions=tuple((h.kind or EvictionKind.PRIORITY).value for h in hist
                        if h.state is JobState.STOPPING and h.kind is not None),
        lost=any(h.state is JobState.LOST for h in hist), dispatch_s=tuple(dispatch))


def world(jobs: Mapping[str, Job], trace: Sequence[TraceJob], sla: Mapping[str, float],
          origin: float, k: float, horizon: float) -> World:
    """Records and samples of one world; ``trace`` is the unscaled window (its durations)."""
    views: dict[str, JobView] = {}
    records: list[JobRecord] = []
    events: list[tuple[float, int, int, int]] = []  # time, busy GPUs, queued jobs, GPUs
    for tj in trace:
        job = jobs.get(tj.id)
        if job is None or (job.submitted_at - origin) * k > horizon:
            continue  # not submitted (by the horizon)
        v = views[tj.id] = view_of(job, tj, origin, k, horizon)
        rec = JobRecord(tj.id, tj.team, tj.priority, tj.total_gpus, v.submit, tj.duration_s,
                        sla.get(tj.priority, math.inf), first_start_s=v.start, end_s=v.end,
                        preemptions=len(v.evictions),
                        moves=v.evictions.count(EvictionKind.MOVE.value),
                        yields=v.evictions.count(EvictionKind.RELIEF.value))
        g = tj.total_gpus
        queued_since: float | None = v.submit
        busy_since: float | None = None
        stop_at: float | None = None
        for h in job.history:
            at = (h.time - origin) * k
            if at > horizon:
                break
            if h.state is JobState.STARTING and queued_since is not None:
                events += [(queued_since, 0, 1, g), (at, g, -1, -g)]
                queued_since, busy_since = None, at
            elif h.state is JobState.STOPPING:
                stop_at = at
            elif h.state in _ENDS and busy_since is not None:
                events.append((at, -g, 0, 0))
                if h.state in (JobState.PREEMPTED, JobState.LOST):
                    queued_since = at
                    rec.lost_gpu_s += g * (at - stop_at) if stop_at is not None else 0.0
                busy_since = stop_at = None
        if queued_since is not None:
            events.append((queued_since, 0, 1, g))
        records.append(rec)
    return World(views, records, _samples(events, horizon))


def _samples(events: list[tuple[float, int, int, int]], horizon: float) -> list[Sample]:
    events.sort()
    out: list[Sample] = []
    busy = qj = qg = 0
    for at, db, dj, dg in events:
        busy, qj, qg = busy + db, qj + dj, qg + dg
        s = Sample(at, busy, qj, qg)
        if out and out[-1].t == at:
            out[-1] = s
        else:
            out.append(s)
    if out and out[-1].t < horizon:
        last = out[-1]
        out.append(Sample(horizon, last.busy_gpus, last.queued_jobs, last.queued_gpus))
    return out


def result_of(w: World, label: str, capacity: int, meta: Mapping[str, Any]) -> SimResult:
    """A world as the simulator's result (``label`` in the policy's place), metrics filled."""
    result = SimResult(label, capacity, w.records, w.samples, meta=dict(meta))
    result.metrics = compute_metrics(result, 0.0, 0)
    return result


def relative_diff(real: Mapping[str, Any], sim: Mapping[str, Any],
                  keys: Sequence[str] = COMPARED) -> dict[str, float | None]:
    """``(real - sim) / |sim|`` per compared metric (``keys``); 0 when both are 0, None when
    only the simulator's is 0 or either is missing."""
    out: dict[str, float | None] = {}
    for key in keys:
        a, b = real.get(key), sim.get(key)
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            out[key] = None
        elif b == 0:
            out[key] = 0.0 if a == 0 else None
        else:
            out[key] = round((a - b) / abs(b), 4)
    return out


def _ranks(xs: Sequence[float]) -> list[float]:
    """Ranks from 1, ties sharing their average rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for m in range(i, j + 1):
            ranks[order[m]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's of the average ranks); None for fewer than two
    pairs or when either side has a single value."""
    if len(xs) != len(ys):
        raise ValueError("spearman: the two sides differ in length")
    if len(xs) < 2:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        return None
    return cov / math.sqrt(vx * vy)
