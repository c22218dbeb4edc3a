"""Burst when the SLA would break, to the offer that finishes the job cheapest (``sla``).

Phase 5 of the cycle. For each job left pending, in queue order, whose class may burst and
whose ``sites`` allow a cloud:

1. A job that an instance still booting was launched for (by an earlier cycle) waits for it,
   and so does a one-node job that fits the room its own jobs leave there: never two
   launches for one job. The jobs ahead of it do not count on its machine: once up, the
   queue starts the jobs it was launched for there first (policies/place/queue.py).
2. Its SLA target is its submission (or its return to the queue) plus its class's SLA. Its
   *decision time* is the target minus the slowest boot of the offers that could hold it minus
   ``margin_s``: until then it waits (``wake_at`` asks for a cycle then), since on-prem may
   yet free up and a later decision knows more; but if spot is available now and the
   (optimistic) forecast already breaks its SLA, it takes spot now (``early_spot``): at the
   decision time only on-demand, about three times the price, may be left. With
   ``spot_failover`` (off: it kept more work in the cloud and cost more over 14 days), a job
   a spot interruption sent back takes spot again at once where there is some.
3. At its decision time, its on-prem start is forecast (policies/burst/forecast.py). If that meets
   the target with the fastest boot to spare (``stay_needs_boot``; 0: just meets it), it
   stays: a forecast with less to spare has no room for a job ahead that runs over its
   expected end, and no later cycle could burst it in time. If on-prem starts it sooner than
   a boot, it stays (``BurstNotWorthIt``). If the target can no longer be met even by the
   cloud, bursting buys only time: it bursts if the cloud starts it at least
   ``late_min_gain_s`` sooner (to spot only with ``lost_sla_spot_only``, off until measured).
4. Otherwise the offer with the lowest expected cost to finish it (policies/burst/choice.py;
   the costs are policies/burst/offers.py's: price x runtime on that GPU model, plus for spot
   the expected interruptions x work lost, restart and boot), within its
   ``max_price_per_hour`` (``OverMaxPrice``) and its region's quota, whose boot fits the
   target. Jobs bursting in one cycle share an instance when joining one costs less than a
   new one (the marginal hours it keeps the instance up). If bursting jobs ahead of it
   instead (cheapest per GPU first, ``make_room_max_jobs`` at most) costs less
   and lets on-prem start it in time, those burst and it stays.
5. Preempt or burst (a class that may preempt, with evictions planned for it this cycle):
   ``preempt_or_burst`` 0 keeps the preemption; 1 bursts instead when the cloud costs less
   than the work the victims lose (``onprem_gpu_hour_usd`` per GPU-hour lost) and drops those
   evictions; 2 always bursts instead.
6. A job with a ``deadline``: spot, on-demand or wait as the deadline rule says
   (policies/burst/spot_deadline.py through policies/burst/deadline.py, fed the spot zones'
   markets from the snapshot), and one
   running on on-demand leaves it (checkpointed) when the rule goes back to spot or waits.

On a cluster without offers and without instances it returns at once: the plans of on-prem
clusters are unchanged. Reasons: ``Bursting``, ``BurstNotWorthIt``, ``OverMaxPrice``,
``NoOffer``, ``ClassMayNotBurst``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from broker.model import Job, Offer, PriorityClass, Reason
from broker.model.state import EvictionKind, JobState
from policies.burst import deadline as deadline_burst
from policies.burst import outlook
from policies.burst.choice import Choice, book, cheapest, may_take_spot, offers_for
from policies.burst.evictions import drop_evictions_for, victims_cost
from policies.burst.forecast import QueueForecast, made_room_for, onprem_start, onprem_starts
from policies.burst.home import HOME_DEFAULTS, home_moves
from policies.burst.offers import (
    CostModel,
    Phase,
    booting_bins,
    emit,
    may_burst,
    region_room,
    take_booting,
    waiting_reason,
)
from policies.burst.spot_move import MOVE_DEFAULTS, moving_bins, spot_moves
from policies.cycle import Cycle, wake
from policies.reasons import dur
from policies.registry import register

SLA_DEFAULTS: dict[str, float] = {
    "margin_s": 300.0,  # decide this much before the last moment a boot still fits
    "late_min_gain_s": 3600.0,  # SLA lost anyway: burst only if the cloud is this much sooner
    "preempt_or_burst": 0.0,  # 0 prefer preemption, 1 the cheaper, 2 prefer bursting
    "onprem_gpu_hour_usd": 2.0,  # the value of an on-prem GPU-hour of work a victim loses
    "make_room_max_jobs": 16.0,  # jobs ahead that may burst to make room for one
    "lost_sla_spot_only": 0.0,  # 1: a job whose SLA is lost bursts to spot only
    "early_spot": 1.0,  # 1: spot before the decision time for a job forecast to breach
    "spot_failover": 0.0,  # 1: a job a spot interruption sent back takes spot again at once
    "stay_needs_boot": 1.0,  # 1: stay on-prem only with the fastest boot to spare
    **MOVE_DEFAULTS,  # jobs on on-demand move to spot when it pays (burst_spot_move.py)
    **HOME_DEFAULTS,  # jobs on rented machines come home to idle on-prem GPUs (burst_home.py)
    **{k: float(v) for k, v in CostModel().__dict__.items()},
}


@dataclass
class _Kept:
    """A cycle's memo of the burst phase: the on-prem starts forecast for the early spot
    decision, and the queue's forecast."""

    early_starts: dict[str, float] | None = None
    forecast: QueueForecast | None = None


