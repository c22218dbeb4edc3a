"""The place role's policies: where a job starts on free capacity (``best-fit``, ``aligned``).

The free capacity they search, best fit first to limit fragmentation, is
policies/place/capacity.py's :class:`FreeIndex`; the role's interface is
policies/cycle.py's :class:`Placer` (both importable from here too).
"""

from __future__ import annotations

from broker.model import Allocation, Job
from broker.model.fit import Kind
from policies.cycle import Cycle, Placer
from policies.place.capacity import FreeIndex
from policies.registry import register

__all__ = ["Aligned", "BestFit", "FreeIndex", "Kind", "Placer"]


@register("place", "best-fit")
class BestFit(Placer):
    """Place all of a job's GPUs on one node (or on ``nodes`` nodes at once, a gang), on the
    nodes left with the fewest free devices."""

    def place(self, cycle: Cycle, job: Job, end: float) -> tuple[Allocation, ...] | None:
        return cycle.index.find(job.res, job.spec.sites)


@register("place", "aligned")
class Aligned(Placer):
    """Where the job finishes soonest: the fastest allowed GPU model with room (the speed
    table, broker/model/speed.py), then, among its tightest nodes, the node whose busy horizon the
    job extends least (end-aligned packing); jobs that end before the reservation pack into
    the reserved nodes first."""

    packs_around_reservation = True

    def prepare(self, cycle: Cycle) -> None:
        horizon: dict[str, float] = {}
        now = cycle.now
        for j in cycle.snap.active:
            end = cycle.end_of(j)
            for a in j.allocations:
                horizon[a.node_id] = max(horizon.get(a.node_id, now), end)
        cycle.horizon = horizon

    def place(self, cycle: Cycle, job: Job, end: float) -> tuple[Allocation, ...] | None:
        return cycle.index.find(job.res, job.spec.sites, horizon=cycle.horizon or {}, end=end)
