"""Budgets at placement: the step after the burst phase that keeps its launches within the
teams' caps (role ``budget``: ``caps``, or ``none``).

For each launch the burst phase planned, in its order, the expected cost of the machines is

    price per hour x count x (boot + the longest expected runtime of its jobs + idle tail)

where a job's expected runtime is its time limit (the agent stops it there), or, without one
or with ``basis_predicted`` 1, its predicted runtime on the offer's GPU model x
``safety_factor``; ``idle_tail_s`` covers the idle time before an idle machine is given back.
Each team of the launch's jobs reserves the most of that cost the ledger can charge it: its
GPUs, and its part of the others' GPUs, which the ledger splits among the launch's teams as
idle time when their jobs end early (broker/money/ledger.py; :func:`shares`).

* A team with a **hard** cap keeps its jobs in the launch only if its committed dollars
  (spent + reserved in the cap's window, ``Snapshot.spend``, plus what this cycle already
  kept) plus its share stay within the cap; its other jobs stay pending with
  ``BudgetExhausted`` and by how much. A launch left with no job is dropped. The actuator then
  reserves each kept launch's shares in the store, atomically (broker/store/budgets.py), which
  is what holds against other schedulers.
* A team past a **soft** cap bursts, but only ``soft_delay_s`` after its SLA broke (its bursts
  wait behind the other teams'); meanwhile ``BudgetSoftCap``. Alerts fire from the ledger.
* A job's ``max_price_per_hour`` stays a hard limit: a job whose share of the offer costs more
  is dropped (the burst phase never plans one; this is the last check).

A job that starts on a machine rented for other jobs (its team pays for its GPUs' share of the
machine, the ledger's split) is checked the same way, before the launches: past a hard cap
the start is taken back. It may also keep the machine up past what its launchers reserved, and
they pay for the idle GPUs: its start reserves that too, for them (the machine's other GPUs
for its expected runtime, plus an idle tail), and the store refuses the start if that would
pass one of their hard caps. Each kept launch carries its shares in ``Launch.budget``, each such
start in ``Start.budget``. With no budget in the snapshot the step changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from broker.cycle.plan import Launch
from broker.model import Job, Offer, Reason
from policies.burst.offers import job_share_per_hour, offers_by_id, request_id, runtime_on
from policies.burst.sla import target_of
from policies.cycle import Cycle, deciding
from policies.reasons import budget_exhausted, dur
from policies.registry import register

LAUNCHERS = "@launchers"  # Start.budget: the teams the machine was launched for, by their GPUs

CAPS_DEFAULTS: dict[str, float] = {
    "basis_predicted": 0.0,  # 0: a job's time limit bounds its cost; 1: predicted x factor
    "safety_factor": 1.5,  # x the predicted runtime (no time limit, or basis_predicted 1)
    "idle_tail_s": 300.0,  # idle time before a machine is given back (the idle timeout)
    "boot_s": 240.0,  # when the offer does not say
    "unknown_runtime_s": 4 * 3600.0,  # no limit and no prediction
    "soft_delay_s": 1800.0,  # a team past its soft cap bursts this long after its SLA broke
}


@register("budget", "none")
def no_budget(cycle: Cycle) -> None:
    """Launches as the burst phase planned them."""


def job_runtime(cycle: Cycle, job: Job, model: str, cfg: Mapping[str, Any]) -> float:
    """The runtime the cap check expects of ``job`` on GPU ``model``."""
    limit = job.spec.time_limit
    if limit and not float(cfg["basis_predicted"]):
        return float(limit)
    run = runtime_on(cycle, job, model, float(cfg["unknown_runtime_s"]))
    if not math.isfinite(run):
        run = float(cfg["unknown_runtime_s"])
    return run * float(cfg["safety_factor"])


def launch_cost(offer: Offer, count: int, runtimes: list[float],
                cfg: Mapping[str, Any]) -> tuple[float, float]:
    """(dollars, hours per machine) a launch is expected to cost."""
    boot = float(offer.extra.get("boot_s", cfg["boot_s"]))
    hours = (boot + max(runtimes, default=0.0) + float(cfg["idle_tail_s"])) / 3600.0
    return offer.price_per_hour * count * hours, hours


def shares(jobs: list[Job], total: float, machine_gpus: int = 0) -> dict[str, float]:
    """Team -> the most of ``total`` (the cost of the launch's machines) the ledger can charge
    it. The ledger charges each team its own GPUs' time and splits the machine's idle GPUs
    among the teams the machine was launched for, by their GPUs (broker/money/ledger.py ``split``):
    when the other teams' jobs end early, a team whose job runs on pays its GPUs and its part
    of theirs. So a team with ``g`` of a launch's ``n`` GPUs on machines of ``G`` pays at most
    ``(g' + (G - g') x g / n) / G`` of each machine's time, ``g' = min(g, G)``: all of it
    alone, 3/4 of it with half of the GPUs beside another team. ``machine_gpus`` 0: by GPUs
    alone (``g / n``)."""
    gpus = {j.team: 0 for j in jobs}
    for j in jobs:
        gpus[j.team] += max(1, j.res.total_gpus)
    whole = sum(gpus.values()) or 1
    if machine_gpus <= 0:
        return {t: total * g / whole for t, g in gpus.items()}
    big = machine_gpus
    return {t: total * (min(g, big) + (big - min(g, big)) * g / whole) / big
            for t, g in gpus.items()}


@register("budget", "caps", settings=CAPS_DEFAULTS)
def caps(cycle: Cycle) -> None:
    """The policy of the module docstring."""
    snap = cycle.snap
    if not snap.budgets or not (cycle.launches or snap.instances):
        return
    cfg = cycle.settings("caps")
    offers = offers_by_id(cycle)
    by_id = {j.id: j for j in snap.pending}
    committed = {t: float(snap.spend.get(t, 0.0)) for t in snap.budgets}
    if snap.instances and cycle.starts:
        _starts(cycle, by_id, committed, cfg)
    kept: list[Launch] = []
    for launch in cycle.launches:
        try:  # (a launch's jobs are decided together: one failing sets them all aside)
            offer = offers.get(launch.offer_id)
            jobs = [by_id[i] for i in launch.for_jobs if i in by_id]
            if offer is None or not jobs:
                kept.append(launch)
                continue
            jobs = [j for j in jobs if _within_max_price(cycle, j, offer)]
            jobs = _fit(cycle, launch, offer, jobs, committed, cfg)
            if not jobs:
                continue
            runs = [job_runtime(cycle, j, offer.gpu_model, cfg) for j in jobs]
            cost, _ = launch_cost(offer, launch.count, runs, cfg)
            part = shares(jobs, cost, offer.gpu_count)
            for t, usd in part.items():
                if t in committed:
                    committed[t] += usd
            ids = tuple(j.id for j in jobs)
            rid = launch.request_id if ids == launch.for_jobs else \
                request_id(list(ids), by_id, cycle.now)
            kept.append(replace(launch, for_jobs=ids, request_id=rid,
                                budget=tuple(sorted(part.items()))))
        except Exception as e:
            mine = [by_id[i] for i in launch.for_jobs if i in by_id]
            if not mine or not all([cycle.fail(j, e) for j in mine]):
                raise
    cycle.launches[:] = kept


def _starts(cycle: Cycle, by_id: Mapping[str, Job], committed: dict[str, float],
            cfg: Mapping[str, Any]) -> None:
    """Starts on machines rented for other jobs. Each costs its team its GPUs' share of the
    machine for its expected runtime, and may keep the machine up: the machine's other GPUs
    meanwhile, and an idle tail after, are charged to the teams it was launched for
    (:data:`LAUNCHERS`, resolved when reserved). One whose own team's hard cap it would pass is
    taken back (``BudgetExhausted``); the others carry both parts in ``Start.budget``."""
    snap = cycle.snap
    machines = {i.node_id: i for i in snap.instances if i.node_id}
    offers = offers_by_id(cycle)
    tail_h = float(cfg["idle_tail_s"]) / 3600.0
    starts, started = [], []
    for st, run in zip(cycle.starts, cycle.started):
        job = by_id.get(st.job_id)
        if job is None:
            starts.append(st)
            started.append(run)
            continue
        with deciding(cycle, job):
            parts: list[tuple[str, str, float]] = []
            for a in st.allocations:
                inst, node = machines.get(a.node_id), snap.node_by_id.get(a.node_id)
                if inst is None or node is None or st.job_id in inst.for_jobs or not node.gpus:
                    continue
                offer = offers.get(inst.offer_id)
                price = offer.price_per_hour if offer is not None else inst.price_per_hour
                hours = job_runtime(cycle, job, node.gpus[0].model, cfg) / 3600.0
                share = min(1.0, max(1, len(a.gpu_ids)) / len(node.gpus))
                parts.append((a.node_id, job.team, price * share * hours))
                parts.append((a.node_id, LAUNCHERS, price * ((1 - share) * hours + tail_h)))
            if parts and job.team in snap.budgets:
                need = sum(p[2] for p in parts if p[1] == job.team)
                cap = snap.budgets[job.team]
                if job.team not in snap.soft_budgets and committed[job.team] + need > cap + 1e-6:
                    cycle.pending[job.id] = budget_exhausted(job.team, cap, committed[job.team],
                                                             need)
                    continue
                committed[job.team] += need
            if parts:
                st = replace(st, budget=tuple(parts))
            starts.append(st)
            started.append(run)
    cycle.starts[:] = starts
    cycle.started[:] = started


def _fit(cycle: Cycle, launch: Launch, offer: Offer, jobs: list[Job],
         committed: dict[str, float], cfg: Mapping[str, Any]) -> list[Job]:
    """The jobs of ``launch`` whose teams' caps allow it, after dropping, one team at a time,
    those of a team whose hard cap it would pass (the launch is then smaller)."""
    snap = cycle.snap
    while jobs:
        runs = [job_runtime(cycle, j, offer.gpu_model, cfg) for j in jobs]
        cost, _ = launch_cost(offer, launch.count, runs, cfg)
        part = shares(jobs, cost, offer.gpu_count)
        drop = None
        for team, usd in sorted(part.items()):
            cap = snap.budgets.get(team)
            if cap is None or committed.get(team, 0.0) + usd <= cap + 1e-6:
                continue
            if team in snap.soft_budgets:
                if _soft_wait(cycle, [j for j in jobs if j.team == team], cfg):
                    drop = team
                    break
                continue
            for j in jobs:
                if j.team == team:
                    cycle.pending[j.id] = budget_exhausted(team, cap, committed.get(team, 0.0), usd)
            drop = team
            break
        if drop is None:
            return jobs
        jobs = [j for j in jobs if j.team != drop]
    return jobs


def _soft_wait(cycle: Cycle, jobs: list[Job], cfg: Mapping[str, Any]) -> bool:
    """Past a soft cap: hold the team's bursts until ``soft_delay_s`` after their SLA broke
    (True: they wait; their reason and a wake-up are set)."""
    delay = float(cfg["soft_delay_s"])
    wait = False
    for j in jobs:
        cls = cycle.snap.class_by_name.get(j.priority)
        if cls is None:
            continue
        at = target_of(j, cls) + delay
        if cycle.now < at:
            wait = True
            cycle.pending[j.id] = Reason(
                "BudgetSoftCap", f"team {j.team} is past its soft budget: its bursts wait "
                                 f"~{dur(at - cycle.now)} more, behind other teams'")
            if cycle.wake_at is None or at < cycle.wake_at:
                cycle.wake_at = at
    return wait


def _within_max_price(cycle: Cycle, job: Job, offer: Offer) -> bool:
    limit = job.spec.max_price_per_hour
    if limit is None or job_share_per_hour(offer, job) <= limit:
        return True
    cycle.pending[job.id] = Reason("OverMaxPrice", f"its share of {offer.id} costs more than "
                                                   f"its max_price_per_hour (${limit:g})")
    return False
