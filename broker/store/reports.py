"""Agents' reports in batches: several reports, one read and one compare-and-set write per job
(a part of the store: its functions take the :class:`~broker.store.core.StoreCore` they
work on)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from broker.errors import Conflict, Fenced, JobNotFound, StaleAttempt
from broker.model import Job
from broker.store import transitions as T
from broker.store.events import JobEvent
from broker.store.status import FENCED, OK, RETRIES, VERSION, Usage

if TYPE_CHECKING:
    from broker.store.core import StoreCore


def report_many(store: StoreCore, reports: Sequence[tuple[str, int, JobEvent, float]]
                ) -> list[Job | Exception]:
    """Several reports (job id, attempt, event, time), with the outcome of calling
    :meth:`report` for each in turn, in a few round trips: the jobs are read together, the
    reports on one job are applied in order and written as one compare-and-set (its
    history keeps every step, each with its own time), and the usage of the attempts they
    end is added together. One result per report: the job after it, or the
    StaleAttempt, JobNotFound or Conflict it met (only a failing store raises).

    A job the backend holds already (:meth:`_cached_jobs`: the version it last read or
    wrote) is not read first: the write's compare-and-set proves the guess (on a lost
    race the job is read and its reports redone); a guess that changes nothing is not
    trusted, the job is read."""
    results: list[Job | Exception | None] = [None] * len(reports)
    todo: dict[str, list[int]] = {}
    for i, (job_id, _, _, _) in enumerate(reports):
        todo.setdefault(job_id, []).append(i)
    read: set[str] = set()  # jobs whose cached copy lost a race: read them
    mp = store.config.max_preemptions
    for _ in range(RETRIES):
        if not todo:
            break
        ids = list(todo)
        changes: list[T.Change] = []
        steps: list[tuple[str, list[tuple[int, Job, Job]], list[int]]] = []
        need: list[str] = []
        for job_id, job in zip(ids, store._cached_jobs(ids)):
            if job is None or job_id in read:
                need.append(job_id)
                continue
            change, done, rest = _fold_reports(job, [(i, reports[i]) for i in
                                                          todo[job_id]], results, mp)
            if change is None:
                need.append(job_id)
                continue
            changes.append(change)
            steps.append((job_id, done, rest))
        for job_id, job in zip(need, store._load(need) if need else []):
            if job is None:
                for i in todo.pop(job_id):
                    results[i] = JobNotFound(job_id)
                continue
            change, done, rest = _fold_reports(job, [(i, reports[i]) for i in
                                                          todo[job_id]], results, mp)
            if change is None:  # nothing to write: every report answered from ``job``
                del todo[job_id]
                continue
            changes.append(change)
            steps.append((job_id, done, rest))
        usages: list[Usage] = []
        fenced = False
        for (job_id, done, rest), status in zip(steps, store._commit(changes)):
            if status == OK:
                for i, before, after in done:
                    results[i] = after
                    usage = store._usage_of(before, after)
                    if usage is not None:
                        usages.append(usage)
                if rest:
                    todo[job_id] = rest  # reports that could not join this write
                else:
                    del todo[job_id]
            elif status == FENCED:
                fenced = True
            elif status == VERSION:  # read it again and redo them all
                read.add(job_id)
            else:
                for i in todo.pop(job_id):
                    results[i] = Conflict(f"job {job_id}: write refused ({status})")
        if usages:
            store._add_usage_many(usages)
        if fenced:  # (the writes that went through are accounted above)
            raise Fenced(store.fence_token() or "")
    for i in (i for idx in todo.values() for i in idx):
        results[i] = Conflict(f"job {reports[i][0]}: too many concurrent writers")
    return [r if r is not None else JobNotFound(reports[n][0])
            for n, r in enumerate(results)]

def _fold_reports(job: Job, reports: list[tuple[int, tuple[str, int, JobEvent, float]]],
                  results: list[Job | Exception | None], max_preemptions: int
                  ) -> tuple[T.Change | None, list[tuple[int, Job, Job]], list[int]]:
    """Apply ``reports`` (index, report) to ``job`` in order, as one Change. Returns the
    Change (None: nothing changed), the (index, before, after) of each report that
    changed the job, and the indexes left for a later write (a report whose GPU release
    belongs to another owner cannot join). Reports that change nothing or are stale get
    their result in ``results`` at once."""
    cur, merged, done = job, None, []
    for n, (i, (_, attempt, event, now)) in enumerate(reports):
        try:
            change = T.report(cur, attempt, event, now, max_preemptions)
        except StaleAttempt as e:
            results[i] = e
            continue
        if change is None:
            results[i] = cur
            continue
        if merged is None:
            merged = change
        elif change.release and merged.release and \
                change.release_owner != merged.release_owner:
            return merged, done, [j for j, _ in reports[n:]]
        else:
            merged = replace(merged, job=change.job, release=merged.release + change.release,
                             release_owner=change.release_owner or merged.release_owner)
        done.append((i, cur, change.job))
        cur = change.job
    return merged, done, []
