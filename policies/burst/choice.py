"""Which offer a job bursts to, and booking it (the burst phase, policies/burst/sla.py, rule 4).

:func:`offers_for` the offers that could hold a job; :func:`cheapest` the one with the lowest
expected cost to finish it (or an instance launched this cycle with room for it), within its
``max_price_per_hour``, its region's quota and the market the deadline rule takes, or the
reason there is none (it writes no reason: its callers decide whether the job is told);
:func:`book` rents it (or joins the instance) and gives the job its ``Bursting`` reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.model import Job, Offer, PriorityClass, Reason
from policies.burst import deadline as deadline_burst
from policies.burst import outlook
from policies.burst.offers import (
    Bin,
    CostModel,
    Phase,
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


def cheapest(p: Phase, job: Job, cls: PriorityClass, offers: list[Offer], target: float,
             join: Sequence[Bin] = ()) -> Choice | Reason | None:
    """The offer (or an instance of ``join``, launched this cycle, with room) with the lowest
    expected cost to finish ``job``; else the reason there is none (``OverMaxPrice``,
    ``NoOffer``), for the caller to give the job or not; None when the deadline rule has the
    job wait (that rule gives it its reason: policies/burst/deadline.py ``market_for``)."""
    cycle, costs = p.cycle, p.costs
    now, limit = cycle.now, job.spec.max_price_per_hour
    unknown = float(p.cfg["unknown_runtime_s"])
    spot_ok = may_take_spot(cycle, job, costs)
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
        if p.room.get((o.provider, o.region), math.inf) < o.gpu_count * job.res.nodes:
            continue
        if now + costs.boot(o) > target and now < target:
            continue  # its boot would not fit the SLA while a faster one might
        run = runtime_on(cycle, job, o.gpu_model, unknown)
        cands.append(Choice(o, costs.expected_cost(o, job, run), None))
    for b in join:  # join an instance this cycle launches: pay only the hours it adds
        if b.count == 1 and job.res.nodes == 1 and b.free_gpus >= job.res.gpus \
                and holds(b.offer, job) and market_allowed(b.offer, job, cls, spot_ok) \
                and (limit is None or job_share_per_hour(b.offer, job) <= limit):
            run = runtime_on(cycle, job, b.offer.gpu_model, unknown)
            extra = max(0.0, now + costs.boot(b.offer) + run - b.runs_until)
            cands.append(Choice(b.offer, costs.expected_cost(b.offer, job, extra)
                                if extra > 0 else 0.0, b))
    if not cands:
        return Reason(
            "OverMaxPrice", f"every offer that could hold it costs more than its "
            f"max_price_per_hour (${limit:g})") if over else Reason(
            "NoOffer", "no cloud offer within its region quotas boots in time")
    # ranked by the objective (policies/carbon/objective.py): the dollars themselves by default
    return min(cands, key=lambda c: (rank_value(
        cycle, job, c.offer, c.cost, runtime_on(cycle, job, c.offer.gpu_model, unknown),
        target, costs.boot(c.offer)), c.bin is None, c.offer.id))


def may_take_spot(cycle: Cycle, job: Job, costs: CostModel) -> bool:
    """Spot for a job with a deadline only when the deadline rule takes it now."""
    return job.spec.deadline is None or deadline_burst.market_for(cycle, job, costs) == "spot"


def book(p: Phase, job: Job, c: Choice, start: float, made_room_for: str = "",
         early: bool = False) -> None:
    """Rent ``c`` for ``job`` (a new instance in ``p.new``, its GPUs taken from its region's
    ``p.room``; or a place on the instance it shares) and give the job its ``Bursting``
    reason (``start``: its on-prem forecast; ``made_room_for``: the job behind it that it
    bursts to make room for; ``early``: spot before its decision time)."""
    cycle = p.cycle
    now = cycle.now
    boot = float(c.offer.extra.get("boot_s", p.cfg["boot_s"]))
    run = runtime_on(cycle, job, c.offer.gpu_model, float(p.cfg["unknown_runtime_s"]))
    b = c.bin
    if b is None:
        b = Bin(c.offer, c.offer.gpu_count, now + boot, now + boot, count=job.res.nodes)
        p.new.append(b)
        p.room[(c.offer.provider, c.offer.region)] = p.room.get(
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
