"""The deadline rule in the cluster: the burst policy's calls into policies/burst/spot_deadline.py.

The burst policy (policies/burst/sla.py) asks :func:`market_for` which market a pending job with
a deadline takes now (``spot``, ``ondemand`` or ``wait``), and :func:`revisit` what becomes of
jobs with a deadline on on-demand cloud nodes. Everything comes from the snapshot: the offers,
and per spot zone the market the scheduler has seen (``Snapshot.spot_markets``, kept by
broker/cloud/spot_signals.py). The rule's changeover is the job's stop (``grace_s``), the offer's
boot and the restart (``restart_s``); its prices are the offers'; the work left is the
runtime estimate less what the job's attempts have run (it checkpoints).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from broker.cycle.plan import Preempt, Terminate
from broker.model import Job, Offer, Reason
from broker.model.fit import wanted_kinds
from broker.model.state import EvictionKind, JobState
from policies.burst.offers import CostModel, market_allowed, runtime_on
from policies.burst.spot_deadline import DeadlineRule, Mode, SpotMarket
from policies.cycle import Cycle, deciding


@dataclass
class Markets:
    """A cycle's memo: the market (spot, ondemand or wait) the rule chose per job id."""

    by_job: dict[str, str] = field(default_factory=dict)


def _mode_of(cycle: Cycle, job: Job) -> Mode | None:
    """IDLE for a pending job; SPOT / ONDEMAND for one running on such a cloud node; None
    on-prem."""
    if not job.allocations:
        return Mode.IDLE
    node = cycle.snap.node_by_id.get(job.allocations[0].node_id)
    site = node.site if node is not None else "onprem"
    if site == "onprem" or ":" not in site:
        return None
    return Mode.SPOT if site.endswith(":spot") else Mode.ONDEMAND


def _rule_for(cycle: Cycle, job: Job, costs: CostModel, mode: Mode) -> tuple[Mode, float]:
    """The rule's mode for ``job`` now, over the spot zones that could hold it, and when to
    look again (the next step of its zones' markets)."""
    snap, now = cycle.snap, cycle.now
    cls = snap.class_by_name.get(job.priority)
    fit = [o for o in snap.offers if cls is not None and market_allowed(o, job, cls)
           and o.gpu_count >= job.res.gpus and job.res.mig_profile is None
           and (job.res.gpus == 0 or wanted_kinds(job.res, [(o.gpu_model, None)]))]
    od = [o for o in fit if o.market.value != "spot" and o.extra.get("available") is not False]
    spot = [o for o in fit if o.market.value == "spot" and o.zone]
    if not od or not spot or job.spec.deadline is None:
        return (Mode.ONDEMAND if od or not spot else Mode.SPOT), math.inf
    up_ids = {o.id for o in spot if o.extra.get("available") is not False}
    on = min(od, key=lambda o: o.price_per_hour)
    zones: dict[str, list[Offer]] = {}
    for o in spot:
        zones.setdefault(f"{o.provider}:{o.zone}", []).append(o)
    unknown = float(cycle.settings("sla").get("unknown_runtime_s", costs.unknown_runtime_s))
    modes, wake = [], math.inf
    for key, zone_offers in sorted(zones.items()):
        o = min(zone_offers, key=lambda x: x.price_per_hour)
        up = any(x.id in up_ids for x in zone_offers)
        # a changeover: the job stops (its grace), the machine boots, the job restarts
        rule = DeadlineRule(changeover_h=(snap.grace_s + costs.boot(o) + costs.restart_s)
                            / 3600.0,
                            spot_price=o.price_per_hour, ondemand_price=on.price_per_hour)
        market = snap.spot_markets.get(key)
        if market is None:  # nothing seen of this zone before: the prior and what it is now
            market = rule.market(3600.0 / 18.0)  # (a scheduler's step of about 200 s)
            market.observe(up)
        run = runtime_on(cycle, job, o.gpu_model, unknown)
        left_h = max(0.0, run - _done_s(job, now)) / 3600.0
        time_left_h = (job.spec.deadline - now) / 3600.0
        d = rule.decide(mode, time_left_h - left_h, market.step_h, up, left_h, time_left_h,
                        market)
        modes.append(d)
        if d is mode:
            wake = min(wake, _next_change(rule, mode, market, up, left_h, job.spec.deadline,
                                          now))
    best = Mode.SPOT if Mode.SPOT in modes else Mode.ONDEMAND if Mode.ONDEMAND in modes \
        else Mode.IDLE
    return best, wake


def _done_s(job: Job, now: float) -> float:
    """The work its attempts kept: each until it was told to stop (it checkpoints then; the
    grace until it exits is lost), or until now."""
    stops = {h.attempt: h.time for h in job.history if h.state is JobState.STOPPING}
    return sum(min(now if a.ended_at is None else a.ended_at, stops.get(a.number, math.inf))
               - a.started_at for a in job.attempts if a.started_at <= now)


