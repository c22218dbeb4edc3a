"""Apply a Plan: compare-and-set writes to the store, then commands to the nodes' queues.

Safe to run twice on the same Plan: the store skips starts whose job already moved on, so a
start command is only sent for what this call actually changed.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable

from broker.app import node_queue
from broker.model import Job
from broker.plan import Applied, Plan
from broker.runtime import Runtime


def apply_plan(rt: Runtime, plan: Plan) -> Applied:
    applied = rt.store.apply(plan, now=time.time())
    send_starts(rt, applied.started)
    send_stops(rt, applied.stopping)
    return applied


def send_starts(rt: Runtime, jobs: Iterable[Job]) -> None:
    """One ``start_jobs`` message per node per cycle, carrying (job id, attempt) pairs."""
    by_node: dict[str, list[list[object]]] = defaultdict(list)
    for job in jobs:
        for a in job.allocations:
            by_node[a.node_id].append([job.id, job.attempt])
    task = rt.celery.tasks["spillway.start_jobs"]
    for node_id, items in by_node.items():
        task.apply_async(args=[items], queue=node_queue(node_id))


def send_stops(rt: Runtime, jobs: Iterable[Job], grace_s: float | None = None) -> None:
    """Tell every node of each job to stop its part (SIGTERM, grace, SIGKILL)."""
    grace = rt.config.grace_s if grace_s is None else grace_s
    task = rt.celery.tasks["spillway.stop_job"]
    for job in jobs:
        exited = {r for r, _ in job.parts_exited}
        for a in job.allocations:
            if a.rank not in exited:
                task.apply_async(args=[job.id, job.attempt, grace], queue=node_queue(a.node_id))