def target_of(job: Job, cls: PriorityClass) -> float:
    """When the job must start to meet its SLA: its submission (or its latest return to the
    queue) plus the SLA."""
    back = job.submitted_at
    if job.attempt > 1:
        back = next((h.time for h in reversed(job.history) if h.state is JobState.PENDING),
                    job.submitted_at)
    return back + cls.sla_s


@register("burst", "sla", settings=SLA_DEFAULTS)
def sla_burst(cycle: Cycle) -> None:
    """The policy of the module docstring."""
    snap = cycle.snap
    if not snap.offers and not snap.instances:
        return
    cfg = cycle.settings("sla")
    costs = CostModel.of(cfg)
    deadline_burst.revisit(cycle, costs)  # jobs with a deadline on on-demand: stay or leave
    booting = booting_bins(cycle, costs.boot_s)
    p = Phase(cycle, cfg, costs, region_room(cycle))
    booting = moving_bins(cycle, booting)  # (kept for the jobs moving to spot)
    jobs = {j.id: j for j in cycle.blocked}
    room_for, prefer = made_room_for(cycle), float(cfg["preempt_or_burst"])
    for pos, job in enumerate(cycle.blocked):
        try:  # (a job it fails on is set aside: policies/cycle.py deciding)
            cls = may_burst(cycle, job)
            if cls is None:
                if _breaks(cycle, job) or outlook.cloud_only(job):
                    cycle.pending[job.id] = outlook.not_allowed(cycle, job)
                continue
            if job.id in room_for and not prefer:
                continue  # evictions make room for it on-prem (preempt_or_burst 0)
            b = take_booting(booting, job, cls)
            if b is not None:
                p.leaving.add(job.id)
                cycle.pending[job.id] = waiting_reason(b, cycle.now)
                continue
            if _decide(p, job, cls, pos):
                p.leaving.add(job.id)
        except Exception as e:
            if not cycle.fail(job, e):
                raise
    spot_moves(p)
    home_moves(p)
    drop_evictions_for(cycle, p.leaving)
    emit(cycle, p.new, jobs)


def _breaks(cycle: Cycle, job: Job) -> bool:
    cls = cycle.snap.class_by_name.get(job.priority)
    return cls is not None and cycle.now > target_of(job, cls)


def _decide(p: Phase, job: Job, cls: PriorityClass, pos: int) -> bool:
    """Burst ``job`` now (True: a bin in ``p.new`` holds it), or leave it with a reason."""
    cycle, cfg, costs = p.cycle, p.cfg, p.costs
    now = cycle.now
    offers = offers_for(cycle, job, cls)
    if not offers:
        if _breaks(cycle, job):
            cycle.pending[job.id] = Reason("NoOffer", "its SLA is broken and no cloud offer "
                                                      "available now could hold it")
        return False
    target = target_of(job, cls)
    slowest = max(costs.boot(o) for o in offers)
    decide_at = target - slowest - float(cfg["margin_s"])
    if now < decide_at:
        early = _early_spot(p, job, cls, offers, pos, target)
        if early is None:
            wake(cycle, decide_at)
            outlook.tell(p, job, offers, decide_at, target,
                         lambda: _offer(cheapest(p, job, cls, offers, target)),
                         lambda: _forecast(cycle).start(pos, p.leaving))
            return False
        book(p, job, early[0], early[1], early=True)
        return True
    start = _forecast(cycle).start(pos, p.leaving)
    fastest = min(costs.boot(o) for o in offers)
    spare = fastest if cfg["stay_needs_boot"] else 0.0
    if start <= target - spare and job.id not in made_room_for(cycle):
        return False  # on-prem meets its SLA (with a boot to spare)
    evict_cost = victims_cost(cycle, job, cfg) if job.id in made_room_for(cycle) else None
    if evict_cost is not None and float(cfg["preempt_or_burst"]) == 0.0:
        return False
    if start <= now + fastest:
        cycle.pending[job.id] = Reason(
            "BurstNotWorthIt", f"on-prem is expected to start it in ~{dur(start - now)}, "
            f"sooner than a cloud machine boots (~{dur(fastest)})")
        return False
    lost = now + fastest > target
    if lost and start - (now + fastest) < float(cfg["late_min_gain_s"]):
        cycle.pending[job.id] = Reason(
            "BurstNotWorthIt", f"its SLA cannot be met any more; the cloud would start it "
            f"only ~{dur(start - now - fastest)} sooner than on-prem")
        return False
    if lost and cfg["lost_sla_spot_only"]:
        offers = [o for o in offers if o.market.value == "spot"]
        if not offers:  # its SLA is lost: on-demand would buy only time, at on-demand prices
            cycle.pending[job.id] = Reason(
                "BurstNotWorthIt", "its SLA cannot be met any more, and no spot offer is "
                "available now (on-demand would buy only time)")
            return False
    choice = cheapest(p, job, cls, offers, target, p.new)
    if not isinstance(choice, Choice):
        if choice is not None:
            cycle.pending[job.id] = choice  # (why it has no offer)
        return False
    if evict_cost is not None and float(cfg["preempt_or_burst"]) == 1.0 \
            and choice.cost >= evict_cost:
        return False  # preempting costs the victims less than the cloud would
    if evict_cost is None and _make_room(p, job, pos, target - spare, choice.cost):
        return False  # cheaper jobs ahead of it burst instead; it starts on-prem in time
    book(p, job, choice, start)
    return True


