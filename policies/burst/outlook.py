"""What a job that may burst is told while it waits (``spillway explain``): the burst phase's
expectations, not the queue's alone.

A job the burst policy (policies/burst/sla.py) leaves waiting for its decision time keeps the
queue's reason (``Resources``, ``Priority``, ...), followed by what the burst phase expects:
its on-prem start forecast (policies/burst/forecast.py), whether that meets its SLA, and the moment
it bursts if it still waits then (its decision time: its SLA target less the slowest boot of
the offers that could hold it, less ``margin_s``), to the offer it would rent as things stand
(the cheapest to finish it now), with that offer's price and boot estimate (the offers carry
their machines' observed boots: broker/store/boots.py). The reason carries the same as data
(:class:`~broker.model.BurstOutlook`), which the client, the CLI and the API show.

A job whose sites allow no on-prem node (``sites: [cloud]``) has nothing to wait for on-prem:
its reason is ``CloudOnly``, with when and where it bursts, never a queue position on-prem.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from broker.model import BurstOutlook, Job, Offer, Reason
from policies.burst.offers import CostModel, Phase, offers_by_id
from policies.carbon.objective import Objective
from policies.cycle import Cycle
from policies.reasons import dur


def cloud_only(job: Job) -> bool:
    """Do the job's sites allow no on-prem node?"""
    return "onprem" not in job.spec.sites


def outlook(job: Job, offer: Offer, boot_s: float, burst_at: float, sla_at: float,
            start: float) -> BurstOutlook:
    return BurstOutlook(
        burst_at=burst_at, sla_at=sla_at,
        onprem_start=start if math.isfinite(start) else None, offer_id=offer.id,
        provider=offer.provider, region=offer.region, zone=offer.zone,
        market=offer.market.value, instance_type=offer.instance_type,
        price_per_hour=offer.price_per_hour, boot_s=boot_s, cloud_only=cloud_only(job))


def tell(p: Phase, job: Job, offers: Sequence[Offer], burst_at: float, sla_at: float,
         choose: Callable[[], Offer | Reason | None], onprem_start: Callable[[], float]) -> None:
    """Set the reason of ``job``, left waiting for its decision time ``burst_at``: ``choose()``
    the offer it would rent now, or the reason it has none (None: the deadline rule has it
    wait, and gave it its reason), ``onprem_start()`` its forecast. The burst phase ``p``
    gives the settings, the costs and the GPUs each region's quota still allows (``p.room``,
    less this cycle's bursts so far: ``p.new``)."""
    cycle, costs, cfg = p.cycle, p.costs, p.cfg
    kept = cycle.pending.get(job.id)
    offer = _likely(cycle, job, p.room, len(p.new), costs, choose)
    if not isinstance(offer, Offer):  # (the refusal is what its decision time would say)
        if offer is None:
            refusal = cycle.pending.pop(job.id)
        else:
            cycle.pending.pop(job.id, None)
            refusal = offer
        if cloud_only(job):
            cycle.pending[job.id] = no_offer_then(job, refusal, burst_at, cycle.now)
        elif kept is not None:
            cycle.pending[job.id] = kept
        return
    spare = _fastest(cycle, offers, costs) if cfg["stay_needs_boot"] else 0.0
    seen = outlook(job, offer, costs.boot(offer), burst_at, sla_at, onprem_start())
    cycle.pending[job.id] = _told(cycle, job, kept, seen, spare, float(cfg["margin_s"]))


def _told(cycle: Cycle, job: Job, kept: Reason | None, seen: BurstOutlook, spare_s: float,
          margin_s: float) -> Reason:
    """:func:`waiting`, the very reason the job was told last cycle while what its sentence
    is made of is the same (``cycle.memory.outlooks["told"]``): most waiting jobs of a deep
    queue are told the same every cycle, and a store writes only the reasons that changed."""
    now, day = cycle.now, 12 * 3600
    start = seen.onprem_start
    sla = cycle.snap.class_by_name[job.priority].sla_s if seen.cloud_only else None
    key = (kept, seen, spare_s, margin_s, job.priority, job.spec.sites, sla,
           abs(seen.burst_at - now) < day, abs(seen.sla_at - now) < day,
           start is not None and abs(start - now) < day)
    told: dict[str, tuple[tuple[Any, ...], Reason]] = \
        cycle.memory.outlooks.setdefault("told", {})
    last = told.get(job.id)
    if last is not None and last[0] == key:
        return last[1]
    out = waiting(cycle, job, kept, seen, spare_s, margin_s)
    if len(told) > 100_000:
        told.clear()
    told[job.id] = (key, out)
    return out


