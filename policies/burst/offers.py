"""What the burst policies share: which offers may hold a job, what finishing it there is
expected to cost, the capacity already rented and still booting, and the launches of a cycle.

Offers reach a policy only through the Snapshot (``snap.offers``; ``extra`` may carry
``available`` (False: the provider has none now), ``boot_s``, ``interruption_rate_per_hour``
and ``region_quota_gpus``). Nothing here reads a cloud API.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.cycle.plan import Launch
from broker.model import InstanceState, Job, Offer, PriorityClass, Reason
from broker.model.fit import wanted_kinds
from broker.model.speed import convert_runtime
from policies.carbon.objective import Objective, expected_kg, mean_intensity, work_hours
from policies.cycle import Cycle
from policies.reasons import dur

BOOTING = (InstanceState.REQUESTED, InstanceState.BOOTING)


def may_burst(cycle: Cycle, job: Job) -> PriorityClass | None:
    """The job's class if it may run in the cloud (its class and its own ``sites``)."""
    cls = cycle.snap.class_by_name.get(job.priority)
    if cls is None or not cls.may_burst or not cloud_sites_allowed(job, cls):
        return None
    return cls


def cloud_sites_allowed(job: Job, cls: PriorityClass) -> bool:
    sites = job.spec.sites
    return "cloud" in sites or ("spot" in sites and cls.spot_allowed)


def market_allowed(offer: Offer, job: Job, cls: PriorityClass, spot: bool = True) -> bool:
    """May ``job`` of class ``cls`` run on ``offer``'s market (``spot``: spot wanted at all)?"""
    sites = job.spec.sites  # (as broker.model.fit.site_allows: spot admits spot sites, cloud
    if offer.market.value == "spot":  # the other cloud sites)
        return spot and cls.spot_allowed and "spot" in sites
    return "cloud" in sites


def holds(offer: Offer, job: Job) -> bool:
    """Could one instance of ``offer`` hold one node of ``job``?"""
    res = job.res
    if res.mig_profile is not None or offer.gpu_count < res.gpus:
        return False
    if offer.extra.get("available") is False:
        return False
    return res.gpus == 0 or bool(wanted_kinds(res, [(offer.gpu_model, None)]))


def alone_on(cycle: Cycle, job: Job, node_id: str) -> bool:
    """Does ``job`` hold every busy GPU of ``node_id`` (no other job runs there)?"""
    held = cycle.snap.allocated.get(node_id, {})
    return all(v.split(":")[0] == job.id for v in held.values())


def billed_gpus(job: Job) -> int:
    """The GPUs a job is billed for, on every node of a gang (a job without GPUs: one)."""
    return max(job.res.gpus, 1) * job.res.nodes


def job_share_per_hour(offer: Offer, job: Job) -> float:
    """The job's share of the offer's price: its GPUs' part, on every node of a gang.
    (What ``max_price_per_hour`` limits.)"""
    return offer.price_per_gpu_hour * billed_gpus(job)


def runtime_on(cycle: Cycle, job: Job, model: str, unknown_s: float) -> float:
    """The job's expected runtime on ``model`` (the speed table), from the cycle's estimate
    (measured on the job's first named GPU type, else speed-neutral)."""
    est = cycle.estimate(job)
    if not math.isfinite(est):
        est = job.spec.time_limit or unknown_s
    ref = job.spec.gpu_types[0] if job.spec.gpu_types else None
    return convert_runtime(est, ref, model)


