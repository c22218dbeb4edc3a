"""The worker agent: one per GPU host, what it does with its node's jobs (:class:`Agent`).
``spillway worker`` and ``python -m workers`` run it in a process wired by
:mod:`workers.service`, whose docstring lists the process's threads.

The store is the truth. Every start and stop re-reads the job and acts only on its current
attempt; a report refused as stale (:class:`~broker.errors.StaleAttempt`) is logged and dropped.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from redis.exceptions import RedisError

from broker.config.core import Config
from broker.metrics.agent import agent_metrics
from broker.model import Allocation, Job, Node, NodeState
from broker.model.state import ACTIVE, EvictionKind, JobState
from broker.store.base import BaseStore
from broker.store.events import Exited, Started, StartFailed
from broker.store.node_reports import Preempted, Report
from workers.channel import NodeChannel, StoreChannel, View
from workers.detection import detect
from workers.procs import kill_leftovers, of_live_agent
from workers.runner import Key, RunningPart, Supervisor
from workers.users import jobs_dir, resolve

log = logging.getLogger(__name__)

_DONE_MEMORY = 50_000  # ended parts remembered, so a late or repeated start is ignored
_START_REPORT_WAIT_S = 10.0  # an end waits this long at most for its start to be reported


class Agent:
    """Runs the jobs the store assigns to one node (implements workers.tasks.NodeHandler)."""

    def __init__(self, store: BaseStore | NodeChannel, config: Config, node: Node,
                 work_dir: str, trigger: Callable[[], object] = lambda: None,
                 send_stops: Callable[[Job], object] = lambda job: None) -> None:
        # what this agent reads and writes of the store: its node's keys only (a store
        # object: the same rules, applied at once; workers/channel.py)
        self.channel: NodeChannel = store if not isinstance(store, BaseStore) else \
            StoreChannel(store, node.id, lambda jobs: [send_stops(j) for j in jobs])
        self.config, self.node = config, node
        self.node_id = node.id
        self._trigger, self._send_stops = trigger, send_stops
        # where jobs' own directories go: under work_dir, unless jobs (as per-team users)
        # could not pass through to it (workers/users.py)
        isolating = config.job_isolation and os.geteuid() == 0
        self.jobs_dir = jobs_dir(work_dir, node.id) if isolating else work_dir
        self.isolation = detect(node.id, self.jobs_dir, config.job_pids_max,  # warns if none
                                gpus=node.gpus)  # (the device minors its jobs' fences allow)
        # which user each team's jobs run as (ConfigError for a bad setting)
        self.users = resolve(self.jobs_dir, config.job_isolation, config.job_users,
                             config.job_user, config.job_uid_range)
        (log.info if self.users.users is not None else log.warning)(
            "node %s: %s", node.id, self.users.summary)
        if self.users.users is not None and self.users.users.shared_note:
            log.warning("%s", self.users.users.shared_note)
        self.node = replace(node, isolation=self.users.short)
        self.sup = Supervisor(self.channel, work_dir, on_exits=self._on_exits,
                              grace_s=config.grace_s, isolation=self.isolation,
                              users=self.users.users, jobs_dir=self.jobs_dir)
        self.sup.max_time_limit_s = config.max_time_limit_s  # (a longer record: held to it)
        self._lock = threading.RLock()  # one start/stop decision at a time
        self._local: dict[Key, RunningPart] = {}  # spawned and not yet reported ended
        self._stopping: set[Key] = set()
        self._done: collections.OrderedDict[Key, None] = collections.OrderedDict()
        self._unreported: dict[Key, Report] = {}
        self._preempted: set[tuple[str, int]] = set()  # (job, attempt) reported Preempted
        self.draining = False
        self._drain_kind = EvictionKind.PRIORITY  # what a drain's evictions are recorded as
        self._drain_reason = f"Node {node.id} draining"
        self._quit = threading.Event()
        self._taken = threading.Event()  # the scheduler took this incarnation (acked)
        self._next_beat = 0.0  # (until taken, the beat thread polls every 0.1 s)
        self._beat_thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def register(self, give_up: threading.Event | None = None) -> bool:
        """Kill what an earlier incarnation left, register the node (retrying while the store
        is unreachable, until ``give_up`` is set), start heartbeating, and wait until the
        scheduler has taken this incarnation (it requeues what earlier ones held first).
        False if given up."""
        killed = kill_leftovers(self.node_id, exclude=self.sup.pids())
        if killed:
            log.warning("killed %d leftover job process(es) of node %s", len(killed),
                        self.node_id)
        self.isolation.reclaim(spare=of_live_agent)  # and the job cgroups they were in
        delay = 0.5
        while True:
            try:
                self.channel.heartbeat(self.node, self.config.lease_ttl_s, time.time())
                break
            except (RedisError, OSError) as e:
                log.warning("cannot register node %s yet (%s); retrying in %.1fs",
                            self.node_id, e, delay)
                if give_up is not None and give_up.wait(delay):
                    return False
                delay = min(delay * 2, 10.0)
        self._safe(self._trigger)  # (the scheduler applies the registration in a cycle)
        self._beat_thread = threading.Thread(target=self._beat_loop, name="spillway-heartbeat",
                                             daemon=True)
        self._beat_thread.start()
        said = time.monotonic()
        while not self._taken.wait(0.05):
            if give_up is not None and give_up.is_set():
                return False
            if time.monotonic() - said > 10.0:
                log.warning("node %s: no scheduler has taken this agent yet (is `spillway "
                            "scheduler` running?); waiting", self.node_id)
                said = time.monotonic()
        log.info("node %s registered (incarnation %s, %d GPU devices)", self.node_id,
                 self.node.incarnation, len(self.node.gpus))
        return True

    def _taken_yet(self) -> bool:
        if not self._taken.is_set() and self.channel.acked(self.node.incarnation):
            self._taken.set()
        return self._taken.is_set()

    def _beat_loop(self) -> None:
        next_at = time.monotonic()
        while not self._quit.wait(max(0.0, next_at - time.monotonic())):
            taken = self._taken.is_set()
            next_at = time.monotonic() + (self.config.heartbeat_s if taken else 0.1)
            if self.isolation.keeper is not None:
                self.isolation.keeper.ensure()  # a killed keeper is replaced within a beat
            try:
                if taken or time.monotonic() >= self._next_beat:
                    self.heartbeat()
                    self._next_beat = time.monotonic() + self.config.heartbeat_s
                if not taken and self._taken_yet():
                    continue  # (taken now: the next round reconciles)
                if taken:
                    self.reconcile()
            except (RedisError, OSError) as e:
                log.warning("heartbeat failed (%s); retrying in %.1fs", e,
                            self.config.heartbeat_s)
            except Exception:
                log.exception("heartbeat or reconcile failed; retrying in %.1fs",
                              self.config.heartbeat_s)

    def heartbeat(self) -> None:
        self.channel.heartbeat(self.node, self.config.lease_ttl_s, time.time())
        agent_metrics().beat()

    def drain(self, timeout: float | None = None, kind: EvictionKind = EvictionKind.PRIORITY,
              reason: str | None = None) -> bool:
        """Stop taking jobs; preempt the local ones with the grace period and those placed here
        but not started (all are requeued; ``kind``: the eviction recorded, ``spot`` on an
        interruption notice); wait for them to end. True when everything ended and was
        reported."""
        with self._lock:
            self.draining = True
            self._drain_kind, self._drain_reason = kind, reason or self._drain_reason
            self.node = replace(self.node, state=NodeState.DRAINING)
        self._safe(self.heartbeat)
        now, reason = time.time(), self._drain_reason
        with self._lock:
            local = list(self._local.values())
        self._safe(lambda: self._preempt([(p.job_id, p.attempt) for p in local], now, reason,
                                         self._drain_kind))
        for part in local:
            with self._lock:
                self._stopping.add(part.key)
            self.sup.stop(part.job_id, part.attempt, self.config.grace_s)
        self._safe(self.reconcile)  # now preempts what was placed here and never started
        self._safe(self._trigger)
        timeout = self.config.grace_s + 10.0 if timeout is None else timeout
        return self.sup.wait_idle(timeout)

    def close(self) -> None:
        """Stop heartbeating and kill whatever still runs. A drained node beats a last time,
        so the scheduler sees it DRAINING until its lease runs out."""
        self._quit.set()
        if self._beat_thread is not None:
            self._beat_thread.join(10.0)
        if self.draining:
            self._safe(self.heartbeat)
        self.sup.close()

    # -- NodeHandler ---------------------------------------------------------------------------

    def start_jobs(self, items: list[tuple[str, int]]) -> None:
        if not self._taken_yet():
            return  # (the reconcile after the scheduler takes this incarnation starts them)
        view = self.channel.view()  # the seals in the same round trip
        with self._lock:
            wanted = [(view.jobs[j], a) for j, a in items if j in view.jobs]
            self._start(wanted, view.refused)

    def stop_job(self, job_id: str, attempt: int, grace_s: float) -> None:
        with self._lock:
            keys = [k for k in self._local if k[:2] == (job_id, attempt)]
            if keys:
                self._stopping.update(keys)
                self.sup.stop(job_id, attempt, grace_s)
                return
        view = self.channel.view()
        job = view.jobs.get(job_id)
        if job is not None and job.state is JobState.STOPPING:
            with self._lock:
                self._start([(job, attempt)], view.refused)  # reports "Cancelled before start"

    # -- starting ------------------------------------------------------------------------------

    def _start(self, wanted: Iterable[tuple[Job, int]], refused: dict[str, str]) -> None:
        """Spawn every part of these (job, attempt) pairs that should run here and does not;
        ``refused``: the jobs whose specs are not the sealed ones. Called with the lock
        held."""
        spawn: list[tuple[Job, Allocation]] = []
        ends: list[tuple[Key, Report]] = []
        preempt: list[tuple[str, int]] = []
        for job, attempt in wanted:
            for alloc in self._missing_parts(job, attempt):
                key = (job.id, attempt, alloc.rank)
                stopping = job.state is JobState.STOPPING
                if not stopping and self.draining:
                    preempt.append((job.id, attempt))  # its end, after this, requeues it
                    stopping = True
                if stopping:
                    ends.append((key, Report(job.id, attempt, Exited(
                        alloc.rank, 143, "Cancelled before start"), time.time())))
                elif job.id in refused:
                    log.error("job %s refused: %s", job.id, refused[job.id])
                    ends.append((key, Report(job.id, attempt, StartFailed(
                        alloc.rank, refused[job.id]), time.time())))
                else:
                    spawn.append((job, alloc))
        if preempt:
            self._preempt(preempt, time.time(), self._drain_reason, self._drain_kind)
        if ends:
            self._report_exits(ends)
        if not spawn:
            return
        parts = self.sup.spawn_many([(j, a.rank, a.gpu_ids) for j, a in spawn], self.node_id)
        started = []
        for part in parts:
            if part.start_error is None:
                self._local[part.key] = part
                started.append(part)
            else:  # (the runner reported its StartFailed)
                self._remember_done(part.key)
        agent_metrics().started(len(started))
        self._report_started(started)

    def _report_started(self, parts: list[RunningPart]) -> None:
        """Report these parts Started, in one round trip. Their ends are reported only after
        this (:meth:`_on_exits` waits), except for a part that has ended without a line of
        output: its cgroup and scratch are released here (:meth:`RunningPart.settle`; once,
        whichever thread comes first) and its end goes in the same round trip, right after
        its start (a short job costs one write, not two), and :meth:`_on_exits` leaves it
        out. Reports that cannot be sent now are sent again at the next heartbeat."""
        if not parts:
            return
        try:
            now = time.time()
            reports: list[Report] = []
            ended: list[RunningPart] = []
            for p in parts:
                reports.append(Report(p.job_id, p.attempt, Started(p.rank, p.pid, p.note), now))
                if p.settle() and p.exit_code is not None:  # ended quietly, released now
                    ended.append(p)
                    reports.append(Report(p.job_id, p.attempt,
                                          Exited(p.rank, p.exit_code, p.reason), time.time()))
            try:
                self.channel.report_many(reports)
            except Exception as e:  # the store is unreachable: reconcile reports them again
                log.warning("starts of %s not reported yet (%s)",
                            ", ".join(p.owner for p in parts), e)
                for p in ended:  # (its end: at the next heartbeat, after its start)
                    p.end_reported = True
                    self._unreported[p.key] = Report(p.job_id, p.attempt, Exited(
                        p.rank, p.exit_code or 0, p.reason), time.time())
                return
            for p in ended:
                p.end_reported = True
            self._safe(self._trigger)
        finally:
            for part in parts:
                part.start_reported.set()

    def _missing_parts(self, job: Job, attempt: int) -> list[Allocation]:
        """This node's parts of ``job``'s ``attempt`` that are not running here and never ran."""
        if job.attempt != attempt or job.state not in ACTIVE:
            return []
        exited = {r for r, _ in job.parts_exited}
        return [a for a in job.allocations
                if a.node_id == self.node_id and a.rank not in exited
                and (job.id, attempt, a.rank) not in self._local
                and (job.id, attempt, a.rank) not in self._done]

    def _preempt(self, owners: Iterable[tuple[str, int]], now: float, reason: str,
                 kind: EvictionKind = EvictionKind.PRIORITY) -> None:
        """Ask that these jobs be stopped and requeued (the scheduler tells their parts on
        other nodes to stop); each once."""
        todo = [o for o in dict.fromkeys(owners) if o not in self._preempted]
        if not todo:
            return
        self.channel.report_many([Report(j, a, Preempted(kind.value, reason), now)
                                  for j, a in todo])
        if len(self._preempted) > _DONE_MEMORY:  # (a drain's: forgotten once long past)
            self._preempted.clear()
        self._preempted.update(todo)

    # -- ending --------------------------------------------------------------------------------

    def _on_exits(self, parts: list[RunningPart]) -> None:
        """Runs on the runner's reporter thread after the parts' last log lines are stored.
        A part's end is reported after its start (so its history has both, in order)."""
        for part in parts:
            part.start_reported.wait(_START_REPORT_WAIT_S)
        with self._lock:
            for part in parts:
                self._local.pop(part.key, None)
                self._stopping.discard(part.key)
                self._remember_done(part.key)
        for part in parts:
            agent_metrics().ended(part.exit_code)
            log.info("job %s attempt %d rank %d ended: exit %s (%s)", part.job_id,
                     part.attempt, part.rank, part.exit_code, part.reason)
        todo = [p for p in parts if not p.end_reported]  # (others: reported with the start)
        if todo:
            self._report_exits([(p.key, Report(p.job_id, p.attempt, Exited(
                p.rank, p.exit_code or 0, p.reason), time.time())) for p in todo])

    def _remember_done(self, key: Key) -> None:
        with self._lock:
            self._done[key] = None
            while len(self._done) > _DONE_MEMORY:
                self._done.popitem(last=False)

    def _report_exits(self, items: list[tuple[Key, Report]]) -> None:
        """Report these ends in one round trip, then ask for one scheduling cycle; what
        cannot be sent now is sent again at the next heartbeat."""
        for key, _ in items:
            self._remember_done(key)
        try:
            self.channel.report_many([r for _, r in items])
        except Exception as e:
            log.warning("%d exit report(s) not sent yet (%s); retrying at the next heartbeat",
                        len(items), e)
            self._unreported.update(items)
            return
        for key, _ in items:
            self._unreported.pop(key, None)
        self._safe(self._trigger)

    # -- reconcile (heartbeat thread) ----------------------------------------------------------

    def reconcile(self) -> None:
        """Make what runs here match the store: kill parts whose attempt is over, stop parts
        whose job is STOPPING, start parts whose start message was lost."""
        with self._lock:
            local = dict(self._local)  # read before the store: a later spawn is not judged
        view = self.channel.view()
        with self._lock:
            self._judge(local, view)
            wanted = [(j, j.attempt) for j in view.jobs.values()]
            self._start(wanted, view.refused)
        if self._unreported:
            self._report_exits(list(self._unreported.items()))

    def _judge(self, local: dict[Key, RunningPart], view: View) -> None:
        for key, part in local.items():
            job = view.jobs.get(part.job_id)
            if (job is None or job.attempt != part.attempt or job.state not in ACTIVE
                    or self.node_id not in job.node_ids
                    or (part.gpu_ids and part.owner not in view.owners)):
                log.warning("job %s attempt %d no longer runs here (%s); killing it",
                            part.job_id, part.attempt,
                            "gone" if job is None else f"{job.state.value} attempt {job.attempt}")
                self.sup.kill(part.job_id, part.attempt, "NotAllocated")
            elif job.state is JobState.STOPPING and key not in self._stopping:
                self._stopping.add(key)
                self.sup.stop(part.job_id, part.attempt, self.config.grace_s)
            elif job.state is JobState.STARTING and part.start_reported.is_set():
                self._report_started([part])  # its first report was lost (or not applied yet)

    @staticmethod
    def _safe(fn: Callable[[], Any]) -> None:
        try:
            fn()
        except RedisError as e:  # an outage: one line, no traceback
            log.warning("agent step failed, the store is unreachable (%s); continuing", e)
        except Exception:
            log.exception("agent step failed (continuing)")
