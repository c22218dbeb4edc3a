"""Carbon waits decided before placement: the ``admit`` role's ``carbon-wait`` and the
``defer`` role's ``carbon-start``.

The ``carbon`` defer policy (policies/carbon/defer.py) decides after placement, from the zone of the
node a job was placed on. On a busy cluster that costs capacity: the job took GPUs in the
placement phase, its start is then dropped, and the jobs behind it never got those GPUs in
that cycle. A job that can run in one grid zone only (its ``sites`` allow on-prem sites of one
zone, which is what a class that may not burst gets) has its cleanest window known before it is
placed, so ``carbon-wait`` refuses it at admission while it waits (reason
``DeferredForCarbon``, with until when) and the GPUs go to the jobs behind it.

The window, from the forecast of that zone (``Snapshot.carbon_forecast``):

- a deferrable job (a deadline, or a ``flexible`` class: policies/carbon/defer.py ``deferrable``)
  that has not started yet;
- it runs without pausing (a pause on a busy cluster gives its GPUs away until it wins them
  back): the consecutive run with the lowest forecast emissions (policies/carbon/window.py);
- it must start by its deadline minus its predicted runtime, and within ``sla_share`` of its
  class SLA (default 0.5: half of the SLA is left as a margin for a full cluster at the
  planned start); with ``pause`` a job with a deadline plans its runs to end
  ``deadline_share`` of its class SLA before its deadline (default 0.5: a paused job wins
  its GPUs back only when the queue gives them);
- it waits only if that saves at least ``min_saving`` of the forecast emissions of running
  now (``carbon`` settings, shared with the defer policy) and, when the objective has a carbon
  price (policies/carbon/objective.py), if what it saves is worth more than
  ``wait_usd_per_gpu_hour``
  per GPU-hour waited.

A plan is kept per job while the forecast's horizon is the same (a later cycle sees the rest
of the same window, and the best rest of the best plan is the same plan), so each job's
window is computed about once per forecast refresh. ``carbon-start`` does the same for jobs
placed across zones (after placement, non-interruptible, no pausing) and writes the waits'
reasons.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.cycle.plan import Preempt
from broker.model import Job, PriorityClass, Reason
from broker.model.state import EvictionKind, JobState
from policies import reasons
from policies.carbon.defer import (
    Deferral,
    deferrable,
    done_s,
    plan,
    reason,
    smoothing_for,
    when,
    window,
    zone_of,
)
from policies.carbon.objective import Objective, expected_kg
from policies.carbon.place import waits_for_low_power
from policies.cycle import Cycle, deciding, wake
from policies.order.orderings import spillway
from policies.place.backfill import Easy
from policies.reasons import dur
from policies.registry import register

WAIT_DEFAULTS: dict[str, float] = {
    "clean_quantile": 0.33,  # spillway-carbon's order: clean while now is at or below this
    # quantile of the forecast over the next day
    "sla_share": 0.5,  # plan a start within this share of the class SLA
    "deadline_share": 0.5,  # with pause: plan to end this share of the class SLA before a
    # deadline (the margin a paused job keeps to win its GPUs back)
    "wait_usd_per_gpu_hour": 0.0,  # with a carbon price: what an hour of waiting costs
    "pause": 0.0,  # 1: a checkpointed job plans to pause through dirty peaks (with the
    # carbon defer role, which pauses running jobs, policies/carbon/defer.py)
    "low_power_factor": 1.5,  # > 0: a deferrable job with slack waits for GPUs of a model
    # whose energy for its work is within this factor of the least (0: off)
    "low_power_share": 0.125,  # ... until it first starts, for at most this share of its
    # class SLA after its submission
}
CODE = reasons.DEFERRED_FOR_CARBON


@dataclass
class _Waits:
    """A cycle's memo: why each job the admission refused waits (``carbon-start`` says it)."""

    reasons: dict[str, Reason] = field(default_factory=dict)