@dataclass(frozen=True)
class CostModel:
    """Settings of the expected cost to finish a job on an offer."""

    boot_s: float = 240.0  # when the offer does not say
    # spot, when the offer does not say: the median over the 21 single-node AWS GPU traces of
    # "Can't Be Late" (providers/catalog/spot.py DEFAULT_INTERRUPTION_RATE, docs/catalog.md;
    # Catalog.with_interruption_rates puts each offer's own on it)
    interruption_rate_per_hour: float = 0.8
    checkpoint_interval_s: float = 1800.0  # a checkpointing job loses half of it on average
    restart_s: float = 300.0  # to resume from a checkpoint after an interruption
    unknown_runtime_s: float = 4 * 3600.0  # a job with no estimate and no limit

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> CostModel:
        return cls(**{k: float(settings[k]) for k in cls.__dataclass_fields__ if k in settings})

    def boot(self, offer: Offer) -> float:
        return float(offer.extra.get("boot_s", self.boot_s))

    def rate(self, offer: Offer) -> float:
        if offer.market.value != "spot":
            return 0.0
        return float(offer.extra.get("interruption_rate_per_hour",
                                     self.interruption_rate_per_hour))

    def expected_cost(self, offer: Offer, job: Job, runtime_s: float, share: float = 1.0
                      ) -> float:
        """Dollars to finish ``job`` on ``offer``: the price (``share`` of the instance) for
        the boot and the runtime, plus for spot the expected interruptions x (work lost
        since the last checkpoint + restart + a new boot)."""
        price = offer.price_per_hour * share * job.res.nodes / 3600.0
        hours = runtime_s / 3600.0
        lost = (self.checkpoint_interval_s / 2 if job.spec.checkpoint_dir else runtime_s / 2)
        interruptions = self.rate(offer) * hours
        return price * (runtime_s + self.boot(offer)) + interruptions * price * (
            lost + self.restart_s + self.boot(offer))


def rank_value(cycle: Cycle, job: Job, offer: Offer, usd: float, runtime_s: float,
               target: float, boot_s: float) -> float:
    """What ranks the offers that could finish ``job``: the objective (policies/carbon/objective.py)
    of ``usd`` expected dollars, the run's expected emissions in the offer's grid zone and the
    GPU-hours it would start past ``target`` (its SLA), per unit of work. With the default
    weights it is ``usd`` itself: the same choice as by dollars alone."""
    obj = Objective.of(cycle.settings("objective"))
    if obj.dollars_only:
        return usd
    gpus = billed_gpus(job)
    start = cycle.now + boot_s
    g = mean_intensity(offer.carbon_zone, start, start + runtime_s, cycle.snap.carbon_forecast,
                       cycle.snap.carbon) if obj.carbon_usd_per_tonne else None
    kg = expected_kg(gpus, offer.gpu_model, str(offer.site), g, runtime_s)
    late = gpus * max(0.0, start - target) / 3600.0
    return obj.per_work(usd, kg, late, work_hours(gpus, runtime_s, offer.gpu_model))


@dataclass
class Bin:
    """An instance this cycle launches (or one still booting): what is left of it."""

    offer: Offer
    free_gpus: int
    ready_at: float
    runs_until: float  # the longest job put on it is expected to end then
    jobs: list[str] = field(default_factory=list)
    request_id: str = ""  # "" for one this cycle launches
    count: int = 1  # instances (a gang takes one per node)


@dataclass(frozen=True)
class Phase:
    """What the steps of the burst phase share in one cycle (policies/burst/sla.py): the cycle,
    its burst policy's settings (``cfg``) and the cost model read from them, the GPUs each
    region's quota still allows (``room``, less this cycle's launches so far), the instances
    this cycle launches (``new``), and the queue's jobs that will not run on-prem
    (``leaving``: bursting, or waiting for a machine booting for them). The fields are fixed;
    what ``room``, ``new`` and ``leaving`` hold changes as the phase goes."""

    cycle: Cycle
    cfg: Mapping[str, Any]
    costs: CostModel
    room: dict[tuple[str, str], float]
    new: list[Bin] = field(default_factory=list)
    leaving: set[str] = field(default_factory=set)


@dataclass
class _ById:
    """A cycle's memo: the snapshot's offers by id, once asked."""

    offers: dict[str, Offer] | None = None


def offers_by_id(cycle: Cycle) -> dict[str, Offer]:
    memo = cycle.memo(_ById)
    if memo.offers is None:
        memo.offers = {o.id: o for o in cycle.snap.offers}
    return memo.offers