@dataclass
class _Kept:
    """A cycle's memo of the outlooks: the fastest boot per list of offers (by id),
    :func:`_room`'s key with the count of machines rented when it was made, and
    :func:`_world`'s number once asked (``world_known``)."""

    fastest: dict[int, float] = field(default_factory=dict)
    room: tuple[int, tuple[Any, ...]] | None = None
    world: int | None = None
    world_known: bool = False


def _fastest(cycle: Cycle, offers: Sequence[Offer], costs: CostModel) -> float:
    """The fastest boot of ``offers`` (memoised in the cycle per list of offers)."""
    memo = cycle.memo(_Kept).fastest
    out = memo.get(id(offers))
    if out is None:
        out = memo[id(offers)] = min(costs.boot(o) for o in offers)
    return out


def _likely(cycle: Cycle, job: Job, room: Mapping[tuple[str, str], float], rented: int,
            costs: CostModel, choose: Callable[[], Offer | Reason | None]
            ) -> Offer | Reason | None:
    """``choose()``, kept across cycles (``cycle.memory.outlooks``) per shape of job and
    estimate while the offers, the region quotas left and the cost settings are the same:
    the outlook of every waiting job of a deep queue, every cycle, would otherwise cost the
    simulator a quarter of its time."""
    memo: dict[Any, Any] = cycle.memory.outlooks.setdefault("memo", {})
    world = _world(cycle, costs)
    key = None if world is None or job.spec.deadline is not None else (
        world, _room(cycle, room, rented), job.res.key, job.spec.sites, job.spec.gpu_types,
        cycle.snap.class_by_name.get(job.priority), job.spec.max_price_per_hour,
        bool(job.spec.checkpoint_dir), cycle.estimate(job))
    hit = memo.get(key) if key is not None else None
    if hit is None:
        got = choose()
        if key is not None:
            if len(memo) > 100_000:
                memo.clear()
            memo[key] = (got.id, None) if isinstance(got, Offer) else (None, got)
        return got
    if hit[0] is not None:
        return offers_by_id(cycle)[hit[0]]
    why: Reason | None = hit[1]
    return why


def _room(cycle: Cycle, room: Mapping[tuple[str, str], float], rented: int
          ) -> tuple[Any, ...]:
    """``room`` as a key, once per state of it in a cycle (it changes only with the machines
    the cycle rents: ``rented``)."""
    memo = cycle.memo(_Kept)
    kept = memo.room
    if kept is None or kept[0] != rented:
        kept = memo.room = (rented, tuple(sorted(room.items())))
    return kept[1]


def _world(cycle: Cycle, costs: CostModel) -> int | None:
    """A number for what the choice of an offer depends on besides the job (the offers as
    published, the cost settings, the cycle's time where the objective weighs carbon or
    lateness), the same across cycles while these are (None: not comparable)."""
    memo = cycle.memo(_Kept)
    if memo.world_known:
        return memo.world
    obj = Objective.of(cycle.settings("objective"))
    try:
        seen: tuple[Any, ...] = (costs, obj, None if obj.dollars_only else cycle.now, tuple(
            (o.id, o.gpu_model, o.gpu_count, o.price_per_hour, o.carbon_zone,
             tuple(sorted(o.extra.items()))) for o in cycle.snap.offers))
        hash(seen)
    except TypeError:  # (an extra that is not hashable)
        memo.world_known = True  # (and memo.world None)
        return None
    last, n = cycle.memory.outlooks.get("world", (None, 0))
    if last != seen:  # (a new number: what was kept for the old one is never asked again)
        n += 1
        cycle.memory.outlooks["world"] = (seen, n)
    memo.world, memo.world_known = n, True
    return memo.world