def _memo(cycle: Cycle) -> dict[tuple[str, int, str], tuple[float, Deferral | None]]:
    memo: dict[tuple[str, int, str], tuple[float, Deferral | None]] = cycle.memory.carbon_waits
    if len(memo) > 100_000:
        memo.clear()
    return memo


def job_zone(cycle: Cycle, job: Job) -> str:
    """The one grid zone ``job`` can run in before it is placed ("" when several or none):
    the zone of the on-prem sites its ``sites`` allow."""
    sites = job.spec.sites
    if any(s != "onprem" and not s.startswith("onprem") for s in sites):
        return ""  # it may go to a cloud: the zone depends on where
    zones = {s.carbon_zone for s in cycle.snap.sites if s.is_onprem}
    return zones.pop() if len(zones) == 1 else ""


def planned(cycle: Cycle, job: Job, zone: str) -> Deferral | None:
    """The cleanest way to run what is left of a deferrable job in ``zone`` (memoised while
    the forecast's horizon is the same and, once it started, its run has not ended); None
    when it has no choice, no forecast, or is not deferrable. A job with a deadline is planned
    for its time limit (the longest it may run), so that a job outrunning its prediction still
    ends in time."""
    snap = cycle.snap
    forecast = snap.carbon_forecast.get(zone)
    if not forecast or not deferrable(snap, job):
        return None
    w = cycle.settings("carbon-wait")
    pause = bool(w["pause"]) and bool(job.spec.checkpoint_dir)
    if job.attempts and not pause:
        return None  # it started: without pauses, nothing is left to decide
    key = (job.id, job.attempt, zone)
    memo = _memo(cycle)
    kept = memo.get(key)
    horizon = forecast[-1][0]
    if kept is not None and kept[0] == horizon and (
            kept[1] is None or not job.attempts or cycle.now < kept[1].runs[0][1]):
        return kept[1]  # (a job that started is planned again when its run ends)
    c = cycle.settings("carbon")
    work = cycle.estimate(job)
    if job.spec.deadline is not None and job.spec.time_limit:
        work = max(work, float(job.spec.time_limit))
    left = max(1.0, work - done_s(job, cycle.now))
    latest_end, start_by = window(snap, job, cycle.now, work, left)
    cls = snap.class_by_name.get(job.priority)
    if cls is not None and not job.attempts:
        start_by = min(start_by, job.submitted_at + float(w["sla_share"]) * cls.sla_s)
        if not pause:
            latest_end = min(latest_end, start_by + work)
    if pause and job.spec.deadline is not None and cls is not None:
        # A paused job gets its GPUs back only when the queue gives them: keep the margin
        # before its deadline that :func:`out_of_slack` keeps, so that it is out of slack (and
        # ahead of the jobs that may not preempt) by the end of its plan, with that margin left
        # to win GPUs. Planned to its deadline, a job whose last clean hours many others had
        # chosen too found the cluster full and ended late.
        latest_end = min(latest_end, job.spec.deadline - deadline_margin(cycle, cls))
    if pause:
        left, latest_end = within_forecast(cycle.now, left, latest_end, horizon)
    d = plan(forecast, cycle.now, left, latest_end, start_by, interruptible=pause,
             step=max(60.0, float(c["step_s"])),
             smooth=smoothing_for(float(c["forecast_error"])))
    memo[key] = (horizon, d)
    return d


def within_forecast(now: float, left_s: float, latest_end: float, known_end: float
                    ) -> tuple[float, float]:
    """(work, end) of a pausing plan cut to the forecast: a window that reaches past the
    forecast's last step (``known_end``) is planned over the known hours only, for the same
    share of them as of the whole window (``left_s`` of ``latest_end - now``). Past the
    forecast every hour would look alike (the last step's value), so planning the whole
    window would pause in the known hours by how they compare with that one value; a job
    that runs its share of every forecast keeps the pace that ends it by ``latest_end``,
    and each refresh plans the next share (a share of 1 or more: no choice, it runs)."""
    if latest_end <= known_end or known_end <= now:
        return left_s, latest_end
    share = min(1.0, left_s / (latest_end - now))
    return share * (known_end - now), known_end


