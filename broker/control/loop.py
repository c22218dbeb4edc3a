"""The control loop around the pure cycle: snapshot, plan, apply, while the queue is dirty.

Submit, job end and node join call :func:`trigger_cycle` (:func:`broker.bus.commands.trigger_cycle`
in processes without a Runtime); it marks the queue dirty and wakes the leading scheduler
(broker/control/leader.py), which runs :func:`run_cycles` under its fencing token: cycles loop while
the queue was dirtied meanwhile, so a trigger is never lost, and only the leader's writes
land, so cycles of two schedulers never interleave.
"""

from __future__ import annotations

import logging
import time

from broker.bus import commands
from broker.bus.commands import DIRTY
from broker.bus.runtime import Runtime
from broker.cycle.actuator import apply_plan, sender
from broker.cycle.plan import Applied, Plan
from broker.cycle.scheduler import run_cycle
from broker.cycle.snapshots import SnapshotBuilder
from broker.metrics import scheduler as metrics
from broker.store import node_reports
from policies.registry import PolicySet, bundle
from policies.settings import check_bundles

log = logging.getLogger(__name__)

STATS = "sw:cycle:stats"


def trigger_cycle(rt: Runtime) -> None:
    """Ask for a scheduling cycle soon. Cheap; coalesces bursts of triggers into one task."""
    commands.trigger_cycle(rt.redis)


def run_cycles(rt: Runtime, policies: PolicySet | None = None, max_loops: int = 100) -> int:
    """Run cycles until the queue is clean (the leader calls this under its fencing token).
    Returns the number of jobs started."""
    started = 0
    rt.redis.delete(DIRTY)
    gap = rt.config.cycle_gap_s
    for _ in range(max_loops):
        t0 = time.monotonic()
        applied, dirty = one_cycle(rt, policies)
        started += len(applied.started)
        if not dirty:  # nothing happened while the cycle ran
            break
        # more changed meanwhile: the next cycle waits out the gap, so that it plans for all
        # the jobs that end in it at once (a cycle's cost grows with the queue, not with the
        # jobs it starts); the first cycle after a quiet spell never waits
        rest = gap - (time.monotonic() - t0)
        if rest > 0:
            time.sleep(rest)
    else:
        trigger_cycle(rt)  # still dirty: the next wake-up goes on at once
    return started


_KEPT: dict[int, tuple[Runtime, PolicySet, SnapshotBuilder]] = {}  # per runtime: built once


def _policy(rt: Runtime) -> tuple[PolicySet, SnapshotBuilder]:
    """The configured bundle (built-in, or built in the configuration's ``policies``) and the
    snapshot builder, which keeps the runtime predictor and the cycle's caches across this
    process's cycles (broker/cycle/snapshots.py)."""
    kept = _KEPT.get(id(rt))
    if kept is None or kept[0] is not rt:
        custom = check_bundles(rt.config.policies, "config policies")
        kept = _KEPT[id(rt)] = (rt, bundle(rt.config.policy, custom),
                                SnapshotBuilder(rt.store, rt.config))
    return kept[1], kept[2]


def apply_node_reports(rt: Runtime) -> int:
    """Apply the agents' waiting reports to the job records (broker/store/node_reports.py),
    under the caller's fencing token, then delete them; tell the other nodes of a job whose
    part failed or was preempted to stop theirs. Returns how many reports changed a job."""
    applied = 0
    for node_id, entries in rt.store.take_node_reports():
        reports = []
        for entry_id, fields in entries:
            report = node_reports.decode(fields)
            if report is None:
                log.warning("node %s: report %s is not one (dropped): %r", node_id, entry_id,
                            fields)
            else:
                reports.append(report)
        out = node_reports.apply(rt.store, node_id, reports, time.time())
        if out.lost:
            log.warning("node %s has a new agent: requeued the jobs of the earlier one: %s",
                        node_id, ", ".join(j.id for j in out.lost))
        if out.stop:
            sender(rt)(commands.stop_jobs, rt.celery, out.stop, rt.config.grace_s)
        rt.store.done_node_reports(node_id, [e for e, _ in entries])
        applied += out.applied
    return applied


_ASIDE: dict[int, frozenset[str]] = {}  # per runtime: the jobs the last cycle set aside


def _say_set_aside(rt: Runtime, plan: Plan) -> None:
    """Log the jobs a policy failed on when the set changes (not every cycle)."""
    now = frozenset(plan.set_aside)
    if now != _ASIDE.get(id(rt), frozenset()):
        for job_id, aside in sorted(plan.set_aside.items()):
            log.warning("job %s set aside: the %s policy %r failed on it (%s)", job_id,
                        aside.role, aside.policy, aside.error)
    _ASIDE[id(rt)] = now


def one_cycle(rt: Runtime, policies: PolicySet | None = None) -> tuple[Applied, bool]:
    """Apply the agents' reports, then snapshot, plan, apply. Returns what was applied and
    whether a trigger arrived meanwhile (read and cleared in the same round trip as the
    cycle's statistics)."""
    apply_node_reports(rt)
    t0 = time.perf_counter()
    configured, builder = _policy(rt)
    snap = builder.build(time.time())
    t1 = time.perf_counter()
    plan = run_cycle(snap, policies or configured, memory=builder.memory)
    t2 = time.perf_counter()
    _say_set_aside(rt, plan)
    applied = apply_plan(rt, plan)
    t3 = time.perf_counter()
    metrics.scheduler_metrics(rt.config.classes).observe_cycle(
        snap, plan, applied, {"snapshot": t1 - t0, "plan": t2 - t1, "apply": t3 - t2})
    pipe = rt.redis.pipeline(transaction=False)
    pipe.hset(STATS, mapping={
        "at": time.time(), "pending": len(snap.pending), "active": len(snap.active),
        "nodes": len(snap.nodes), "started": len(applied.started),
        "snapshot_ms": round((t1 - t0) * 1000, 2), "plan_ms": round((t2 - t1) * 1000, 2),
        "apply_ms": round((t3 - t2) * 1000, 2),
    })
    pipe.getdel(DIRTY)
    _, dirty = pipe.execute()
    if applied.started or applied.skipped:
        log.info("cycle: %d pending, %d started, %d skipped (%.1f ms)", len(snap.pending),
                 len(applied.started), len(applied.skipped), (t3 - t0) * 1000)
    return applied, bool(dirty)
