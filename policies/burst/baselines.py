"""The burst decisions of today's tools, as burst policies, for side-by-side runs.

Each rents one instance per job (the cheapest hourly price that holds it), uses instances
still booting before renting another (never two launches for one job), and otherwise
differs from ``sla`` (policies/burst/sla.py) only in *when* and *where*:

- ``immediate``: the moment a job cannot start on-prem, on-demand, the cheapest region
  (Slurm's power saving: ``ResumeProgram`` powers up a cloud node for any pending job that
  cannot start; https://slurm.schedmd.com/power_save.html).
- ``timer``: once a job has waited ``timer_s`` (5 minutes), on-demand, the cheapest region
  (Kueue MultiKueue's incremental dispatch: a workload goes to more clusters after a fixed
  wait; https://kueue.sigs.k8s.io/docs/concepts/multikueue/).
- ``cloud-cheapest``: every job that cannot start at once goes to the cheapest spot offer
  that holds it, failing over to the next available one (on-demand for a class that allows
  no spot), without asking when on-prem would start it (SkyPilot managed jobs:
  https://docs.skypilot.co/en/latest/examples/managed-jobs.html).

A job's class must allow bursting and its ``sites`` a cloud, as for ``sla``; its
``max_price_per_hour`` limits the offers.
"""

from __future__ import annotations

from collections.abc import Callable

from broker.model import Job, Offer, PriorityClass, Reason
from policies.burst.offers import (
    Bin,
    CostModel,
    booting_bins,
    emit,
    holds,
    job_share_per_hour,
    market_allowed,
    may_burst,
    region_room,
    take_booting,
    waiting_reason,
)
from policies.burst.sla import target_of
from policies.cycle import Cycle, wake
from policies.registry import register

Due = Callable[[Cycle, Job, PriorityClass], float]  # when a job may burst


def _run(cycle: Cycle, name: str, spot: bool, due: Due) -> None:
    snap = cycle.snap
    if not snap.offers and not snap.instances:
        return
    costs = CostModel.of(cycle.settings(name))
    booting = booting_bins(cycle, costs.boot_s)
    room = region_room(cycle)
    new: list[Bin] = []
    for job in cycle.blocked:
        try:  # (a job it fails on is set aside: policies/cycle.py deciding)
            cls = may_burst(cycle, job)
            if cls is None:
                continue
            b = take_booting(booting, job, cls)
            if b is not None:
                cycle.pending[job.id] = waiting_reason(b, cycle.now)
                continue
            at = due(cycle, job, cls)
            if cycle.now < at:
                wake(cycle, at)
                continue
            offer = _cheapest(cycle, job, cls, spot, room)
            if offer is None:
                continue
            key = (offer.provider, offer.region)
            room[key] = room.get(key, float("inf")) - offer.gpu_count * job.res.nodes
            boot = costs.boot(offer)
            new.append(Bin(offer, offer.gpu_count - job.res.gpus, cycle.now + boot,
                           cycle.now + boot, [job.id], count=job.res.nodes))
            cycle.pending[job.id] = Reason("Bursting", f"renting {offer.id} "
                                                       f"(${offer.price_per_hour:g}/h) ({name})")
        except Exception as e:
            if not cycle.fail(job, e):
                raise
    emit(cycle, new, {j.id: j for j in cycle.blocked})


def _cheapest(cycle: Cycle, job: Job, cls: PriorityClass, spot: bool,
              room: dict[tuple[str, str], float]) -> Offer | None:
    """The cheapest offer by hourly price that holds the job: spot first when ``spot``
    (and its class allows it), else on-demand."""
    limit = job.spec.max_price_per_hour
    ok = [o for o in cycle.snap.offers if holds(o, job) and market_allowed(o, job, cls)
          and (limit is None or job_share_per_hour(o, job) <= limit)
          and room.get((o.provider, o.region), float("inf")) >= o.gpu_count * job.res.nodes]
    for market in (("spot", "ondemand") if spot else ("ondemand",)):
        same = [o for o in ok if o.market.value == market]
        if same:
            return min(same, key=lambda o: (o.price_per_hour, o.id))
    return None


@register("burst", "immediate", settings={"boot_s": 240.0})
def burst_immediate(cycle: Cycle) -> None:
    """Slurm's power saving (the module docstring)."""
    _run(cycle, "immediate", False, lambda c, j, cls: c.now)


@register("burst", "timer", settings={"boot_s": 240.0, "timer_s": 300.0})
def burst_timer(cycle: Cycle) -> None:
    """Kueue MultiKueue's fixed wait (the module docstring)."""
    wait = float(cycle.settings("timer")["timer_s"])
    _run(cycle, "timer", False, lambda c, j, cls: target_of(j, cls) - cls.sla_s + wait)


@register("burst", "cloud-cheapest", settings={"boot_s": 240.0})
def cloud_cheapest(cycle: Cycle) -> None:
    """SkyPilot managed jobs (the module docstring)."""
    _run(cycle, "cloud-cheapest", True, lambda c, j, cls: c.now)