def decide(cycle: Cycle, job: Job, zone: str) -> Deferral | None:
    """The plan of a deferrable job that waits now (see :func:`planned`), or None."""
    d = planned(cycle, job, zone)
    if d is None or d.start_at <= cycle.now or not _worth_it(cycle, job, d):
        return None
    return d


def _worth_it(cycle: Cycle, job: Job, d: Deferral) -> bool:
    c = cycle.settings("carbon")
    if not (d.waits and d.saving >= float(c["min_saving"])
            and d.start_at - d.now >= float(c["min_pause_s"])):
        return False
    obj = Objective.of(cycle.settings("objective"))
    price = float(cycle.settings("carbon-wait")["wait_usd_per_gpu_hour"])
    if not obj.carbon_usd_per_tonne or not price:
        return True
    gpus = job.res.total_gpus
    model = next((n.gpus[0].model for n in cycle.snap.nodes if n.gpus), "")
    work = sum(b - a for a, b in d.runs)
    kg = expected_kg(gpus, model, "onprem", d.now_g - d.planned_g, work)
    return obj.carbon_usd_per_tonne * kg / 1000.0 >= price * gpus * (d.start_at - d.now) / 3600


@register("admit", "carbon-wait", settings={**WAIT_DEFAULTS})
def carbon_wait(cycle: Cycle, job: Job) -> str | None:
    """Refuse (for now) a deferrable job whose cleanest window in its one zone is later."""
    if not cycle.snap.carbon_forecast:
        return None
    zone = job_zone(cycle, job)
    d = decide(cycle, job, zone) if zone else None
    if d is None:
        return _low_power_wait(cycle, job) if zone else None
    cycle.memo(_Waits).reasons[job.id] = reason(d, zone, job.spec.deadline)
    wake(cycle, d.start_at)
    return CODE


def _low_power_wait(cycle: Cycle, job: Job) -> str | None:
    """With ``low_power_factor``: a deferrable job with slack left (not
    :func:`out_of_slack`, and within ``low_power_share`` of its SLA) that only higher-power
    GPUs have room for now waits for the low-power ones (policies/carbon/place.py
    ``waits_for_low_power``): the same hours on a V100 take a third of an H100's energy,
    more than the cleanest hour of the day saves against the dirtiest, and the H100 goes to
    the job behind it."""
    factor = float(cycle.settings("carbon-wait")["low_power_factor"])
    if factor <= 0 or not deferrable(cycle.snap, job):
        return None
    until = _low_power_until(cycle, job)  # (never later than the job's slack runs out)
    if not math.isfinite(until) or until <= cycle.now:  # (started, no deadline: no bound)
        return None
    low = waits_for_low_power(cycle.index, job, factor)
    if low is None:
        return None
    models = ", ".join(sorted({k[0] for k in low}))
    cycle.memo(_Waits).reasons[job.id] = Reason(
        CODE, f"waiting for lower-power GPUs ({models}) to free up, at most until "
              f"{when(until, cycle.now)}; the GPUs free now need more than {factor:g}x "
              f"the energy for its work")
    wake(cycle, until)
    return CODE


def _low_power_until(cycle: Cycle, job: Job) -> float:
    """How long a deferrable job may wait for low-power GPUs: until it runs out of slack
    (:func:`out_of_slack`) and, before its first start, ``low_power_share`` of its class SLA
    after its submission (inf: no bound)."""
    cls = cycle.snap.class_by_name.get(job.priority)
    if cls is None:
        return math.inf
    t = _deadline_start(cycle, job) - deadline_margin(cycle, cls)
    if not job.attempts:
        w = cycle.settings("carbon-wait")
        share = min(float(w["sla_share"]), float(w["low_power_share"]))
        t = min(t, job.submitted_at + share * cls.sla_s)
    return t