def _next_change(rule: DeadlineRule, mode: Mode, market: SpotMarket, up: bool, left_h: float,
                 deadline: float, now: float, limit: int = 48) -> float:
    """When the rule would leave ``mode`` if spot stays as it is (up or not) over the next
    steps (at most ``limit``, then look again): a change of availability runs a cycle anyway
    (the offers change), so the cycles in between can be skipped."""
    m, step = market.copy(), market.step_h * 3600.0
    t = m.next_s if now < m.next_s < math.inf else now + step
    for _ in range(limit):
        m.observe(up)
        time_left_h = (deadline - t) / 3600.0
        left = left_h - (t - now) / 3600.0 if mode is not Mode.IDLE else left_h
        if left <= 0 or rule.decide(mode, time_left_h - left, m.step_h, up, left,
                                    time_left_h, m) is not mode:
            return t
        t += step
    return t


def market_for(cycle: Cycle, job: Job, costs: CostModel) -> str:
    """``spot``, ``ondemand`` or ``wait`` for a pending job with a deadline (once a cycle;
    a wait sets the job's reason and asks for a cycle at the markets' next step)."""
    memo = cycle.memo(Markets).by_job
    if job.id not in memo:
        mode, wake = _rule_for(cycle, job, costs, Mode.IDLE)
        memo[job.id] = {Mode.SPOT: "spot", Mode.ONDEMAND: "ondemand"}.get(mode, "wait")
        if mode is Mode.IDLE:
            cycle.pending[job.id] = Reason(
                "WaitingForSpot", "its deadline leaves slack to wait for spot (the deadline "
                "rule, policies/burst/spot_deadline.py)")
            _wake(cycle, wake)
    return memo[job.id]


def revisit(cycle: Cycle, costs: CostModel) -> None:
    """Jobs with a deadline on on-demand cloud nodes. One running there is stopped (it
    checkpoints and comes back pending) when the rule leaves on-demand for spot or to wait;
    one this cycle starts there (a machine just booted for it, or the one it was just stopped
    on) is held back when the rule says so, its machine terminated, and handed to the burst
    phase (put back in ``cycle.blocked``); else the rule looks again at the markets' next
    step."""
    due = {j.id: j for j in cycle.snap.pending if j.spec.deadline is not None}
    for st in list(cycle.starts):
        job = due.get(st.job_id)
        node = cycle.snap.node_by_id.get(st.allocations[0].node_id) \
            if job is not None and st.allocations else None
        if job is None or node is None or ":" not in node.site or node.site.endswith(":spot"):
            continue
        with deciding(cycle, job):
            stop = next((h for h in reversed(job.history) if h.state is JobState.STOPPING), None)
            left = stop is not None and stop.kind is EvictionKind.MARKET
            mode, wake = _rule_for(cycle, job, costs, Mode.IDLE if left else Mode.ONDEMAND)
            if mode is Mode.ONDEMAND:
                _wake(cycle, wake)
                continue
            cycle.starts.remove(st)
            cycle.started[:] = [(j, e) for j, e in cycle.started if j.id != job.id]
            cycle.blocked.append(job)
            cycle.memo(Markets).by_job[job.id] = \
                "spot" if mode is Mode.SPOT else "wait"
            if mode is Mode.IDLE:
                cycle.pending[job.id] = Reason("WaitingForSpot", "its deadline leaves slack to "
                                               "wait for spot (policies/burst/spot_deadline.py)")
                _wake(cycle, wake)
            else:  # (the burst phase books its spot machine, or says why not, over this)
                cycle.pending[job.id] = Reason("WaitingForSpot", "its deadline rule takes spot "
                                               "now rather than on-demand node "
                                               f"{node.id} (policies/burst/spot_deadline.py)")
            held = [i.id for i in cycle.snap.instances if i.node_id == node.id]
            if held and not cycle.snap.allocated.get(node.id):
                cycle.terminations.append(Terminate(tuple(held), "its job with a deadline left "
                                                    "on-demand (policies/burst/spot_deadline.py)"))
    for job in cycle.snap.active:
        if job.spec.deadline is None:
            continue
        if job.state is JobState.STOPPING and _mode_of(cycle, job) is not None:
            _wake(cycle, cycle.now + cycle.snap.grace_s)  # back in the queue by then: decide
            continue
        if job.state is not JobState.RUNNING or _mode_of(cycle, job) is not Mode.ONDEMAND:
            continue
        mode, wake = _rule_for(cycle, job, costs, Mode.ONDEMAND)
        if mode is Mode.ONDEMAND:
            _wake(cycle, wake)
            continue
        why = "spot is back and likely to last" if mode is Mode.SPOT else \
            "its deadline leaves slack to wait for spot"
        cycle.evictions.append(Preempt(job.id, job.attempt, f"leaves on-demand: {why}",
                                       cycle.snap.grace_s, EvictionKind.MARKET))


def _wake(cycle: Cycle, at: float) -> None:
    if math.isfinite(at) and (cycle.wake_at is None or at < cycle.wake_at):
        cycle.wake_at = at
