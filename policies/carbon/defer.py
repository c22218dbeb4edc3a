"""The ``defer`` role's ``carbon`` policy: hold deferrable work for a cleaner window.

Carbon-aware temporal shifting after "Let's Wait Awhile" (Wiesner et al., Middleware'21).

**Deferrable work**: a job with a deadline (``JobSpec.deadline``), or any job of a class marked
``flexible``. **Interruptible**: it has a checkpoint directory, so it may pause and resume.

**The decision** (:func:`plan`), from the forecast of the grid zone the job was placed in:

- the window runs from now to the job's deadline (no deadline: to the latest time it may
  start, its submission plus its class SLA, plus its predicted runtime);
- it must start no later than its deadline minus its predicted runtime, and no later than its
  submission plus its class SLA (never past either);
- a job that cannot stop runs in the consecutive stretch with the lowest forecast emissions;
  an interruptible one in the cleanest slots of the window, pausing through the dirty peaks
  between them (:mod:`policies.carbon.window`);
- if that stretch (or its first slot) is not now, and it saves at least ``min_saving`` of the
  forecast emissions of running now, the job waits: the cycle drops its start, its reason is
  ``DeferredForCarbon`` with the time it will start, and the cycle's ``wake_at`` is that time;
- a running checkpointed job whose plan pauses now is stopped (eviction kind ``carbon``: it
  checkpoints and comes back pending, then waits as above); one that runs now and pauses later
  sets ``wake_at`` to the end of its run. Work done counts from its attempts' run times.

A job whose deadline cannot be met even now, whose zone has no forecast, or that is neither
deadline-bound nor flexible, starts as the earlier phases decided. The decision is the same on
every cycle while the forecast is the same (a later cycle sees the rest of the same window, and
the best rest of a best plan is the same plan), so it never flip-flops.

Settings (``policy_settings: {carbon: {...}}``): ``step_s`` the slot length (1800: the
half-hour steps of the grids' data), ``min_saving`` the share of forecast emissions a wait must
save (0: any saving), ``min_pause_s`` the shortest wait or pause worth it (0; raise it to
cover a checkpoint and a restart), ``forecast_error`` the relative error of the forecasts the
snapshot carries (0: taken as exact; above 0: slots are ranked on a 3-slot average, see
:func:`plan`).
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from broker.cycle.plan import Preempt, Snapshot
from broker.model import Job, Reason
from broker.model.state import EvictionKind, JobState
from policies import reasons
from policies.carbon.window import (
    Steps,
    cleanest_slots,
    cleanest_start,
    runs_of,
    slot_means,
    slots_for,
    smoothed,
)
from policies.cycle import Cycle, deciding, wake
from policies.registry import register

CODE = reasons.DEFERRED_FOR_CARBON
CARBON_DEFAULTS = {"step_s": 1800.0, "min_saving": 0.0, "min_pause_s": 0.0,
                   "forecast_error": 0.0}


def smoothing_for(forecast_error: float) -> int:
    """How many slots to average the forecast over to rank them: 3 when the forecast is
    known to be uncertain (its relative error is above 0), else 1 (take it as it is)."""
    return 3 if forecast_error > 0 else 1


@dataclass(frozen=True)
class Deferral:
    """What :func:`plan` decided for one job.

    ``runs``: the planned run intervals ``(start, end)`` in seconds, in order (one for a job
    that cannot stop); ``start_at`` the first one's start; ``planned_g`` the forecast's mean
    intensity over them and ``now_g`` over the same work run from now (gCO2e/kWh)."""

    runs: tuple[tuple[float, float], ...]
    planned_g: float
    now_g: float
    now: float

    @property
    def start_at(self) -> float:
        return self.runs[0][0]

    @property
    def waits(self) -> bool:
        return self.start_at > self.now

    @property
    def saving(self) -> float:
        """The share of forecast emissions the plan saves against running now."""
        return 1.0 - self.planned_g / self.now_g if self.now_g > 0 else 0.0


def plan(forecast: Steps, now: float, work_s: float, latest_end: float, start_by: float,
         interruptible: bool, step: float = 1800.0, smooth: int = 1) -> Deferral | None:
    """The cleanest way to run ``work_s`` seconds of work from ``now``, ending by
    ``latest_end`` and starting by ``start_by``; None when there is no choice (the work does
    not fit in the window, or it must start now).

    Slots are ranked on the forecast averaged over ``smooth`` slots centred on each (1: as
    is): grid intensity moves smoothly while a forecast's errors jump from step to step, so
    the average ranks slots by what they will be rather than by their error (on "Let's Wait
    Awhile"'s 5% white-noise forecasts it recovers most of what the noise costs; on a perfect
    forecast it would cost up to 0.16 points, so it is for uncertain forecasts only)."""
    if not (math.isfinite(work_s) and work_s > 0 and step > 0):
        return None
    slots = math.floor((latest_end - now) / step + 1e-9)
    k = slots_for(work_s, step)
    by = (start_by - now) / step + 1e-9
    if by < 0:  # (also an unknown work's -inf: it must have started already)
        return None
    last_start = min(slots - k, math.floor(min(by, slots)))
    if slots < k or last_start < 0:
        return None  # it cannot finish in time even now: run as soon as possible
    if last_start == 0 and (not interruptible or slots == k):
        return None  # it must run now, without a pause
    if not interruptible:
        slots = last_start + k  # (no need to look further than its last start allows)
    pad = max(0, smooth // 2)
    wide = slot_means(forecast, now - pad * step, slots + 2 * pad, step)
    means = wide[pad:pad + slots]
    ranked = smoothed(wide, pad)[pad:pad + slots] if pad else means
    now_g = math.fsum(means[:k]) / k
    if interruptible:
        chosen = cleanest_slots(ranked, k, last_start)
        runs = runs_of(chosen)
    else:
        first, _ = cleanest_start(ranked, k, last_start)
        runs = [(first, first + k)]
    total = math.fsum(g for a, b in runs for g in means[a:b])
    return Deferral(tuple((now + a * step, now + b * step) for a, b in runs), total / k, now_g,
                    now)


def deferrable(snap: Snapshot, job: Job) -> bool:
    """A job with a deadline, or in a class marked flexible."""
    if job.spec.deadline is not None:
        return True
    cls = snap.class_by_name.get(job.priority)
    return cls is not None and cls.flexible


def done_s(job: Job, now: float) -> float:
    """Seconds the job has run so far, over all its attempts (a checkpointed job resumes)."""
    return sum((now if a.ended_at is None else a.ended_at) - a.started_at
               for a in job.attempts if a.started_at <= now)


def window(snap: Snapshot, job: Job, now: float, work_s: float, left_s: float
           ) -> tuple[float, float]:
    """(latest end, latest start) of a deferrable job with ``left_s`` of its ``work_s`` to
    go: its deadline, and (until it first starts) its class SLA."""
    cls = snap.class_by_name.get(job.priority)
    sla_start = job.submitted_at + cls.sla_s if cls is not None else now
    deadline = job.spec.deadline
    latest_end = sla_start + work_s if deadline is None else deadline
    if job.attempts:  # it started once: the SLA is met, only the end bounds it
        return latest_end, latest_end - left_s
    return latest_end, min(sla_start, latest_end - left_s)


def zone_of(snap: Snapshot, node_id: str) -> str:
    """The carbon zone of the site a node belongs to ("" when the site has none)."""
    node = snap.node_by_id.get(node_id)
    if node is None:
        return ""
    for site in snap.sites:
        if str(site) == node.site:
            return site.carbon_zone
    return ""


def when(t: float, now: float) -> str:
    stamp = dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    hours = (t - now) / 3600
    return f"{stamp} (in {hours:.1f}h)"


def reason(d: Deferral, zone: str, deadline: float | None) -> Reason:
    """``DeferredForCarbon``, until when, and what it saves."""
    paused = f", in {len(d.runs)} parts" if len(d.runs) > 1 else ""
    bound = f"; deadline {when(deadline, d.now)}" if deadline is not None else ""
    return Reason(CODE, f"waiting for cleaner power in {zone} until {when(d.start_at, d.now)}"
                        f"{paused}: forecast {d.planned_g:.0f} gCO2e/kWh over its run against "
                        f"{d.now_g:.0f} now ({100 * d.saving:.1f}% less){bound}")


def decide(cycle: Cycle, job: Job, node_id: str) -> tuple[Deferral, str] | None:
    """The plan of a deferrable job on ``node_id`` (placed this cycle, or running there),
    with its zone; None when it has no choice or no forecast."""
    snap = cycle.snap
    if not deferrable(snap, job):
        return None
    zone = zone_of(snap, node_id)
    forecast = snap.carbon_forecast.get(zone) if zone else None
    if not forecast:
        return None
    settings = cycle.settings("carbon")
    step = max(60.0, float(settings["step_s"]))
    work = cycle.estimate(job)
    left = max(1.0, work - done_s(job, cycle.now))
    latest_end, start_by = window(snap, job, cycle.now, work, left)
    d = plan(forecast, cycle.now, left, latest_end, start_by,
             interruptible=bool(job.spec.checkpoint_dir), step=step,
             smooth=smoothing_for(float(settings["forecast_error"])))
    return None if d is None else (d, zone)


def _worth_it(cycle: Cycle, d: Deferral) -> bool:
    settings = cycle.settings("carbon")
    return (d.waits and d.saving >= float(settings["min_saving"])
            and d.start_at - d.now >= float(settings["min_pause_s"]))


@register("defer", "carbon", settings=CARBON_DEFAULTS)
def carbon_defer(cycle: Cycle) -> None:
    """Drop the starts of deferrable jobs that a cleaner window within their deadline awaits;
    they stay pending with ``DeferredForCarbon`` and the cycle wakes when the first is due."""
    if not cycle.snap.carbon_forecast:
        return
    by_id = {job.id: job for job, _ in cycle.started}
    keep = []
    for start, started in zip(cycle.starts, cycle.started):
        job = by_id[start.job_id]
        with deciding(cycle, job):
            found = decide(cycle, job, start.allocations[0].node_id) if start.allocations else None
            if found is None or not _worth_it(cycle, found[0]):
                keep.append((start, started))
                if found is not None:
                    _wake_to_pause(cycle, found[0])
                continue
            d, zone = found
            cycle.pending[job.id] = reason(d, zone, job.spec.deadline)
            wake(cycle, d.start_at)
    if len(keep) != len(cycle.starts):
        cycle.starts[:] = [s for s, _ in keep]
        cycle.started[:] = [j for _, j in keep]
    _pause_running(cycle)


def _wake_to_pause(cycle: Cycle, d: Deferral) -> None:
    """A job that runs now but will pause later: wake the cycle when its run ends."""
    if len(d.runs) > 1:
        wake(cycle, d.runs[0][1])


def _pause_running(cycle: Cycle) -> None:
    """Checkpointed deferrable jobs whose plan pauses now through a dirty peak are stopped
    (they checkpoint and come back pending, ``DeferredForCarbon`` until their next run)."""
    leaving = {p.job_id for p in cycle.evictions}
    for job in cycle.snap.active:
        if (job.state is not JobState.RUNNING or not job.spec.checkpoint_dir
                or job.id in leaving or not job.allocations):
            continue
        found = decide(cycle, job, job.allocations[0].node_id)
        if found is None:
            continue
        d, zone = found
        if not _worth_it(cycle, d):
            _wake_to_pause(cycle, d)
            continue
        cycle.evictions.append(Preempt(
            job.id, job.attempt, f"pausing for cleaner power in {zone} until "
            f"{when(d.start_at, d.now)}", cycle.snap.grace_s, EvictionKind.CARBON))
        wake(cycle, d.start_at)