def why_burst(job: Job, start: float, now: float) -> str:
    """Why a job bursts now, for its ``Bursting`` reason (``start``: its on-prem forecast)."""
    if math.isfinite(start):
        return f"on-prem start forecast in ~{dur(start - now)} breaks its {job.priority} SLA"
    if cloud_only(job):
        return "it runs only in the cloud"
    return f"no on-prem start is forecast, which breaks its {job.priority} SLA"


def clock(ts: float, now: float) -> str:
    """An instant for a sentence, on the UTC clock: ``14:32 UTC`` (with the day when it is
    not within 12 hours). Absolute, so a recorded reason stays true while it is shown."""
    return _clock(ts, abs(ts - now) < 12 * 3600)


@lru_cache(maxsize=16384)
def _clock(ts: float, near: bool) -> str:
    """:func:`clock` (memoised: a waiting job's decision time and SLA are the same instants
    cycle after cycle)."""
    fmt = "%H:%M UTC" if near else "%Y-%m-%d %H:%M UTC"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime(fmt)


def waiting(cycle: Cycle, job: Job, queue_reason: Reason | None, out: BurstOutlook,
            spare_s: float, margin_s: float) -> Reason:
    """The reason of a job left waiting for its decision time ``out.burst_at``: the queue's
    (``queue_reason``), followed by the burst outlook; ``CloudOnly`` for a cloud-only job.
    ``spare_s``: what the on-prem forecast must leave before the SLA for the job to stay."""
    now = cycle.now
    offer = f"{out.where} (${out.price_per_hour:g}/h, ~{dur(out.boot_s)} to boot)"
    at = clock(out.burst_at, now)
    if out.cloud_only:
        sla = cycle.snap.class_by_name[job.priority].sla_s
        return Reason("CloudOnly", f"it runs only in the cloud (sites: "
                                   f"{', '.join(job.spec.sites)}) and no rented machine has "
                                   f"room for it; it bursts at {at} to {offer}, when its "
                                   f"{job.priority} SLA ({dur(sla)}) leaves just the boot and "
                                   f"a {dur(margin_s)} margin, unless a rented machine frees "
                                   "up first", out)
    start = out.onprem_start
    head = queue_reason or Reason("Resources", "waiting for on-prem GPUs")
    if start is not None and start <= out.sla_at - spare_s:
        tail = (f"on-prem is forecast to start it at {clock(start, now)}, within its "
                f"{job.priority} SLA; if it still waits at {at} and on-prem is no longer in "
                f"time, it bursts to {offer}")
    else:
        when = "no on-prem start is forecast" if start is None else \
            f"on-prem is forecast to start it at {clock(start, now)}"
        tail = (f"{when}, past its {job.priority} SLA ({clock(out.sla_at, now)}): it bursts "
                f"at {at} to {offer} unless it starts on-prem first")
    return Reason(head.code, f"{head.message}; {tail}", out)


def no_offer_then(job: Job, refusal: Reason, burst_at: float, now: float) -> Reason:
    """A cloud-only job that no offer could take at its decision time (``refusal``: why)."""
    return Reason("CloudOnly", f"it runs only in the cloud (sites: {', '.join(job.spec.sites)}) "
                               f"and no rented machine has room for it; at its decision time "
                               f"({clock(burst_at, now)}) it could not burst either: "
                               f"{refusal.message}")


def not_allowed(cycle: Cycle, job: Job) -> Reason:
    """A job the burst policy may not send to the cloud: its wait breaks its SLA, or it is
    cloud-only (then it runs only where a machine rented for others has room)."""
    cls = cycle.snap.class_by_name.get(job.priority)
    why = (f"its class {job.priority} may not burst" if cls is None or not cls.may_burst
           else f"its sites ({', '.join(job.spec.sites)}) keep it off the cloud")
    if cloud_only(job):
        return Reason("ClassMayNotBurst", f"it runs only in the cloud (sites: "
                                          f"{', '.join(job.spec.sites)}), but {why}: it can "
                                          "start only on a machine rented for other jobs")
    return Reason("ClassMayNotBurst", f"its wait breaks the {job.priority} SLA, but {why}")
