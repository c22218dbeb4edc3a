"""Invariants the simulator checks after every cycle. Any breach is a bug in the scheduler or
the store, and is counted (``invariant_violations`` must be 0) with the first few described.

* no GPU is held by two jobs (or two attempts of one job) at once;
* no job runs twice: one active attempt per job;
* no gang is partly started: every start places all of a job's nodes with all their GPUs;
* every state change is legal (the transition table), checked on each job the cycle touched
  and on each job when it finishes.
"""

from __future__ import annotations

from broker.cycle.plan import Applied, Plan
from broker.model import Job
from broker.model.state import ACTIVE, can_move
from broker.store.memory import MemoryStore


class InvariantChecker:
    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.violations: list[str] = []

    def _fail(self, now: float, what: str) -> None:
        self.violations.append(f"t={now:.0f}: {what}")

    def after_cycle(self, now: float, plan: Plan, applied: Applied) -> None:
        self._gpus_held_once(now, applied.started)
        for job in applied.started:
            self._whole_gang(now, job)
        for job in (*applied.started, *applied.stopping):
            self._legal_history(now, job)
        planned = [s.job_id for s in plan.starts]
        if len(set(planned)) != len(planned):
            self._fail(now, "a job was planned to start twice in one cycle")

    def _gpus_held_once(self, now: float, started: tuple[Job, ...]) -> None:
        """Each GPU a job just claimed is owned by it and by no other active job; and the GPUs
        claimed in the store are exactly as many as the active jobs hold (so no later change
        can have handed one of them to a second job unnoticed)."""
        store = self.store
        held = 0
        for job_id in store._active:
            job = store._jobs[job_id]
            if job.state not in ACTIVE:
                self._fail(now, f"{job_id} is indexed active in state {job.state.value}")
            done = job.parts_exited
            held += sum(len(a.gpu_ids) for a in job.allocations
                        if not done or all(r != a.rank for r, _ in done))
        claimed = sum(len(v) for v in store._alloc.values())
        if claimed != held:
            self._fail(now, f"{claimed} GPUs claimed but {held} held by active jobs")
        seen: dict[tuple[str, str], str] = {}
        for job in started:
            for a in job.allocations:
                for gid in a.gpu_ids:
                    key = (a.node_id, gid)
                    owner = store._alloc.get(a.node_id, {}).get(gid)
                    if key in seen or owner != f"{job.id}:{job.attempt}":
                        self._fail(now, f"GPU {gid} on {a.node_id} is owned by {owner}, "
                                        f"not {job.id}:{job.attempt}")
                    seen[key] = job.id

    def _whole_gang(self, now: float, job: Job) -> None:
        res = job.res
        nodes = {a.node_id for a in job.allocations}
        if len(job.allocations) != res.nodes or len(nodes) != res.nodes or any(
                len(a.gpu_ids) != res.gpus for a in job.allocations):
            self._fail(now, f"{job.id} started partly: {job.allocations} for {res}")

    def _legal_history(self, now: float, job: Job) -> None:
        for before, after in zip(job.history, job.history[1:]):
            if not can_move(before.state, after.state):
                self._fail(now, f"{job.id}: illegal {before.state.value} -> {after.state.value}")

    def check_finished(self, now: float, job: Job) -> None:
        self._legal_history(now, job)
