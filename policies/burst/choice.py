"""Which offer a job bursts to, and booking it (the burst phase, policies/burst/sla.py, rule 4).

:func:`offers_for` the offers that could hold a job; :func:`cheapest` the one with the lowest
expected cost to finish it (or an instance launched this cycle with room for it), within its
``max_price_per_hour``, its region's quota and the market the deadline rule takes;
:func:`book` rents it (or joins the instance) and gives the job its ``Bursting`` reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.model import Job, Offer, PriorityClass, Reason
from policies.burst import deadline as deadline_burst
from policies.burst import outlook
from policies.burst.offers import (
    Bin,
    CostModel,
    holds,
    job_share_per_hour,
    market_allowed,
    rank_value,
    runtime_on,
)
from policies.cycle import Cycle
from policies.reasons import dur


@dataclass
class Choice:
    """An offer a job would burst to, what that is expected to cost, and the instance launched
    this cycle it would share (None: a new one)."""

    offer: Offer
    cost: float
    bin: Bin | None  # an instance this cycle already launches, to share


@dataclass
class _Offers:
    """A cycle's memo: the offers that could hold a job, per shape of job (:func:`offers_for`)."""

    by_shape: dict[tuple[object, ...], list[Offer]] = field(default_factory=dict)


def offers_for(cycle: Cycle, job: Job, cls: PriorityClass) -> list[Offer]:
    """The offers that could hold ``job`` on a market it may use (memoised per shape)."""
    memo = cycle.memo(_Offers).by_shape
    key = (job.res.key, job.spec.sites, cls.name)
    out = memo.get(key)
    if out is None:
        out = memo[key] = [o for o in cycle.snap.offers
                           if holds(o, job) and market_allowed(o, job, cls)]
    return out


def cheapest(cycle: Cycle, job: Job, cls: PriorityClass, cfg: Mapping[str, Any],
              costs: CostModel, offers: list[Offer], room: dict[tuple[str, str], float],
              new: list[Bin], target: float) -> Choice | None:
    """The offer (or an instance launched this cycle with room) with the lowest expected cost
    to finish ``job``, or None with the reason set."""
    now, limit = cycle.now, job.spec.max_price_per_hour
    unknown = float(cfg["unknown_runtime_s"])
    spot_ok = may_take_spot(cycle, job, cfg, costs, offers)
    if job.spec.deadline is not None and deadline_burst.market_for(cycle, job, costs) == "wait":
        return None
    cands: list[Choice] = []
    over = 0
    for o in offers:
        if (o.market.value == "spot") != spot_ok and job.spec.deadline is not None:
            continue  # the market the deadline rule chose
        if o.market.value == "spot" and not spot_ok:
            continue
        if limit is not None and job_share_per_hour(o, job) > limit:
            over += 1
            continue
        if room.get((o.provider, o.region), math.inf) < o.gpu_count * job.res.nodes:
            continue
        if now + costs.boot(o) > target and now < target:
            continue  # its boot would not fit the SLA while a faster one might
        run = runtime_on(cycle, job, o.gpu_model, unknown)
        cands.append(Choice(o, costs.expected_cost(o, job, run), None))
    for b in new:  # join an instance this cycle launches: pay only the hours it adds
        if b.count == 1 and job.res.nodes == 1 and b.free_gpus >= job.res.gpus \
                and holds(b.offer, job) and market_allowed(b.offer, job, cls, spot_ok) \
                and (limit is None or job_share_per_hour(b.offer, job) <= limit):
            run = runtime_on(cycle, job, b.offer.gpu_model, unknown)
            extra = max(0.0, now + costs.boot(b.offer) + run - b.runs_until)
            cands.append(Choice(b.offer, costs.expected_cost(b.offer, job, extra)
                                 if extra > 0 else 0.0, b))
    if not cands:
        cycle.pending[job.id] = Reason(
            "OverMaxPrice", f"every offer that could hold it costs more than its "
            f"max_price_per_hour (${limit:g})") if over else Reason(
            "NoOffer", "no cloud offer within its region quotas boots in time")
        return None
    # ranked by the objective (policies/carbon/objective.py): the dollars themselves by default
    return min(cands, key=lambda c: (rank_value(
        cycle, job, c.offer, c.cost, runtime_on(cycle, job, c.offer.gpu_model, unknown),
        target, costs.boot(c.offer)), c.bin is None, c.offer.id))


def may_take_spot(cycle: Cycle, job: Job, cfg: Mapping[str, Any], costs: CostModel,
             offers: list[Offer]) -> bool:
    """Spot for a job with a deadline only when the deadline rule takes it now."""
    return job.spec.deadline is None or deadline_burst.market_for(cycle, job, costs) == "spot"


def book(cycle: Cycle, job: Job, c: Choice, room: dict[tuple[str, str], float],
          new: list[Bin], start: float, made_room_for: str = "", early: bool = False) -> None:
    now = cycle.now
    boot = float(c.offer.extra.get("boot_s", cycle.settings("sla")["boot_s"]))
    run = runtime_on(cycle, job, c.offer.gpu_model, float(cycle.settings("sla")
                                                          ["unknown_runtime_s"]))
    b = c.bin
    if b is None:
        b = Bin(c.offer, c.offer.gpu_count, now + boot, now + boot, count=job.res.nodes)
        new.append(b)
        room[(c.offer.provider, c.offer.region)] = room.get(
            (c.offer.provider, c.offer.region), math.inf) - c.offer.gpu_count * job.res.nodes
    b.free_gpus -= job.res.gpus
    b.runs_until = max(b.runs_until, now + boot + run)
    b.jobs.append(job.id)
    why = f"it makes room on-prem for {made_room_for}, whose SLA would break and who would " \
          "cost more in the cloud" if made_room_for else outlook.why_burst(job, start, now) + (
            " (spot now, while there is some)" if early else "")
    cycle.pending[job.id] = Reason(
        "Bursting", f"{why}; renting {c.offer.id} (${c.offer.price_per_hour:g}/h), expected "
        f"${c.cost:.2f} to finish it, ready in ~{dur(boot)}")