def booting_bins(cycle: Cycle, boot_s: float) -> list[Bin]:
    """Instances requested or booting: capacity the queue can wait for instead of renting
    more (the launches of earlier cycles). A machine is held for the jobs it was launched for
    while they wait (their GPUs on it are taken, in ``jobs``): the queue places a machine that
    comes up for its own jobs first (policies/place/queue.py), so a job ahead of them that counted
    on it would find it taken, and the job it was rented for would rent again."""
    offers = offers_by_id(cycle)
    waiting = {j.id: j for j in cycle.blocked}
    held: dict[str, int] = {}  # job id -> machines held for it (a gang holds one a node)
    out = []
    for inst in sorted(cycle.snap.instances, key=lambda i: (i.requested_at, i.request_id,
                                                            i.provider_id)):
        offer = offers.get(inst.offer_id)
        if inst.state not in BOOTING or offer is None:
            continue
        ready = inst.requested_at + float(offer.extra.get("boot_s", boot_s))
        b = Bin(offer, offer.gpu_count, max(cycle.now, ready), cycle.now,
                request_id=inst.request_id)
        for jid in inst.for_jobs:
            job = waiting.get(jid)
            if job is not None and held.get(jid, 0) < job.res.nodes \
                    and b.free_gpus >= job.res.gpus and holds(offer, job):
                b.free_gpus -= job.res.gpus
                b.jobs.append(jid)
                held[jid] = held.get(jid, 0) + 1
        out.append(b)
    return out


def region_room(cycle: Cycle) -> dict[tuple[str, str], float]:
    """(provider, region) -> GPUs its quota still allows (inf when the offers set none)."""
    quota: dict[tuple[str, str], float] = {}
    for o in cycle.snap.offers:
        q = o.extra.get("region_quota_gpus")
        quota.setdefault((o.provider, o.region), math.inf if q is None else float(q))
    offers = offers_by_id(cycle)
    for inst in cycle.snap.instances:
        held = offers.get(inst.offer_id)
        if held is not None and not inst.ended:
            quota[(held.provider, held.region)] -= held.gpu_count
    return quota


def take_booting(bins: list[Bin], job: Job, cls: PriorityClass) -> Bin | None:
    """The booting instance ``job`` waits for: one launched for it (held for it by
    :func:`booting_bins`; a gang waits for its own), else, for a one-node job, one with
    room left, taking its GPUs."""
    own = [b for b in bins if job.id in b.jobs]
    if own:
        return min(own, key=lambda b: (b.ready_at, b.request_id))
    if job.res.nodes > 1:
        return None
    for b in sorted(bins, key=lambda b: (b.ready_at, b.request_id)):
        if b.free_gpus >= job.res.gpus and holds(b.offer, job) \
                and market_allowed(b.offer, job, cls):
            b.free_gpus -= job.res.gpus
            b.jobs.append(job.id)
            return b
    return None


def request_id(job_ids: Iterable[str], jobs: Mapping[str, Job], now: float) -> str:
    """Deterministic from the jobs (and their attempts) and the cycle's time: a plan computed
    twice asks for the same launch, which providers make idempotent."""
    key = ",".join(f"{j}:{jobs[j].attempt}" for j in sorted(job_ids)) + f"@{now:.3f}"
    return "burst-" + hashlib.sha1(key.encode()).hexdigest()[:16]


def emit(cycle: Cycle, bins: Iterable[Bin], jobs: Mapping[str, Job]) -> None:
    """The cycle's launches: one per new bin."""
    for b in bins:
        if b.request_id or not b.jobs:
            continue
        cycle.launches.append(Launch(b.offer.id, b.count, request_id(b.jobs, jobs, cycle.now),
                                     tuple(b.jobs)))


def waiting_reason(b: Bin, now: float) -> Reason:
    return Reason("Bursting", f"waiting for cloud instance {b.request_id} ({b.offer.id}), "
                              f"booting, ready in ~{dur(max(0.0, b.ready_at - now))}")
