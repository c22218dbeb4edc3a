"""Queue order: who is considered first in a cycle."""

from __future__ import annotations

from collections.abc import Sequence

from broker.model import Job
from broker.plan import Snapshot
from policies.registry import register


@register("order", "priority-fifo")
def priority_fifo(snapshot: Snapshot, jobs: Sequence[Job]) -> list[Job]:
    """Higher class rank first, then earlier submission, then job id (deterministic)."""
    rank = {c.name: -c.rank for c in snapshot.classes}
    return sorted(jobs, key=lambda j: (rank.get(j.spec.priority or "", 0), j.submitted_at, j.id))


@register("admit", "admit-all")
def admit_all(snapshot: Snapshot, job: Job) -> str | None:
    """Admission seam (quotas, budgets): return a refusal reason code, or None to admit."""
    del snapshot, job
    return None
