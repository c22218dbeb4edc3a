"""The scheduler's Prometheus series (prometheus-client), in the scheduler process's registry.

:func:`scheduler_metrics` gives this process's :class:`SchedulerMetrics`, served on ``/metrics``
by :func:`broker.metrics.http.serve` on ``metrics_port`` (broker/config/core.py; 0 disables).
Names follow Prometheus' conventions: the ``spillway_`` prefix, base units (``_seconds``),
``_total`` on counters. docs/operations.md lists them with the alerts
(infra/prometheus/rules.yml) and the dashboard (infra/grafana/spillway.json) built on them. The
cloud's series (instances, spend, launches, boot times, orphans) are
:class:`broker.metrics.cloud.CloudMetrics`, in the same registry. The worker agent's series are
in :mod:`broker.metrics.agent`, a module of their own: the agent process loads nothing of the
scheduler's.

The gauges are computed from the cycles' Snapshots (:meth:`SchedulerMetrics.observe_cycle`; at
most every ``GAUGE_EVERY_S`` of the snapshots' time, as each pass reads every pending job and
node while cycles come every few milliseconds in a burst of starts), so they are the leader's
view; a scheduler that stops leading removes them (and sets
``spillway_leader`` to 0), so summing a gauge over every scheduler gives the leader's value.
Counters count what this process did; after a takeover the new leader counts on.

The functions here read Snapshots, Plans and Applied results and write nothing but the
metric objects.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from broker.cycle.plan import Applied, Plan, Snapshot
from broker.metrics.cloud import CloudMetrics
from broker.model import Gpu, Job, PriorityClass
from broker.model.state import EvictionKind, JobState

__all__ = [
    "PHASES",
    "SchedulerMetrics",
    "queued_at",
    "scheduler_metrics",
    "wait_buckets",
]

PHASES = ("snapshot", "plan", "apply")  # the cycle's phases, timed by broker/control/loop.py
#: cycle phase buckets, seconds: a cycle of 10,000 jobs takes about 0.1 s (docs/benchmarks.md)
PHASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
WAIT_FIXED = (1.0, 5.0, 15.0, 30.0, 60.0)  # short waits, whatever the SLAs
SLA_FRACTIONS = (0.1, 0.25, 0.5, 1.0, 2.0)  # wait buckets at these fractions of each SLA
GAUGE_EVERY_S = 0.25  # the queue, capacity and node gauges: at most this often (scrapes: 15 s)


def wait_buckets(classes: Iterable[PriorityClass]) -> tuple[float, ...]:
    """Histogram buckets for queue waits: a few short ones, then each class's SLA and
    fractions and a multiple of it, so ``le="<sla>"`` reads "started within its SLA"."""
    edges = set(WAIT_FIXED) | {round(c.sla_s * f, 3) for c in classes for f in SLA_FRACTIONS}
    return tuple(sorted(edges))


def queued_at(job: Job) -> float:
    """When the job last entered PENDING (its submission, or its last requeue)."""
    return next((h.time for h in reversed(job.history) if h.state is JobState.PENDING),
                job.submitted_at)


def _model(gpu: Gpu) -> str:
    return f"{gpu.model}/{gpu.mig_profile}" if gpu.mig_profile else gpu.model


Labels = tuple[str, ...]


class _Zeroing:
    """Sets a labelled gauge to this cycle's values; label sets seen before and absent now
    read 0 (the set of classes, teams, sites and models is small), until :meth:`clear`."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self.seen: set[Labels] = set()

    def set(self, values: Mapping[Labels, float]) -> None:
        self.seen.update(values)
        for labels in self.seen:
            self.gauge.labels(*labels).set(values.get(labels, 0.0))

    def clear(self) -> None:
        self.gauge.clear()
        self.seen.clear()


