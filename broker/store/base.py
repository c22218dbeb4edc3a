"""The Store: the only source of truth. One interface, two backends (Redis and memory).

:class:`BaseStore` holds every rule (transitions, fencing, requeue on node death) once; a
backend supplies a handful of persistence primitives with compare-and-set semantics
(:mod:`broker.store.backend` lists them). This module holds the jobs and the scheduling
cycle's reads and writes; the job write and its accounting are in :mod:`broker.store.core`,
nodes and cloud instances in :mod:`broker.store.machines`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from broker.config.core import Config
from broker.errors import Conflict, Fenced, JobNotFound, StaleAttempt
from broker.model import HistoryEntry, Instance, Job, JobSpec, Node, NodeState, Reason, Site
from broker.model.state import ACTIVE, TERMINAL, EvictionKind, JobState
from broker.store.backend import QueueOrder
from broker.store.machines import Machines
from broker.store.status import CHANGED, FENCED, OK

if TYPE_CHECKING:
    # (the write side's modules and the plan's types are imported where a method uses them:
    # a command that reads jobs loads none of them; tests/unit/test_cli_imports.py)
    from broker.cycle.plan import Applied, Plan, Reservation, Snapshot
    from broker.store.events import JobEvent

FAILURES_KEPT = 1000  # failed cycles recorded (about 16 minutes of one a second)


def new_job_id() -> str:
    return "j-" + uuid.uuid4().hex[:12]


class BaseStore(Machines):
    """The rules; subclasses provide persistence."""

    def __init__(self, config: Config | None = None) -> None:
        super().__init__(config)
        self._last_reasons: dict[str, Reason] = {}
        self._last_reservation: str | None = ""

    # -- jobs ----------------------------------------------------------------------------------

    def submit(self, spec: JobSpec, now: float, job_id: str | None = None,
               reason: str = "Submitted") -> Job:
        return self.submit_many([spec], now, [job_id] if job_id else None, reason)[0]

    def submit_many(self, specs: Sequence[JobSpec], now: float,
                    job_ids: Sequence[str] | None = None,
                    reason: str = "Submitted") -> list[Job]:
        """Store validated specs as PENDING jobs, all or none of them (``reason``: the first
        history entry's, e.g. who submitted them)."""
        from broker.store import transitions as T

        checked = [s.checked(self.config) for s in specs]  # raises before anything is written
        ids = list(job_ids) if job_ids else [new_job_id() for _ in checked]
        taken = [i for i, j in zip(ids, self._load(ids)) if j is not None]
        if taken or len(set(ids)) != len(ids):
            raise Conflict(f"job ids already exist or repeat: {taken or ids}; nothing stored")
        # a microsecond apart, so jobs of one batch keep their list order in the queue
        jobs = [
            Job(id=i, spec=s, state=JobState.PENDING, submitted_at=now + n * 1e-6, version=1,
                history=(HistoryEntry(JobState.PENDING, now + n * 1e-6, reason, 1),))
            for n, (i, s) in enumerate(zip(ids, checked))
        ]
        statuses = self._commit([T.Change(j, 0) for j in jobs])
        if any(st != OK for st in statuses):  # only a concurrent writer of the same ids
            raise Conflict("job ids taken concurrently: "
                           f"{[j.id for j, st in zip(jobs, statuses) if st != OK]}")
        return jobs

    def get(self, job_id: str) -> Job:
        job = self._load([job_id])[0]
        if job is None:
            job = self._load_archived(job_id)  # a finished job past retain_finished_s
        if job is None:
            raise JobNotFound(job_id)
        return self._with_reasons([job])[0]

    # -- retention -----------------------------------------------------------------------------

    def archive_finished(self, now: float, scan: int = 5000) -> int:
        """Move jobs that finished more than ``retain_finished_s`` ago out of the hot keys
        (the queue, ``queue --all``, the snapshot's indexes) into a compressed archive that
        ``get`` (``spillway show``) still reads. Scans the ``scan`` oldest jobs a call (the
        leader calls it now and then). Returns how many moved; 0 with retention off."""
        keep = self.config.retain_finished_s
        if keep <= 0:
            return 0
        before = now - keep
        old = [j for j in self._load(self._index("all")[:scan]) if j is not None
               and j.state in TERMINAL and j.finished_at is not None and j.finished_at < before]
        if old:
            self._archive(old)
        return len(old)

    def list_ids(self, which: str) -> list[str]:
        """Ids in the ``pending``, ``active`` or ``all`` index, oldest first (no documents)."""
        return self._index(which)

    def count_ids(self, which: str) -> int:
        """How many ids the ``pending``, ``active`` or ``all`` index holds."""
        return len(self._index(which))

    def get_many(self, job_ids: Sequence[str]) -> list[Job | None]:
        return self._load(job_ids)

    def list_jobs(self, states: Iterable[JobState] | None = None, team: str | None = None,
                  priority: str | None = None, limit: int | None = None,
                  skip: int = 0) -> list[Job]:
        """Jobs oldest first; ``limit``: only the newest that many, after skipping the newest
        ``skip`` (pages back through a long history)."""
        wanted = set(states) if states else None
        if wanted and wanted <= {JobState.PENDING}:
            ids = self._index("pending")
        elif wanted and wanted <= ACTIVE:
            ids = self._index("active")
        elif wanted and wanted <= ACTIVE | {JobState.PENDING}:
            ids = self._index("pending") + self._index("active")
        else:
            ids = self._index("all")
            if limit is not None and wanted is None and team is None and priority is None:
                ids = ids[max(0, len(ids) - skip - limit):len(ids) - skip]  # (reads one page)
                skip = 0
        out = [
            j for j in self._load(ids)
            if j is not None
            and (wanted is None or j.state in wanted)
            and (team is None or j.team == team)
            and (priority is None or j.priority == priority)
        ]
        out.sort(key=lambda j: (j.submitted_at, j.id))
        if skip:
            out = out[:max(0, len(out) - skip)]
        if limit is not None:
            out = out[-limit:]
        return self._with_reasons(out)

    def _with_reasons(self, jobs: list[Job]) -> list[Job]:
        pend = [j for j in jobs if j.state is JobState.PENDING]
        if not pend:
            return jobs
        reasons = dict(zip([j.id for j in pend], self._read_reasons([j.id for j in pend])))
        return [replace(j, pending_reason=reasons.get(j.id)) if j.id in reasons else j
                for j in jobs]


    def _read_meta(self, cursor: str | None) -> tuple[dict[str, tuple[float, float]],
                                                      list[tuple[str, str, int, float, float]],
                                                      str | None, str | None]:
        """Usage, runtime samples after ``cursor`` (and the new cursor; None: none read), the
        reservation: what a snapshot needs besides the jobs. Backends may read them in one
        round trip."""
        samples: list[tuple[str, str, int, float, float]] = []
        if cursor is not None:
            samples, cursor = self._read_runtimes(cursor)
        return self._read_usage(), samples, cursor, self._get_reservation()

    def report(self, job_id: str, attempt: int, event: JobEvent, now: float) -> Job:
        """An agent's report on its part of an attempt; StaleAttempt if that attempt is over."""
        from broker.store import transitions as T

        return self._update(job_id, T.report, attempt, event, now,
                            self.config.max_preemptions)

    def report_many(self, reports: Sequence[tuple[str, int, JobEvent, float]]
                    ) -> list[Job | Exception]:
        """Several reports (job id, attempt, event, time) with the outcome of :meth:`report`
        for each in turn, in a few round trips (broker/store/reports.py)."""
        from broker.store import reports as _reports

        return _reports.report_many(self, reports)

    def spec_problems(self, jobs: Sequence[Job]) -> dict[str, str]:
        """Job id -> why it must not run, for jobs whose spec is not the one submitted
        (broker/security/seal.py; a backend without agents of its own seals nothing)."""
        return {}

    def seal_existing(self, now: float) -> int:
        """Seal, once per store, the live jobs queued before specs were sealed (an upgrade);
        returns how many (broker/security/seal.py)."""
        del now
        return 0

    def cancel(self, job_id: str, now: float, reason: str = "Cancelled by user") -> Job:
        from broker.store import transitions as T

        return self._update(job_id, T.cancel, now, reason)

    def preempt(self, job_id: str, attempt: int, now: float, reason: str,
                kind: EvictionKind = EvictionKind.PRIORITY) -> Job:
        from broker.store import transitions as T

        return self._update(job_id, T.preempt, attempt, now, reason, kind)

    def check_attempt(self, job_id: str, attempt: int) -> Job:
        """Return the job if ``attempt`` is its current, active attempt; else StaleAttempt."""
        from broker.store import transitions as T

        job = self._load([job_id])[0]
        if job is None:
            raise StaleAttempt(job_id, attempt, 0, "MISSING")
        T.check_attempt(job, attempt)
        return job

    # -- the scheduling cycle ------------------------------------------------------------------

    def _load_index(self, which: str) -> list[Job]:
        """The jobs of an index, oldest first. Backends may override with a cheaper read."""
        return [j for j in self._load(self._index(which)) if j is not None]

    def snapshot(self, now: float) -> Snapshot:
        """Jobs, nodes, usage and the reservation at ``now`` (no runtime predictor: a
        scheduler's :class:`broker.cycle.snapshots.SnapshotBuilder` keeps and adds it)."""
        return self.read_snapshot(now, None)[0]

    def read_snapshot(self, now: float, runtimes_after: str | None
                      ) -> tuple[Snapshot, list[tuple[str, str, int, float, float]], str | None]:
        """:meth:`snapshot`, and in the same round trip the runtime samples after the cursor
        ``runtimes_after`` (None: none) with the new cursor."""
        from broker.cycle.plan import Reservation, Snapshot
        from broker.store.budgets import budget_book, with_budgets

        pend, act, all_nodes, allocated, meta = self._read_state(runtimes_after)
        pending = tuple([j for j in pend if j.state is JobState.PENDING])
        active = tuple([j for j in act if j.state in ACTIVE])
        nodes = tuple(sorted((n for n in all_nodes
                              if n.state is not NodeState.DOWN and n.lease_expires > now),
                             key=lambda n: n.id))
        live = {n.id for n in nodes}
        allocated = {k: v for k, v in allocated.items() if k in live}
        cfg = self.config
        usage, samples, cursor, raw = meta
        reservation = Reservation.from_dict(json.loads(raw)) if raw else None
        instances = tuple(self._snapshot_instances())
        offers = self.offers(now) if cfg.providers else []
        sites = tuple(dict.fromkeys([Site(), *(o.site for o in offers)])) if offers else ()
        snap = Snapshot(now, pending, active, nodes, allocated, cfg.classes, teams=cfg.teams,
                        usage=self.usage(now, usage), reservation=reservation,
                        instances=instances, offers=tuple(offers), sites=sites,
                        settings=cfg.policy_settings, half_life_s=cfg.fairshare_half_life_s,
                        min_runtime_s=cfg.min_runtime_s, grace_s=cfg.grace_s)
        # the teams' caps and what they have committed (broker/store/budgets.py)
        return with_budgets(snap, budget_book(self), self._snapshot_budget_read()), samples, \
            cursor

    def _snapshot_budget_read(self) -> tuple[Any, Any] | None:
        """The budget book's first read, if :meth:`_read_state` made it (else the book
        reads)."""
        return None

    def _snapshot_instances(self) -> list[Instance]:
        """The live cloud instances, for the snapshot :meth:`_read_state` just read (a
        backend may have read them with it)."""
        return [i for i, _ in self._load_instances(None, live_only=True)]

    def _read_state(self, cursor: str | None) -> tuple[
            list[Job], list[Job], list[Node], dict[str, dict[str, str]],
            tuple[dict[str, tuple[float, float]], list[tuple[str, str, int, float, float]],
                  str | None, str | None]]:
        """What a snapshot reads: the pending and the active index's jobs (oldest first),
        every node, the allocations of every node, and :meth:`_read_meta`. Backends may read
        it in fewer round trips."""
        pending = self._load_index("pending")
        active = self._load_index("active")
        nodes = self._load_nodes()
        return pending, active, nodes, self.allocations([n.id for n in nodes]), \
            self._read_meta(cursor)

    def apply(self, plan: Plan, now: float) -> Applied:
        """Apply a Plan compare-and-set: a start whose job moved on since the snapshot, or whose
        GPUs were taken, is skipped, never half-done. Safe to run twice on the same Plan."""
        from broker.cycle.plan import Applied
        from broker.store import transitions as T

        started, stopping, skipped = [], [], []
        if plan.starts:
            changes = []
            for st, (job, proof) in zip(plan.starts,
                                        self._start_copies([s.job_id for s in plan.starts])):
                if job is None or job.version != st.version or job.state is not JobState.PENDING \
                        or job.attempt != st.attempt:
                    skipped.append((st.job_id, "changed since the snapshot"))
                    continue
                change = T.start(job, st, now)
                changes.append(replace(change, expected_doc=proof) if proof else change)
            statuses = self._commit(changes)
            if FENCED in statuses:  # no longer the leader: stop here (the starts written
                raise Fenced(self.fence_token() or "")  # before are the new leader's to resend)
            changed = []
            for change, status in zip(changes, statuses):
                if status == OK:
                    started.append(change.job)
                else:
                    skipped.append((change.job.id, status))
                    if status == CHANGED:
                        changed.append(change.job.id)
            if changed:
                self._forget(changed)
        for pre in plan.preemptions:
            try:
                stopping.append(self.preempt(pre.job_id, pre.attempt, now, pre.reason,
                                                pre.kind))
            except (StaleAttempt, JobNotFound) as e:
                skipped.append((pre.job_id, str(e)))
        raced = {job_id: Reason("Resources", f"its placement raced with another change ({why});"
                                              " retried next cycle")
                 for job_id, why in skipped if job_id not in plan.pending}
        gone = {j.id for j in started}
        res = json.dumps(plan.reservation.to_dict()) if plan.reservation else None
        with self._gathered():  # reasons, queue order, reservation: one round trip
            self._record_reasons({**plan.pending, **raced})
            self._put_order([i for i in plan.order if i not in gone] if gone else plan.order,
                            now)
            if res != self._last_reservation:
                self._put_reservation(res)
        self._last_reservation = res
        return Applied(tuple(started), tuple(stopping), tuple(skipped))

    def _start_copies(self, job_ids: Sequence[str]) -> list[tuple[Job | None, str]]:
        """The jobs a Plan's starts are applied to, each with the proof its commit carries
        (``Change.expected_doc``; "": none). By default they are read again, not taken from
        the snapshot: a record rewritten without a new version (a compromised agent) must
        reach the agent's sealed-spec check as it is, not be overwritten from an older copy.
        A backend that proves its copies in the commit may skip the read."""
        return [(job, "") for job in self._load(job_ids)]

    def _forget(self, job_ids: Sequence[str]) -> None:
        """Drop any copy of these jobs the backend keeps between reads (their stored record
        is not the one it holds)."""
        del job_ids

    @contextmanager
    def _gathered(self) -> Iterator[None]:
        """The backend may hold the writes made inside the block and send them together at
        its end (one round trip, applied at once)."""
        yield

    def _record_reasons(self, pending: Mapping[str, Reason]) -> None:
        """Write what changed since this process last wrote. A job's reason is dropped by the
        backend itself when the job leaves PENDING, so a restarted scheduler leaves none stale."""
        last = self._last_reasons  # (most reasons are the very same objects as last cycle's)
        changed = {k: v for k, v in pending.items() if (old := last.get(k)) is not v and old != v}
        gone = [k for k in last if k not in pending]
        if changed or gone:
            self._write_reasons(changed, gone)
        self._last_reasons = dict(pending)

    def explain(self, job_id: str) -> Reason | None:
        """Why a job is pending (None once it is not)."""
        return self.get(job_id).pending_reason

    def last_order(self) -> QueueOrder | None:
        """The pending queue as the last applied Plan ranked it (``Plan.order`` less the jobs
        it started), and when; None if no Plan was ever applied."""
        return self._get_order()

    def reasons(self, job_ids: Sequence[str]) -> dict[str, Reason]:
        """The recorded reasons of these pending jobs (those that have one)."""
        return {i: r for i, r in zip(job_ids, self._read_reasons(job_ids)) if r is not None}

    def record_cycle_failure(self, now: float, error: str) -> None:
        """A scheduling cycle failed with ``error`` (the leader's loop records it, so that
        ``spillway status`` and ``explain`` can say so; the newest FAILURES_KEPT are kept)."""
        self._put_cycle_failure(now, error, FAILURES_KEPT)

    def cycle_failures(self, since: float = 0.0) -> list[tuple[float, str]]:
        """The failed cycles recorded since ``since`` (time, error), newest first."""
        return [f for f in self._get_cycle_failures() if f[0] >= since]

    def queue_position(self, job_id: str) -> tuple[int | None, int, float] | None:
        """(1-based place in the last cycle's queue or None if unranked, queue length, time of
        that cycle); None if no Plan was ever applied."""
        order = self._get_order()
        return None if order is None else (order.position(job_id), order.total, order.at)

    def reservation(self) -> Reservation | None:
        """The reservation the last applied Plan made (EASY backfill), if any."""
        from broker.cycle.plan import Reservation

        raw = self._get_reservation()
        return Reservation.from_dict(json.loads(raw)) if raw else None
