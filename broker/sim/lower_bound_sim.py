"""The simulator's ``lower_bound`` section: the bound of :mod:`broker.sim.lower_bound` for the
work of one run (same trace window, cluster, clouds, spot replay and carbon series), and the
run's ratio to it.

Every job must be served in its window (submit to submit + SLA + runtime), except those the
run did not serve there (they did not start within their SLA, or were held back after their
start): each of those may end as late as the run ended it. So the run's own schedule,
relaxed, is one the program may choose, and the bound is at most the run's cloud cost (and
emissions).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from broker.energy.model import actual_steps
from broker.model import Resources
from broker.model.fit import could_hold
from broker.sim.cloud import Clouds, CloudSpec
from broker.sim.cluster import Cluster
from broker.sim.energy import SimEnergy
from broker.sim.lower_bound import solve
from broker.sim.lower_bound_problem import (
    KgRate,
    LbJob,
    LbOffer,
    LbPool,
    LbProblem,
    SpotSeconds,
)
from broker.sim.types import JobRecord, SimResult, Trace
from providers.carbon.base import integrate

DEFAULT_SLOT_S = 900.0
LATE_TOLERANCE_S = 1.0
METHOD = ("time-indexed LP (HiGHS via scipy.optimize.linprog): each job's GPU-hours split "
          "over slots of its window [submit, submit + SLA + runtime] on on-prem models or cloud "
          "options, capped per slot by its GPUs; on-prem GPUs, region quotas and spot-zone "
          "availability per slot; a job the run served late may end when the run ended it; relaxes "
          "integrality, preemption, packing, boot and idle time (docs/lower-bound.md)")


def sim_jobs(cluster: Cluster, trace: Trace) -> tuple[LbJob, ...]:
    """The trace's jobs the simulator submits (those the cluster could hold), as the bound
    sees them: a class that may burst may use the cloud (spot if it allows spot), as
    :meth:`broker.sim.cloudrun.CloudRun.sites_of` says."""
    classes = {c.name: c for c in cluster.classes}
    out = []
    for tj in trace.jobs:
        types = (tj.gpu_type,) if tj.gpu_type else ()
        if not could_hold(cluster.nodes, Resources(gpus=tj.gpus, gpu_types=types, cpus=0.0,
                                                   nodes=tj.nodes)):
            continue
        cls = classes.get(tj.priority)
        burst = cls is not None and cls.may_burst and cluster.cloud is not None
        out.append(LbJob(tj.id, tj.submit_s, min(tj.duration_s, tj.time_limit_s), tj.gpus,
                         tj.nodes, tj.priority, cls.sla_s if cls else math.inf,
                         cloud=burst, spot=burst and bool(cls and cls.spot_allowed),
                         gpu_types=types))
    return tuple(out)


def onprem_pools(cluster: Cluster) -> tuple[LbPool, ...]:
    counts: Counter[tuple[str, str]] = Counter()
    for node in cluster.nodes:
        for gpu in node.allocatable:
            if gpu.mig_profile is None:
                counts[(gpu.model, node.site)] += 1
    return tuple(LbPool(m, n, site) for (m, site), n in sorted(counts.items()))


def _up_intervals(clouds: Clouds, spec: CloudSpec, horizon: float
                  ) -> dict[str, tuple[list[float], list[float]]]:
    """Per spot zone (``provider:zone``): the intervals with spot, each stretched by the
    site's notice (an instance runs through its notice), merged, as (starts, ends)."""
    notice = {(s.provider, z): s.notice_s for s in spec.sites for z in s.zones}
    out: dict[str, tuple[list[float], list[float]]] = {}
    for (provider, zone), z in clouds.zones.items():
        gap, n = z.gap_s, len(z.available)
        k = int(z.offset_s // gap)
        t, start = k * gap - z.offset_s, None
        spans: list[tuple[float, float]] = []
        while t < horizon:
            up = z.available[k % n]
            if up and start is None:
                start = t
            elif not up and start is not None:
                spans.append((start, t + notice.get((provider, zone), 0.0)))
                start = None
            k += 1
            t = k * gap - z.offset_s
        if start is not None:
            spans.append((start, max(t, horizon)))
        merged: list[list[float]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        out[f"{provider}:{zone}"] = ([m[0] for m in merged], [m[1] for m in merged])
    return out


def _spot_seconds(ups: Mapping[str, tuple[list[float], list[float]]]) -> SpotSeconds:
    def seconds(zone: str, t0: float, t1: float) -> float:
        if zone not in ups:  # no trace replayed there: spot all the time, as in the run
            return t1 - t0
        starts, ends = ups[zone]
        i = max(0, bisect.bisect_right(starts, t0) - 1)
        total = 0.0
        while i < len(starts) and starts[i] < t1:
            total += max(0.0, min(ends[i], t1) - max(starts[i], t0))
            i += 1
        return total

    return seconds


def kg_rate(energy: SimEnergy) -> KgRate:
    """kg CO2e per GPU-hour of ``model`` at ``site`` over ``[t0, t1)`` (trace seconds): the
    energy model and carbon series the run's ``carbon_kg`` uses (broker/sim/energy.py)."""
    model = energy.energy.model
    mean: dict[tuple[str, float, float], float] = {}

    def rate(site: str, gpu_model: str, t0: float, t1: float) -> float:
        used = energy.zone_of(site)[1]
        g = mean.get((used, t0, t1))
        if g is None:
            a, b = energy.origin + t0, energy.origin + t1
            g = mean[(used, t0, t1)] = integrate(actual_steps(energy.source, used, a, b),
                                                 a, b) / max(b - a, 1e-9)
        return model.power_kw(1, gpu_model) * model.site_pue(site) * g / 1000.0

    return rate


def sim_problem(cluster: Cluster, trace: Trace, seed: int = 0, energy: SimEnergy | None = None,
                horizon_s: float = 0.0) -> LbProblem:
    """The bound's problem for a run of ``trace`` on ``cluster`` (its clouds as the run
    replays them with ``seed``)."""
    jobs = sim_jobs(cluster, trace)
    offers: list[LbOffer] = []
    quotas: dict[str, float] = {}
    spot: SpotSeconds | None = None
    if cluster.cloud is not None:
        clouds = Clouds(cluster.cloud, seed)
        for o, site in clouds.base_offers:
            region = f"{o.provider}:{o.region}"
            if site.quota_gpus is not None:
                quotas[region] = site.quota_gpus
            zone = f"{o.provider}:{o.zone}" if o.market.value == "spot" else None
            offers.append(LbOffer(o.id, region, o.gpu_model, o.gpu_count,
                                  o.price_per_gpu_hour, o.site.id, zone))
        ends = [j.end_s for j in jobs if math.isfinite(j.end_s)]
        spot = _spot_seconds(_up_intervals(clouds, cluster.cloud,
                                           max([horizon_s, *ends, 0.0]) + 86400.0))
    return LbProblem(jobs, onprem_pools(cluster), tuple(offers), quotas, spot,
                     kg_rate(energy) if energy is not None else None, horizon_s)


def same_jobs_in_time(problem: LbProblem, records: list[JobRecord]) -> LbProblem:
    """The problem with each job the run did not serve within its window (it missed its SLA,
    or was held back after its start) given until the run ended it instead (until the
    horizon if the run never ended it): job by job, no later than the run."""
    by_id = {r.id: r for r in records}
    jobs = []
    for j in problem.jobs:
        r = by_id.get(j.id)
        kept = r is not None and r.first_start_s is not None and r.end_s is not None \
            and r.first_start_s - r.submit_s <= r.sla_s \
            and r.end_s <= j.end_s + LATE_TOLERANCE_S
        until = math.inf if r is None or r.end_s is None else max(j.end_s, r.end_s)
        jobs.append(j if kept else replace(j, sla_s=math.inf, deadline_s=until))
    return replace(problem, jobs=tuple(jobs))


def unpaused(problem: LbProblem, records: list[JobRecord]) -> LbProblem:
    """The problem with each job the run started and never stopped (no preemption, move,
    relief or spot interruption) marked whole: it runs from one start to its end."""
    once = {r.id for r in records if r.first_start_s is not None and r.end_s is not None
            and r.preemptions == 0}
    return replace(problem, jobs=tuple(replace(j, whole=True) if j.id in once else j
                                       for j in problem.jobs))


def run_misses(records: list[JobRecord], jobs: tuple[LbJob, ...], horizon: float
               ) -> tuple[dict[str, int], dict[str, int]]:
    """Per class: the run's jobs that missed their SLA (the metrics' rule), and those that
    started in time but ended after their window."""
    by_id = {j.id: j for j in jobs}
    missed: Counter[str] = Counter()
    late: Counter[str] = Counter()
    for r in records:
        job = by_id.get(r.id)
        if r.infeasible or job is None:
            continue
        if r.first_start_s is None:
            missed[r.priority] += horizon - r.submit_s > r.sla_s
            late[r.priority] += horizon - r.submit_s <= r.sla_s
        elif r.first_start_s - r.submit_s > r.sla_s:
            missed[r.priority] += 1
        elif r.end_s is None or r.end_s > job.end_s + LATE_TOLERANCE_S:
            late[r.priority] += 1
    return dict(sorted(missed.items())), dict(sorted(late.items()))


def _ratio(run: Any, bound: float | None) -> float | None:
    if not isinstance(run, (int, float)) or bound is None:
        return None
    if bound <= 1e-9:
        return None if run > 1e-9 else 1.0
    return round(float(run) / bound, 4)


def lower_bound_section(cluster: Cluster, trace: Trace, result: SimResult, seed: int = 0,
                        energy: SimEnergy | None = None, slot_s: float = DEFAULT_SLOT_S,
                        method: str = "highs-ipm", no_pause: bool = False) -> dict[str, Any]:
    """The ``lower_bound`` section of a run's metrics (see the module's doc); with
    ``no_pause``, also the cost bound in which each job the run never stopped runs whole."""
    horizon = max((max(r.end_s or 0.0, r.first_start_s or 0.0, r.submit_s)
                   for r in result.records), default=0.0)
    problem = sim_problem(cluster, trace, seed, energy, horizon)
    missed, late = run_misses(result.records, problem.jobs, horizon)
    problem = same_jobs_in_time(problem, result.records)
    cost = solve(problem, "cost", slot_s=slot_s, method=method)
    carbon = solve(problem, "carbon", slot_s=slot_s, method=method) \
        if energy is not None else None
    m = result.metrics
    out: dict[str, Any] = {
        "method": METHOD,
        "slot_s": slot_s,
        "cloud_cost_usd": None if cost.value is None else round(cost.value, 2),
        "carbon_kg": None if carbon is None or carbon.value is None
        else round(carbon.value, 3),
        "ratio": {"cloud_cost_usd": _ratio(m.get("cloud_cost_usd"), cost.value),
                  "carbon_kg": _ratio(m.get("carbon_kg"),
                                      None if carbon is None else carbon.value)},
        "run_sla_misses": missed,
        "run_late_after_start": late,
        "lp": {"cost": cost.as_dict(), **({"carbon": carbon.as_dict()} if carbon else {})},
    }
    if no_pause:
        whole = unpaused(problem, result.records)
        tight = solve(whole, "cost", slot_s=slot_s, method=method)
        out["no_pause"] = {
            "cloud_cost_usd": None if tight.value is None else round(tight.value, 2),
            "ratio": _ratio(m.get("cloud_cost_usd"), tight.value),
            "whole_jobs": sum(j.whole for j in whole.jobs),
            "lp": tight.as_dict(),
        }
    return out
