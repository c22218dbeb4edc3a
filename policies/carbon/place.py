"""The ``place`` role's ``aligned-carbon``: deferrable work on the GPUs that use the least
energy for it.

``aligned`` (policies/place/placement.py) puts every job on the fastest GPU model with room. For a
deferrable job (a deadline, or a class marked ``flexible``: policies/carbon/defer.py ``deferrable``)
finishing soonest is not what it asks for, so ``aligned-carbon`` puts it on the model with room
that needs the least energy for its work:

    energy per unit of work = board power x (1 + node overhead) x runtime on that model

(broker/energy/model.py; the runtime from broker/model/speed.py ``convert_runtime``, from the GPU
model
the job names in ``gpu_types``). A job that names no model is *speed-neutral*: its runtime is
taken as the same on every model, as the simulator (broker/sim/engine.py) and the burst cost
model (policies/burst/offers.py) take it, so it goes to the lowest-power model with room (a V100
draws 438 W with its share of the node, an H100 1,274 W). A job that names one goes where
power over speed is lowest (an H100 at 4.2 x a V100's speed: 303 W per V100-equivalent, a
V100: 438). Within a model, and for every other job, it is ``aligned`` itself; a job that fits
nowhere fits nowhere here either (the same models are tried, in another order).
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.energy.model import EnergyModel
from broker.model import Allocation, Job
from broker.model.fit import Kind
from broker.model.speed import convert_runtime
from policies.carbon.defer import deferrable
from policies.cycle import Cycle
from policies.place.capacity import FreeIndex
from policies.place.placement import Aligned
from policies.registry import register

_ENERGY = EnergyModel()


def energy_per_work(model: str, ref: str | None) -> float:
    """kW x (runtime on ``model`` / runtime as given): the energy one GPU of ``model`` spends
    on a unit of work measured on ``ref`` (None: speed-neutral, the same runtime anywhere)."""
    return _ENERGY.power_kw(1, model) * convert_runtime(1.0, ref, model)


def greenest_first(kinds: Iterable[Kind], ref: str | None) -> list[Kind]:
    """``kinds`` by energy per unit of work, lowest first (ties keep their order)."""
    return sorted(kinds, key=lambda k: energy_per_work(k[0], ref))


@register("place", "aligned-carbon")
class AlignedCarbon(Aligned):
    """``aligned`` for most jobs; deferrable jobs on the model that spends the least energy
    on their work, among those with room."""

    def place(self, cycle: Cycle, job: Job, end: float) -> tuple[Allocation, ...] | None:
        if not job.res.gpus or not deferrable(cycle.snap, job):
            return super().place(cycle, job, end)
        index = cycle.index
        by_kind: dict[Kind, set[str]] = {}
        for node_id, kinds in index.kinds_by_gpu.items():
            for kind in set(kinds.values()):
                by_kind.setdefault(kind, set()).add(node_id)
        ref = job.spec.gpu_types[0] if job.spec.gpu_types else None
        for kind in greenest_first(index.wanted(job.res), ref):
            allocs = index.find(
                job.res,
                job.spec.sites,
                horizon=cycle.horizon or {},
                end=end,
                only=by_kind.get(kind, set()),
            )
            if allocs is not None:
                return allocs
        return super().place(cycle, job, end)


def low_power_kinds(index: FreeIndex, job: Job, factor: float) -> list[Kind] | None:
    """The device kinds ``job`` could ever run on whose energy for its work is within
    ``factor`` of the least any of them needs (None: every kind it fits is, or none is:
    nothing to wait for)."""
    res = job.res
    fits = [k for k in index.wanted(res) if index.kind_holds(res, k)]
    if len(fits) < 2:
        return None
    ref = job.spec.gpu_types[0] if job.spec.gpu_types else None
    energy = {k: energy_per_work(k[0], ref) for k in fits}
    least = min(energy.values())
    low = [k for k in fits if energy[k] <= factor * least]
    return low if len(low) < len(fits) else None


def waits_for_low_power(index: FreeIndex, job: Job, factor: float) -> list[Kind] | None:
    """The low-power kinds (:func:`low_power_kinds`) a deferrable job should wait for now:
    none of them has room for it, and another kind has (with no room anywhere it waits in
    the queue as any job does, and may hold the reservation). None: it need not wait."""
    if factor <= 0 or not job.res.gpus:
        return None
    low = low_power_kinds(index, job, factor)
    if low is None:
        return None
    wanted = set(low)
    nodes = [nid for nid, kinds in index.kinds_by_gpu.items()
             if any(k in wanted for k in kinds.values())]
    if index.find(job.res, job.spec.sites, only=nodes) is not None:
        return None
    return low if index.find(job.res, job.spec.sites) is not None else None