def _early_spot(p: Phase, job: Job, cls: PriorityClass, offers: list[Offer], pos: int,
                target: float) -> tuple[Choice, float] | None:
    """Spot now, before the decision time, for a job that on-prem is forecast to leave past
    its SLA: spot comes and goes, and at the decision time only on-demand (about three times
    the price) may be left. The forecast is optimistic (it pools GPUs and ignores later
    arrivals), so a breach it foresees is likely. None: wait for the decision time (the job
    is told nothing here)."""
    cycle, cfg = p.cycle, p.cfg
    if not cfg["early_spot"] or job.id in made_room_for(cycle):
        return None
    spot = [o for o in offers if o.market.value == "spot"]
    if not spot or not may_take_spot(cycle, job, p.costs):
        return None
    start = math.inf
    if not (cfg["spot_failover"] and _spot_interrupted(job)):
        memo = cycle.memo(_Kept)
        starts = memo.early_starts
        if starts is None:
            starts = memo.early_starts = onprem_starts(cycle, cycle.blocked)
        if starts.get(job.id, math.inf) <= target:
            return None
        start = _forecast(cycle).start(pos, p.leaving)
        if start <= target:
            return None
    choice = cheapest(p, job, cls, spot, target, p.new)
    if not isinstance(choice, Choice) or choice.offer.market.value != "spot":
        return None
    return choice, start


def _offer(c: Choice | Reason | None) -> Offer | Reason | None:
    return c.offer if isinstance(c, Choice) else c


def _forecast(cycle: Cycle) -> QueueForecast:
    """The on-prem forecasts of the queue's jobs with the jobs leaving it skipped, in one
    sweep per cycle (policies/burst/forecast.py)."""
    memo = cycle.memo(_Kept)
    if memo.forecast is None:
        memo.forecast = QueueForecast(cycle, cycle.blocked)
    return memo.forecast


def _spot_interrupted(job: Job) -> bool:
    """Was the job's last stop a spot interruption (it was running in the cloud)?"""
    stop = next((h for h in reversed(job.history) if h.state is JobState.STOPPING), None)
    return stop is not None and stop.kind is EvictionKind.SPOT


def _make_room(p: Phase, job: Job, pos: int, target: float, own_cost: float) -> bool:
    """Burst jobs ahead of ``job`` instead, cheapest per GPU first, if that costs less than
    bursting ``job`` and lets on-prem start it by ``target`` (its SLA less the boot to spare of
    ``stay_needs_boot``): a long job at the back of the queue costs more in the cloud than the
    short ones ahead of it."""
    cycle = p.cycle
    ahead = cycle.blocked[:pos]
    limit = int(p.cfg["make_room_max_jobs"])
    cands: list[tuple[float, Job, Choice]] = []
    for a in ahead:
        try:  # (zero cost when nothing raises: this loop is long)
            if a.id in p.leaving:
                continue
            acls = may_burst(cycle, a)
            if acls is None or a.res.nodes > 1:
                continue
            offers = offers_for(cycle, a, acls)
            if not offers:
                continue
            kept = cycle.pending.get(a.id)
            c = cheapest(p, a, acls, offers, target_of(a, acls))
            if kept is not None:  # (the deadline rule, asked the first time, may tell it to
                cycle.pending[a.id] = kept  # wait: not what this job is told here)
            elif isinstance(c, Reason):
                cycle.pending[a.id] = c  # (a job told nothing yet is told why it has no offer)
            if isinstance(c, Choice):
                cands.append((c.cost / max(1, a.res.total_gpus), a, c))
        except Exception as e:  # (a job it fails on is set aside, as with deciding)
            if not cycle.fail(a, e):
                raise
    cands.sort(key=lambda x: (x[0], x[1].id))
    trial, total, chosen = set(p.leaving), 0.0, []
    for _, a, c in cands[:limit]:
        total += c.cost
        if total >= own_cost:
            return False
        trial.add(a.id)
        chosen.append((a, c))
        if onprem_start(cycle, job, ahead, trial) <= target:
            for b, bc in chosen:
                book(p, b, bc, math.inf, made_room_for=job.id)
                p.leaving.add(b.id)
            return True
    return False