@register("defer", "carbon-start")
def carbon_start(cycle: Cycle) -> None:
    """The waits' reasons; and deferrable jobs placed this cycle (in a zone known only once
    placed) wait for their cleanest non-stop run there."""
    for job_id, why in cycle.memo(_Waits).reasons.items():
        cycle.pending[job_id] = why
    if not cycle.snap.carbon_forecast:
        return
    if cycle.settings("carbon-wait")["pause"]:
        _pause_running(cycle)
    by_id = {job.id: job for job, _ in cycle.started}
    keep: list[Any] = []
    for start, started in zip(cycle.starts, cycle.started):
        job = by_id[start.job_id]
        with deciding(cycle, job):
            zone = zone_of(cycle.snap, start.allocations[0].node_id) if start.allocations else ""
            d = decide(cycle, job, zone) if zone else None
            if d is None:
                keep.append((start, started))
                continue
            cycle.pending[job.id] = reason(d, zone, job.spec.deadline)
            wake(cycle, d.start_at)
    if len(keep) != len(cycle.starts):
        cycle.starts[:] = [s for s, _ in keep]
        cycle.started[:] = [j for _, j in keep]


def _pause_running(cycle: Cycle) -> None:
    """With ``pause``: a running checkpointed deferrable job whose plan pauses now is stopped
    (eviction kind ``carbon``; it checkpoints and waits, ``DeferredForCarbon``, for its next
    run); one that runs now and pauses later wakes the cycle at the end of its run."""
    leaving = {p.job_id for p in cycle.evictions}
    for job in cycle.snap.active:
        if (job.state is not JobState.RUNNING or not job.spec.checkpoint_dir
                or job.id in leaving or not job.allocations):
            continue
        zone = zone_of(cycle.snap, job.allocations[0].node_id)
        d = planned(cycle, job, zone) if zone else None
        if d is None:
            continue
        if d.start_at > cycle.now and _worth_it(cycle, job, d):
            cycle.evictions.append(Preempt(
                job.id, job.attempt, f"pausing for cleaner power in {zone} for "
                f"{dur(d.start_at - cycle.now)}", cycle.snap.grace_s, EvictionKind.CARBON))
            wake(cycle, d.start_at)
        elif d.start_at <= cycle.now:
            wake(cycle, d.runs[0][1])


def clean_now(cycle: Cycle, zone: str) -> bool | None:
    """Is ``zone``'s intensity now at or below the ``clean_quantile`` of its forecast over the
    next day? None without a forecast."""
    steps = cycle.snap.carbon_forecast.get(zone)
    if not steps:
        return None
    horizon = cycle.now + 86400.0
    ahead = sorted(g for t, g in steps if t < horizon)
    q = float(cycle.settings("carbon-wait")["clean_quantile"])
    return steps[0][1] <= ahead[min(len(ahead) - 1, int(q * len(ahead)))]


@register("order", "spillway-carbon")
def spillway_carbon(cycle: Cycle, jobs: Sequence[Job]) -> list[Job]:
    """Spillway's order (policies/order/orderings.py), then, among the jobs of the classes that may
    not preempt: while the grid of the on-prem sites is clean (:func:`clean_now`), deferrable
    jobs first; while it is dirty, after the others. Deferrable work takes the clean hours
    and leaves the dirty ones to the work that cannot wait (the urgent classes keep their
    place ahead of both). The job holding the reservation keeps its place first among the
    others, as in spillway's order (moving it back would waste its drain), then come the
    deferrable jobs out of slack (:func:`out_of_slack`), clean or dirty, the one that must
    start soonest first (:func:`must_start_by`: carbon waits bring many jobs to the end of
    their slack together, and in spillway's order a wide one among them was passed by
    narrower ones for days)."""
    ordered = spillway(cycle, jobs)
    zones = {s.carbon_zone for s in cycle.snap.sites if s.is_onprem} - {""}
    clean = clean_now(cycle, zones.pop()) if len(zones) == 1 else None
    if clean is None:
        return ordered
    urgent = {c.name for c in cycle.snap.classes if c.may_preempt}
    snap = cycle.snap
    head = [j for j in ordered if j.priority in urgent]
    rest = [j for j in ordered if j.priority not in urgent]
    holder = snap.reservation.job_id if snap.reservation else None
    keep = [j for j in rest if j.id == holder]  # its drain is never wasted (as in spillway)
    late = sorted((j for j in rest
                   if j.id != holder and deferrable(snap, j) and out_of_slack(cycle, j)),
                  key=lambda j: must_start_by(cycle, j))
    gone = {j.id for j in keep + late}
    flex = [j for j in rest if deferrable(snap, j) and j.id not in gone]
    other = [j for j in rest if not deferrable(snap, j) and j.id not in gone]
    return head + keep + late + (flex + other if clean else other + flex)


