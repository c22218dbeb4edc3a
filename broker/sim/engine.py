"""The simulator: a virtual clock, simulated nodes and the production cycle.

Events (arrivals, job ends, evicted jobs stopping) are kept in a heap. At each instant the
simulator applies the events to a :class:`MemoryStore`, exactly as the agents' reports would,
then runs one scheduling cycle (``store.snapshot`` -> ``run_cycle`` -> ``store.apply``) with
the chosen policy, and tells the store that the started jobs are running. Nothing about
scheduling is simulated: it is the same code that runs in production.

Simulated jobs checkpoint when asked to stop (they are given a ``checkpoint_dir``), so a
preempted job resumes where it was; the GPU time between SIGTERM and exit counts as lost. A
job's runtime in the trace holds on the GPU model given by its ``gpu_type`` and is converted
to the model it gets with the speed table (``broker/model/speed.py``); a job without one runs as
long on any model. A job that would outrun its time limit is stopped at the limit (FAILED).

An invariant checker runs after every cycle (see :mod:`broker.sim.invariants`).
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import replace
from typing import Any

from broker.cloud.spot_signals import SpotSignals
from broker.config.core import CLUSTER_CONFIG_KEYS, Config
from broker.cycle.plan import Plan, Snapshot
from broker.cycle.scheduler import run_cycle
from broker.cycle.snapshots import SnapshotBuilder
from broker.errors import ConfigError
from broker.model import Job, JobSpec
from broker.model.fit import could_hold
from broker.model.speed import convert_runtime
from broker.model.state import EvictionKind, JobState
from broker.sim.carbon_metrics import (
    carbon_by_class,
    deadline_metrics,
    sim_deadline,
    sim_signals,
)
from broker.sim.cloudrun import CloudRun
from broker.sim.cluster import Cluster
from broker.sim.energy import RunPiece, SimEnergy
from broker.sim.invariants import InvariantChecker
from broker.sim.ledger import SimBudgets
from broker.sim.runs import ARRIVE, END, STOP, WAKE, SimRun, TrueRuntimes
from broker.sim.types import JobRecord, Progress, ProgressFn, Sample, SimResult, Trace, TraceJob
from broker.store.events import STOPPED, Exited, Started
from broker.store.memory import MemoryStore
from policies.registry import PolicySet, settings_of

_LEASE = 1e15
PROGRESS_EVERY_S = 0.25  # at most this often, a progress callback is told how far the run is
_CHECK_EVERY = 64  # instants between two looks at the wall clock


class Simulation:
    def __init__(self, cluster: Cluster, trace: Trace, policy: str | PolicySet = "spillway",
                 *, config: Config | None = None, stop_delay_s: float = 30.0,
                 check_invariants: bool = True, progress: ProgressFn | None = None,
                 progress_every_s: float = PROGRESS_EVERY_S, seed: int = 0,
                 energy: SimEnergy | None = None, oracle_runtimes: bool = False) -> None:
        self.cluster, self.trace = cluster, trace
        self.energy = energy  # carbon_kg and cost_per_gpu_hour (None: not computed)
        self.pieces: list[RunPiece] = []  # every run that ended, for the accounting
        self.piece_classes: list[str] = []  # the class of each piece's job (same order)
        self.progress, self.progress_every_s = progress, progress_every_s
        self.arrived = 0
        self.policy = policy if isinstance(policy, PolicySet) else PolicySet.named(policy)
        base = config or Config()
        own: dict[str, Any] = {k: float(v) for k, v in cluster.settings.items()
                               if k in CLUSTER_CONFIG_KEYS}
        # (max_time_limit_s: a trace replays its users' limits as they were; Philly's reach
        # 161 days, past the 30 a real cluster takes by default)
        self.config = replace(base, classes=cluster.classes, teams=cluster.teams, **own,
                              max_time_limit_s=math.inf,
                              policy_settings={**base.policy_settings, **{
                                  k: v for k, v in cluster.settings.items() if k not in own}})
        self.store = MemoryStore(self.config)
        # predictor, caches, and the carbon signals of the run's series
        # (broker/energy/carbon_signals.py)
        self.snapshots = SnapshotBuilder(self.store, self.config, sim_signals(energy, cluster))
        self.node_by_id = {n.id: n for n in cluster.nodes}
        self.stop_delay_s = min(stop_delay_s, self.config.grace_s)
        self.checker = InvariantChecker(self.store) if check_invariants else None
        self.sla = {c.name: c.sla_s for c in cluster.classes}
        self.classes = {c.name: c for c in cluster.classes}
        self.records: dict[str, JobRecord] = {}
        self.samples: list[Sample] = []
        self.runs: dict[str, SimRun] = {}
        self.work_left: dict[str, float] = {}  # trace seconds still to run
        self.trace_jobs: dict[str, TraceJob] = {}
        if oracle_runtimes:
            self.snapshots.predictor = TrueRuntimes(self.runs, self.work_left)
        self._events: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self.busy = 0
        self.devices = sum(len(n.allocatable) for n in cluster.nodes)  # on nodes taking jobs
        self.onprem_devices = self.devices
        self.busy_off = 0  # of ``busy``, GPUs on cloud nodes that take no new job (draining)
        may = {c.name for c in cluster.classes if c.may_preempt}
        quota = {t.name for t in cluster.teams if t.quota_gpus}
        evictors = self.policy.resolve("evict")
        self._can_preempt = (lambda tj: tj.priority in may or tj.team in quota) \
            if evictors else (lambda tj: False)
        self.preemptors = 0  # pending jobs that may preempt
        # an evictor that may act at an arrival on a full cluster (relief: see _cycle)
        self.relief = any(e.acts_on_arrival for e in evictors)
        self._wake = math.inf  # the earliest wake-up event queued (Plan.wake_at)
        self._holder = False  # the last cycle left a reservation (its holder stays first)
        self._stuck = False  # the last plan said only a job leaving can change it
        self.skip_until_event = True  # honour Plan.until_event (tests turn it off)
        self.queued_jobs = 0
        self.queued_gpus = 0
        self.cycles = 0
        self.cloud_busy = 0  # GPUs busy on cloud nodes (not in the on-prem samples)
        self.cloud: CloudRun | None = CloudRun(self, cluster.cloud, seed) \
            if cluster.cloud is not None else None
        # what the scheduler sees of the spot zones, read from their replayed traces
        self.spot = SpotSignals(feeds=self.cloud.clouds.feed) if self.cloud else None
        # the teams' caps (a cluster file's budgets), kept as production does
        self.budgets = SimBudgets(self, cluster.budgets) if self.cloud is not None else None
        # jobs on rented machines come home when on-prem GPUs stand idle (policies/burst/home.py):
        # then a cycle can change something while nothing waits
        self.home = self.cloud is not None and self.policy.burst == "sla" and bool(float(
            settings_of(self.config.policy_settings, "sla").get("home_move", 0.0)))

    # -- set-up --------------------------------------------------------------------------

    def _push(self, t: float, kind: int, job_id: str, attempt: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, job_id, attempt))

    def _spec(self, tj: TraceJob) -> JobSpec:
        spec = JobSpec(command=["sim", tj.id], name=tj.name, gpus=tj.gpus, nodes=tj.nodes,
                       gpu_types=(tj.gpu_type,) if tj.gpu_type else (), cpus=0.0,
                       priority=tj.priority, team=tj.team, time_limit=tj.time_limit_s,
                       checkpoint_dir="/checkpoints",
                       sites=self.cloud.sites_of(tj.priority) if self.cloud else ("onprem",))
        due = sim_deadline(self.cluster.settings, self.classes.get(tj.priority), tj.submit_s,
                           tj.time_limit_s)  # (a cluster file's sim_deadlines; none by default)
        return spec if due is None else spec.model_copy(update={"deadline": due})

    def _load(self) -> None:
        for node in self.cluster.nodes:
            self.store.heartbeat(node, _LEASE, 0.0)
        for tj in self.trace.jobs:
            spec = self._spec(tj)
            rec = JobRecord(tj.id, tj.team, tj.priority, tj.total_gpus, tj.submit_s,
                            tj.duration_s, self.sla.get(tj.priority, math.inf))
            self.records[tj.id] = rec
            if not could_hold(self.cluster.nodes, spec.resources):
                rec.infeasible = True  # never submitted: it could not run on this cluster
                continue
            self.trace_jobs[tj.id] = tj
            self.work_left[tj.id] = tj.duration_s
            self._push(tj.submit_s, ARRIVE, tj.id)

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> SimResult:
        t0 = time.perf_counter()
        self._load()
        events = self._events
        tell = self.progress
        total = len(self.trace_jobs)
        span = self.trace.jobs[-1].submit_s if self.trace.jobs else 0.0
        told, ticks = t0, 0
        while events:
            now = events[0][0]
            if tell is not None:
                ticks += 1
                if ticks >= _CHECK_EVERY:
                    ticks = 0
                    wall_now = time.perf_counter()
                    if wall_now - told >= self.progress_every_s:
                        told = wall_now
                        tell(Progress(self.policy.name, self.arrived, total, now, span,
                                      wall_now - t0, self.trace.origin))
            arrivals: list[str] = []
            woken = False
            while events and events[0][0] == now:
                _, kind, _, job_id, attempt = heapq.heappop(events)
                if kind == ARRIVE:
                    arrivals.append(job_id)
                elif kind == END:
                    self._end(job_id, attempt, now)
                    self._stuck = False
                elif kind == STOP:
                    self._stopped(job_id, attempt, now)
                    self._stuck = False
                elif kind == WAKE:
                    woken = True
                elif self.cloud is not None:
                    woken = self.cloud.event(kind, job_id, now) or woken
            if arrivals:
                self._arrive(arrivals, now)
            if woken and self._wake <= now:
                self._wake = math.inf
            # relief acts for the reservation holder, which an arrival outranks only when
            # there is none (spillway's order keeps the holder first; urgent arrivals may
            # preempt, and run a cycle anyway)
            self._cycle(now, woken or (self.relief and bool(arrivals) and not self._holder)
                        or (self.cloud is not None and bool(arrivals)))
        wall = time.perf_counter() - t0
        if tell is not None:
            last = self.samples[-1].t if self.samples else 0.0
            tell(Progress(self.policy.name, self.arrived, total, last, span, wall,
                          self.trace.origin, done=True))
        from broker.sim.metrics import compute_metrics

        extra = self.cloud.metrics(self.samples[-1].t if self.samples else 0.0) \
            if self.cloud is not None else {}
        if self.budgets is not None:
            extra = {**extra, **self.budgets.metrics(self.samples[-1].t if self.samples
                                                     else 0.0)}
        if self.energy is not None:
            extra = {**extra, **self.energy.metrics(self.pieces,
                                                    extra.get("cloud_cost_usd") or 0.0)}
            extra["carbon"]["by_class_kg"] = carbon_by_class(self.energy, self.pieces,
                                                             self.piece_classes)
        extra = {**extra, **deadline_metrics(
            self.records, lambda i: self._spec(self.trace_jobs[i]).deadline
            if i in self.trace_jobs else None)}
        result = SimResult(self.policy.name, self.cluster.capacity_gpus,
                           list(self.records.values()), self.samples,
                           meta={"trace": self.trace.name, "cluster": self.cluster.name,
                                 "jobs_in_trace": len(self.trace.jobs),
                                 "notes": list(self.trace.notes), "cycles": self.cycles})
        violations = self.checker.violations if self.checker else []
        result.metrics = compute_metrics(result, wall, len(violations), extra={
            **extra, "invariant_examples": violations[:10]})
        return result

    def _arrive(self, job_ids: list[str], now: float) -> None:
        specs = [self._spec(self.trace_jobs[i]) for i in job_ids]
        self.store.submit_many(specs, now, job_ids)
        self.arrived += len(job_ids)
        self.queued_jobs += len(job_ids)
        self.queued_gpus += sum(s.gpus * s.nodes for s in specs)
        self.preemptors += sum(1 for i in job_ids if self._can_preempt(self.trace_jobs[i]))

    def _dressed(self, snap: Snapshot, now: float) -> Snapshot:
        """The cycle's snapshot with the run's offers, machines and spot signals."""
        if self.cloud is not None and self.spot is not None:
            snap = self.spot.dress(self.cloud.dress(snap, now))
        return snap

    def _cycle(self, now: float, force: bool = False) -> None:
        """Run a cycle unless it could not change anything: nothing waits, or every device is
        busy and no waiting job may preempt (production would plan the same: no start).
        ``force``: it could, even so: with relief, a job arrived and nobody holds the
        reservation (it may become the holder and evict jobs of its own class), or an earlier
        cycle asked to be woken now (``Plan.wake_at``). A cycle after one whose plan said only
        a job leaving can change it (``Plan.until_event``: strict FIFO, nothing evicts) is
        skipped too until a job ends or is evicted."""
        if self.home and self.queued_jobs == 0 and self.cloud_busy \
                and self.busy - self.cloud_busy < self.onprem_devices:
            force = True  # a job may come home
        if not force and (self.queued_jobs == 0 or self._stuck
                          or (self.busy - self.busy_off >= self.devices
                              and not self.preemptors)):
            self._sample(now)
            return
        if self.budgets is not None:
            self.budgets.settle(now)  # machines that ended: charged, reservations settled
        snap = self._dressed(self.snapshots.build(now), now)
        plan: Plan = run_cycle(snap, self.policy, now, self.snapshots.memory)
        if self.budgets is not None:
            plan = self.budgets.apply(plan, now)  # each launch's cost reserved, or refused
        if (plan.launches or plan.terminations) and self.cloud is None:  # refused, not dropped
            raise ConfigError(
                f"policy {self.policy.name!r} planned {len(plan.launches)} launch(es) and "
                f"{len(plan.terminations)} termination(s), but this simulation has no cloud "
                "provisioner: give the cluster cloud sites, or choose a burst policy of none")
        self.cycles += 1
        applied = self.store.apply(plan, now)
        if self.cloud is not None:
            self.cloud.carry_out(plan, now)
        for job in applied.started:
            self._started(job, now)
        for job in applied.stopping:
            run = self.runs.get(job.id)
            if run is not None and run.attempt == job.attempt:
                self._push(now + self.stop_delay_s, STOP, job.id, job.attempt)
        if self.checker is not None:
            self.checker.after_cycle(now, plan, applied)
        self._holder = plan.reservation is not None
        self._stuck = plan.until_event and self.skip_until_event
        if plan.wake_at is not None and now < plan.wake_at < self._wake:
            self._wake = plan.wake_at
            self._push(plan.wake_at, WAKE, "")
        self._sample(now)

    def _started(self, job: Job, now: float) -> None:
        self.store.report(job.id, job.attempt, Started(0), now)
        tj = self.trace_jobs[job.id]
        model = self._model_of(job)
        on_model = convert_runtime(tj.duration_s, tj.gpu_type, model)
        rate = tj.duration_s / on_model if on_model > 0 else 1.0
        need = self.work_left[job.id] / rate
        limit = tj.time_limit_s
        killed = need > limit
        end = now + (limit if killed else need)
        self.runs[job.id] = SimRun(job.attempt, now, end, rate, killed, job.res.total_gpus,
                                 job.node_ids, model,
                                 self.node_by_id[job.allocations[0].node_id].site)
        if self.cloud is not None:
            self.cloud.moved(self.runs[job.id], +1, now)
        self._push(end, END, job.id, job.attempt)
        rec = self.records[job.id]
        if rec.first_start_s is None:
            rec.first_start_s = now
        self.busy += job.res.total_gpus
        self.queued_jobs -= 1
        self.queued_gpus -= job.res.total_gpus
        self.preemptors -= self._can_preempt(tj)

    def _model_of(self, job: Job) -> str:
        node = self.node_by_id[job.allocations[0].node_id]
        gid = job.allocations[0].gpu_ids[0] if job.allocations[0].gpu_ids else None
        return next((g.model for g in node.gpus if g.id == gid), node.gpus[0].model)

    def _end(self, job_id: str, attempt: int, now: float) -> None:
        run = self.runs.get(job_id)
        if run is None or run.attempt != attempt or run.end_at != now:
            return  # this attempt was preempted and has already gone
        del self.runs[job_id]
        self.pieces.append(RunPiece(run.started, now, run.gpus, run.model, run.site))
        self.piece_classes.append(self.trace_jobs[job_id].priority)
        code, why = (1, "TimeLimit") if run.killed else (0, "Exited")
        job = self.store.get(job_id)
        for a in job.allocations:
            job = self.store.report(job_id, attempt, Exited(a.rank, code, why), now)
        if self.checker is not None:
            self.checker.check_finished(now, job)
        self.busy -= run.gpus
        if self.cloud is not None:
            self.cloud.moved(run, -1, now)
        rec = self.records[job_id]
        rec.end_s = now
        self.work_left[job_id] = 0.0

    def _stopped(self, job_id: str, attempt: int, now: float) -> None:
        """An evicted job has checkpointed and exits; the store requeues it."""
        run = self.runs.pop(job_id, None)
        if run is None or run.attempt != attempt:
            return
        self.pieces.append(RunPiece(run.started, now, run.gpus, run.model, run.site))
        self.piece_classes.append(self.trace_jobs[job_id].priority)
        job = self.store.get(job_id)
        stop = next((h for h in reversed(job.history) if h.state is JobState.STOPPING), None)
        sigterm = stop.time if stop is not None else now
        done = (sigterm - run.started) * run.rate
        self.work_left[job_id] = max(0.0, self.work_left[job_id] - done)
        after = job
        for a in job.allocations:
            after = self.store.report(job_id, attempt, Exited(a.rank, 0, STOPPED), now)
        self.busy -= run.gpus
        if self.cloud is not None:
            self.cloud.moved(run, -1, now)
        rec = self.records[job_id]
        rec.failed = after.state is JobState.FAILED  # gave up: it waits for nothing any more
        rec.preemptions += 1
        kind = stop.kind if stop is not None else None
        rec.moves += kind is EvictionKind.MOVE
        rec.yields += kind is EvictionKind.RELIEF
        rec.lost_gpu_s += run.gpus * (now - sigterm)
        if rec.failed:
            return
        self.queued_jobs += 1
        self.queued_gpus += run.gpus
        self.preemptors += self._can_preempt(self.trace_jobs[job_id])

    def _sample(self, now: float) -> None:
        s = Sample(now, self.busy - self.cloud_busy, self.queued_jobs, self.queued_gpus)
        if self.samples and self.samples[-1].t == now:
            self.samples[-1] = s
        elif not self.samples or (self.samples[-1].busy_gpus, self.samples[-1].queued_jobs,
                                  self.samples[-1].queued_gpus) != (s.busy_gpus, s.queued_jobs,
                                                                    s.queued_gpus):
            self.samples.append(s)


def simulate(cluster: Cluster, trace: Trace, policy: str, **kw: Any) -> SimResult:
    return Simulation(cluster, trace, policy, **kw).run()