class SchedulerMetrics:
    """The scheduler's metrics, in their own registry."""

    def __init__(self, classes: Sequence[PriorityClass],
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.sla = {c.name: c.sla_s for c in classes}
        # -- from each cycle's snapshot (the leader's view; removed when it stops leading)
        self.queue_depth = Gauge(
            "spillway_queue_depth", "Jobs pending, by priority class and team",
            ["class", "team"], registry=r)
        self.queue_oldest = Gauge(
            "spillway_queue_oldest_wait_seconds",
            "How long the oldest pending job has waited since it was last queued (0: none)",
            ["class", "team"], registry=r)
        self.gpus_allocated = Gauge(
            "spillway_gpus_allocated", "GPU devices (whole GPUs or MIG instances) held by jobs "
            "on live nodes", ["site", "model"], registry=r)
        self.gpus_capacity = Gauge(
            "spillway_gpus_capacity", "GPU devices jobs can hold on live nodes",
            ["site", "model"], registry=r)
        self.nodes = Gauge("spillway_nodes", "Live nodes (lease not expired), by state",
                           ["state"], registry=r)
        self.jobs_active = Gauge(
            "spillway_jobs_active", "Jobs holding GPUs, by state (STARTING, RUNNING, STOPPING)",
            ["state"], registry=r)
        # the cloud's series: instances, spend, launches, boots, orphans (broker/metrics/cloud.py)
        self.cloud = CloudMetrics(r)
        # -- what this process did
        self.wait = Histogram(
            "spillway_job_wait_seconds", "Queue wait of jobs started, since they were last "
            "queued, by priority class", ["class"], buckets=wait_buckets(classes), registry=r)
        self.sla_breaches = Counter(
            "spillway_sla_breaches_total", "Pending jobs whose wait passed their class's SLA "
            "(once per attempt, when seen past it)", ["class"], registry=r)
        self.cycle_seconds = Histogram(
            "spillway_cycle_duration_seconds", "Scheduling cycle time by phase (snapshot, "
            "plan, apply)", ["phase"], buckets=PHASE_BUCKETS, registry=r)
        self.starts = Counter("spillway_job_starts_total",
                              "Job starts the scheduler applied", registry=r)
        self.preemptions = Counter(
            "spillway_preemptions_total", "Running jobs the scheduler stopped to make room, "
            "by eviction kind", ["kind"], registry=r)
        self.requeues = Counter(
            "spillway_reconciler_requeues_total", "Jobs the reconciler requeued from nodes "
            "whose lease ran out", registry=r)
        self.cycle_failures = Counter(
            "spillway_cycle_failures_total", "Scheduling cycles that failed: an exception the "
            "cycle could not set aside with one job (a policy failing for every job, a broken "
            "setting, a bug in applying the plan); the leader runs the next a second later",
            registry=r)
        self.set_aside = Counter(
            "spillway_jobs_set_aside_total", "Jobs set aside by a cycle because a policy "
            "raised an exception deciding about them, by role and policy (once per cycle: a "
            "job set aside by ten cycles counts ten)", ["role", "policy"], registry=r)
        self.set_aside_now = Gauge(
            "spillway_set_aside_jobs", "Jobs the last cycle set aside (a policy failed on "
            "them; `spillway status` lists them, `spillway explain JOB` says why)", registry=r)
        self.leader = Gauge("spillway_leader", "1 while this scheduler leads, else 0",
                            registry=r)
        self.leadership_changes = Counter(
            "spillway_leadership_changes_total", "Times this scheduler started or stopped "
            "leading", registry=r)
        for kind in EvictionKind:
            self.preemptions.labels(kind.value)  # every kind reads 0 before the first
        for name in self.sla:
            self.sla_breaches.labels(name)
        self._leading = False
        self._gauges_at = float("-inf")  # the snapshot time of the last gauge pass
        self._breached: set[tuple[str, int]] = set()  # (job, attempt) counted past its SLA
        self._depth, self._oldest = _Zeroing(self.queue_depth), _Zeroing(self.queue_oldest)
        self._held, self._total = _Zeroing(self.gpus_allocated), _Zeroing(self.gpus_capacity)
        self._nodes, self._active = _Zeroing(self.nodes), _Zeroing(self.jobs_active)
        self._per_cycle = (self._depth, self._oldest, self._held, self._total, self._nodes,
                           self._active)
        self._lock = threading.Lock()  # the lease thread and the loop may both call

    # -- the cycle -----------------------------------------------------------------------

    def observe_cycle(self, snap: Snapshot, plan: Plan, applied: Applied,
                      phases: Mapping[str, float]) -> None:
        """Update from one cycle: its snapshot, its plan, what the store applied, and each
        phase's seconds. The gauges (and the breaches of jobs still pending) are passed over
        at most every ``GAUGE_EVERY_S``; counters and the wait histogram every cycle."""
        with self._lock:
            for phase, seconds in phases.items():
                self.cycle_seconds.labels(phase).observe(seconds)
            if not 0 <= snap.now - self._gauges_at < GAUGE_EVERY_S:
                self._gauges_at = snap.now
                self._queue(snap, {j.id for j in applied.started})
                self._capacity(snap, applied)
                self.cloud.observe_snapshot(snap)
            self._started(snap, applied)
            self.set_aside_now.set(len(plan.set_aside))
            for aside in plan.set_aside.values():
                self.set_aside.labels(aside.role, aside.policy).inc()
            stopped = {j.id for j in applied.stopping}
            for pre in plan.preemptions:
                if pre.job_id in stopped:
                    self.preemptions.labels(pre.kind.value).inc()

    def _queue(self, snap: Snapshot, started: set[str]) -> None:
        """The queue as the cycle left it (less the jobs it started); breaches of every job
        the cycle saw pending, started or not. One tight pass: it runs every cycle."""
        now, sla, never = snap.now, self.sla, float("inf")
        depth: dict[Labels, float] = {}
        first: dict[Labels, float] = {}  # the earliest queued_at
        breached: dict[tuple[str, int], str] = {}  # (job, attempt) -> class
        pending = JobState.PENDING
        for job in snap.pending:
            h = job.history
            at = h[-1].time if h and h[-1].state is pending else queued_at(job)
            if now - at > sla.get(job.priority, never):
                breached[(job.id, job.attempt)] = job.priority
            if job.id not in started:
                key = (job.priority, job.team)
                depth[key] = depth.get(key, 0.0) + 1
                if at < first.get(key, never):
                    first[key] = at
        for seen, name in breached.items():
            if seen not in self._breached:
                self.sla_breaches.labels(name).inc()
        self._breached = set(breached)  # only jobs still pending are remembered
        self._depth.set(depth)
        self._oldest.set({k: max(0.0, now - at) for k, at in first.items()})

    def _capacity(self, snap: Snapshot, applied: Applied) -> None:
        """GPUs, nodes and active jobs as the cycle left them (its starts and stops applied)."""
        fresh: dict[str, set[str]] = {}
        for job in applied.started:
            for a in job.allocations:
                fresh.setdefault(a.node_id, set()).update(a.gpu_ids)
        total: dict[Labels, float] = {}
        held: dict[Labels, float] = {}
        nodes: dict[Labels, float] = {}
        active: dict[Labels, float] = {}
        for node in snap.nodes:
            nodes[(node.state.value,)] = nodes.get((node.state.value,), 0.0) + 1
            taken = snap.allocated.get(node.id, {}).keys() | fresh.get(node.id, set())
            for gpu in node.allocatable:
                key = (node.site, _model(gpu))
                total[key] = total.get(key, 0.0) + 1
                held[key] = held.get(key, 0.0) + (gpu.id in taken)
        states = {j.id: j.state for j in snap.active}
        states.update((j.id, j.state) for j in applied.started + applied.stopping)
        for state in states.values():
            active[(state.value,)] = active.get((state.value,), 0.0) + 1
        self._held.set(held)
        self._total.set(total)
        self._nodes.set(nodes)
        self._active.set(active)

    def _started(self, snap: Snapshot, applied: Applied) -> None:
        """The waits of the jobs started; a job that started past its SLA and was not yet
        counted (it passed it since the last gauge pass) counts as a breach now."""
        if not applied.started:
            return
        for job in applied.started:  # (a started job's history keeps its last PENDING entry)
            waited = max(0.0, snap.now - queued_at(job))
            self.wait.labels(job.priority).observe(waited)
            seen = (job.id, job.attempt)
            if waited > self.sla.get(job.priority, float("inf")) and seen not in self._breached:
                self.sla_breaches.labels(job.priority).inc()
                self._breached.add(seen)
        self.starts.inc(len(applied.started))

    # -- the leader's loop ------------------------------------------------------------------

    def observe_cycle_failure(self) -> None:
        """A cycle (or its apply, or the reconciler after it) raised: the leader's loop
        caught it and goes on."""
        self.cycle_failures.inc()

    def observe_reconcile(self, result: Mapping[str, int]) -> None:
        """Update from one reconciler pass (broker/control/reconciler.py's counts)."""
        self.requeues.inc(result.get("requeued", 0))

    def observe_leadership(self, leading: bool) -> None:
        """Whether this scheduler leads now. On a change, count it; when it stops leading,
        remove the per-cycle gauges, which are the leader's to report."""
        with self._lock:
            if leading != self._leading:
                self.leadership_changes.inc()
                self._leading = leading
                if not leading:
                    for z in self._per_cycle:
                        z.clear()
                    self.cloud.clear()
                    self.set_aside_now.set(0.0)
                    self._breached = set()
            self.leader.set(1.0 if leading else 0.0)


# -- one registry per process ----------------------------------------------------------------

_scheduler: SchedulerMetrics | None = None
_made = threading.Lock()


def scheduler_metrics(classes: Sequence[PriorityClass] = ()) -> SchedulerMetrics:
    """This process's scheduler metrics, made on the first call (its wait buckets from
    ``classes``: pass the configuration's)."""
    global _scheduler
    with _made:
        if _scheduler is None:
            _scheduler = SchedulerMetrics(classes)
        return _scheduler