def deadline_margin(cycle: Cycle, cls: PriorityClass) -> float:
    """The margin a deferrable job of ``cls`` keeps before its deadline for a full cluster:
    ``deadline_share`` of its class SLA."""
    return float(cycle.settings("carbon-wait")["deadline_share"]) * cls.sla_s


def must_start_by(cycle: Cycle, job: Job) -> float:
    """The latest time a deferrable job may start (or resume) and keep its promises: its
    deadline less what is left of its time limit, and, until it first starts, its submission
    plus its class SLA (inf: neither)."""
    cls = cycle.snap.class_by_name.get(job.priority)
    latest = _deadline_start(cycle, job)
    if not job.attempts and cls is not None:
        latest = min(latest, job.submitted_at + cls.sla_s)
    return latest


def _deadline_start(cycle: Cycle, job: Job) -> float:
    """The job's deadline less what is left of its time limit (inf: no deadline)."""
    if job.spec.deadline is None:
        return math.inf
    limit = float(job.spec.time_limit or cycle.estimate(job))
    return job.spec.deadline - max(0.0, limit - done_s(job, cycle.now))


def out_of_slack(cycle: Cycle, job: Job) -> bool:
    """May a deferrable job wait no longer? Not started yet and waited ``sla_share`` of its
    class SLA (the latest start a carbon wait plans), or, with a deadline, less slack left
    (deadline - now - what is left of its time limit) than ``deadline_share`` of its class
    SLA (the margin a pausing plan keeps: it is out of slack by the end of its plan).
    Such a job goes ahead of the other jobs that may not preempt, clean hours or dirty: one
    that waited for a window, or paused, and found the GPUs taken would otherwise lose its
    SLA or its deadline behind them (the reservation of the queue's head then holds GPUs for
    it, as for any head)."""
    cls = cycle.snap.class_by_name.get(job.priority)
    if cls is None:
        return False
    margin = float(cycle.settings("carbon-wait")["sla_share"]) * cls.sla_s
    if not job.attempts and cycle.now - job.submitted_at >= margin:
        return True
    return _deadline_start(cycle, job) - cycle.now < deadline_margin(cycle, cls)


@register("reserve", "easy-deadline", settings={"max_guards": 8})
class EasyDeadline(Easy):
    """EASY backfill (policies/place/backfill.py), and a reservation of its own (a guard) for each
    deferrable job out of slack (:func:`out_of_slack`) that is blocked behind the head, up to
    ``max_guards`` (8) per cycle, soonest due first (the order ``spillway-carbon`` puts them
    in). A later job that would outlive a guard's start may not take the GPUs that guard
    needs: EASY protects only the head, and jobs out of slack second to fourth in line lost
    their deadline while narrower jobs behind them took each GPU that came free (a 4-GPU job
    of one hour waited 38 hours behind a 16-GPU holder that took 19 to start)."""

    protecting = True

    def protects(self, cycle: Cycle, job: Job) -> bool:
        return deferrable(cycle.snap, job) and out_of_slack(cycle, job)

    def max_guards(self, cycle: Cycle) -> int:
        return int(cycle.settings("easy-deadline")["max_guards"])
