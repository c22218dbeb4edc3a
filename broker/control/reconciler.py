"""The reconciler: level-triggered repairs, safe to run any number of times.

* nodes whose lease lapsed are marked DOWN and their jobs requeued (attempt + 1), but only
  once the store has been reachable for a whole lease (``judge_from``): after an outage of the
  store, agents get a lease's time to heartbeat before any node is declared dead;
* surviving parts of a gang that lost a node are told to stop (their attempt is stale);
* start commands for jobs stuck in STARTING on a live node are sent again (a lost message).
"""

from __future__ import annotations

import logging
import time

from broker.bus import commands
from broker.bus.runtime import Runtime
from broker.model.state import JobState

log = logging.getLogger(__name__)


def reconcile(rt: Runtime, now: float | None = None,
              judge_from: float | None = None) -> dict[str, int]:
    """One pass of repairs. ``judge_from``: when the store became reachable (to this
    scheduler, or at all: its server's start); leases are not judged before a whole lease
    has passed since."""
    now = time.time() if now is None else now
    judged = judge_from is None or now - judge_from >= rt.config.lease_ttl_s
    requeued = rt.store.expire(now) if judged else []
    if requeued:
        log.warning("requeued %d job(s) from dead nodes: %s", len(requeued),
                    ", ".join(j.id for j in requeued))
        commands.trigger_cycle(rt.redis)
    stuck_after = 2 * rt.config.heartbeat_s
    snap = rt.store.snapshot(now)
    live = set(snap.node_by_id)
    stuck = [j for j in snap.active if j.state is JobState.STARTING
             and j.history and now - j.history[-1].time > stuck_after
             and all(a.node_id in live for a in j.allocations)]
    if stuck:
        commands.start_jobs(rt.celery, stuck)
    stopping = [j for j in snap.active if j.state is JobState.STOPPING
                and j.history and now - j.history[-1].time > stuck_after]
    if stopping:
        commands.stop_jobs(rt.celery, stopping, rt.config.grace_s)
    return {"requeued": len(requeued), "restarted": len(stuck), "restopped": len(stopping)}
