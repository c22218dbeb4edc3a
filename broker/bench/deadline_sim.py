"""``spillway bench spot-deadline`` through the simulator: each (trace, start) is one simulation.

The cluster of one simulation: one on-prem GPU, held for the whole run by a job of a class
that may not burst (on-prem is busy), and one cloud site with two offers in the trace's zone:
spot at the setup's spot price, whose availability replays the trace from the start's step
(the path ``seed-160-burst.yaml`` takes: broker/sim/cloud.py's zone replay), and on-demand at
the on-demand price. The job: the setup's work, in a class that may burst with an SLA of 0
(it is due at once) and a deadline the setup's hours after its submission
(``sim_deadlines``); it checkpoints, so an interruption or a move keeps its progress. The
changeover is the boot (the instances boot in exactly ``changeover_h``; ``restart_s`` 0). The
spillway bundle decides everything through the production cycle: its burst policy asks the
deadline rule (policies/burst/spot_deadline.py) for spot, on-demand or a wait, fed the zone's
market by the simulator's spot signals (broker/cloud/spot_signals.py), which have watched the trace
from its start (as the standalone replay's scheduler does: ``market``).

Where it differs from the replay of broker/bench/deadline.py (both are reported): the spot
notice is 2 s (the replay loses the machine at the step; the instance is billed 2 s more); a
job stopped for a move exits after 1 s (``stop_delay_s``), billed on the machine it leaves; a
machine is released 1 s after its job leaves (``idle_timeout_s``); a job waiting for a
machine still booting keeps waiting for it (the replay may change its mind each step); a spot
instance whose zone loses spot while it boots is billed to the end of its boot and reclaimed
then.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from broker.bench.deadline import Setup, load
from broker.bench.deadline import run as replay_run
from broker.errors import ConfigError
from broker.model import Gpu, Market, Node, NodeState, PriorityClass
from broker.sim.cloud import CloudSite, CloudSpec, _Zone
from broker.sim.cluster import Cluster
from broker.sim.engine import Simulation
from broker.sim.types import Trace, TraceJob
from policies.burst.spot_deadline import DeadlineRule, SpotMarket
from policies.registry import bundle

MODEL = "V100-16GB"
DUE = PriorityClass("due", rank=200, sla_s=0.0, may_preempt=False, preemptible=False,
                    may_burst=True, spot_allowed=True, flexible=True)
HELD = PriorityClass("held", rank=300, sla_s=86400.0, may_preempt=False, preemptible=False,
                     may_burst=False, spot_allowed=False)


SUBMIT_S = 1e-3  # the job comes just after on-prem is taken (its deadline counts from here)


def _region(zone: str) -> str:
    return zone[:-1] if zone and zone[-1].isalpha() else zone


def zone_of(trace_name: str) -> str:
    """``aws-02-15-2023/us-east-1a_v100_1.json`` -> ``us-east-1a``."""
    return Path(trace_name).name.split("_")[0]


def one(trace_name: str, avail: tuple[bool, ...], gap_s: float, start: int, s: Setup,
        market: SpotMarket | None = None) -> dict[str, Any]:
    """Simulate the job started at step ``start`` of the trace; ``market``: what the
    scheduler saw of the zone before (a copy is fed from here on)."""
    zone = zone_of(trace_name)
    region = _region(zone)
    horizon = 1e7
    site = CloudSite("aws", region, (), ("p3.2xlarge",), ("spot", "ondemand"), None,
                     (s.changeover_h * 3600.0, s.changeover_h * 3600.0), 2.0)
    node = Node("onprem-00", (Gpu("GPU-onprem-00-0", 0, MODEL, 16.0),), state=NodeState.READY)
    cluster = Cluster(
        "spot-deadline", (node,), classes=(HELD, DUE),
        settings={"grace_s": 2.0, "sim_deadlines": {"factor": s.deadline_h / s.work_h},
                  "sla": {"restart_s": 0.0, "boot_s": s.changeover_h * 3600.0}},
        cloud=CloudSpec((site,), None, None, idle_timeout_s=1.0))
    work = s.work_h * 3600.0
    trace = Trace("spot-deadline", 0.0, (
        TraceJob("onprem-busy", 0.0, horizon, 1, 1, "t", "held", horizon),
        TraceJob("job", SUBMIT_S, work, 1, 1, "t", "due", work)))
    sim = Simulation(cluster, trace, bundle("spillway", {}), stop_delay_s=1.0,
                     check_invariants=False)
    assert sim.cloud is not None and sim.spot is not None
    clouds = sim.cloud.clouds
    base = [o for o, _ in clouds.base_offers]
    spot_o = next(o for o in base if o.market is Market.SPOT)
    od_o = next(o for o in base if o.market is Market.ONDEMAND)
    extra = {**spot_o.extra, "interruption_rate_per_hour": 0.0}
    clouds.base_offers = [
        (replace(spot_o, zone=zone, price_per_hour=s.spot_price, extra=extra), site),
        (replace(od_o, price_per_hour=s.ondemand_price), site)]
    clouds.zones = {("aws", zone): _Zone(avail, gap_s, start * gap_s, 0.0)}
    if market is not None:
        seen = market.copy()
        seen.next_s = 0.0
        sim.spot.markets[f"aws:{zone}"] = seen
    _lose_while_booting(sim)
    _cycle_on_changes(sim, avail, gap_s, start, s.deadline_h)
    result = sim.run()
    job = sim.store.get("job")
    deadline = SUBMIT_S + s.deadline_h * 3600.0
    end = job.finished_at if job.finished_at is not None else math.inf
    m = result.metrics
    return {"cost": float(m["cloud_cost_usd"]), "met": end <= deadline + 1e-6,
            "end_h": end / 3600.0, "bursts": m["bursts"],
            "interruptions": m["spot_interruptions"], "jobs_lost": m["jobs_lost"]}


LOST = 20  # event kinds: a spot instance's zone lost spot while it booted; a change of
CHANGE = 21  # the zone's availability


def _lose_while_booting(sim: Simulation) -> None:
    """A spot instance whose zone loses spot while it boots is reclaimed then (billed to
    that moment), and a cycle runs: the cluster simulator lets it finish booting and
    interrupts it at once (so the job waiting for it decides only then, and the whole boot
    is billed); the replay, like the provider, loses it at the step."""
    run = sim.cloud
    assert run is not None
    clouds, carry_out, event = run.clouds, run.carry_out, run.event

    def carry(plan: Any, now: float) -> None:
        before = set(clouds.instances)
        carry_out(plan, now)
        for pid in set(clouds.instances) - before:
            inst = clouds.instances[pid]
            if inst.offer.market is Market.SPOT and not inst.record.ended:
                down = clouds.next_interruption(inst, now)
                if down < inst.ready_at:
                    sim._push(down, LOST, pid)

    def on_event(kind: int, pid: str, now: float) -> bool:
        inst = clouds.instances.get(pid)
        if kind == CHANGE:
            return True
        if kind != LOST:
            return event(kind, pid, now)
        if inst is None or inst.record.ended or inst.node is not None:
            return False
        clouds.interruptions += 1
        clouds.end(inst, now, "spot interruption while booting")
        return True

    run.carry_out = carry  # type: ignore[method-assign]
    run.event = on_event  # type: ignore[method-assign]


def _cycle_on_changes(sim: Simulation, avail: tuple[bool, ...], gap_s: float, start: int,
                      hours: float) -> None:
    """A cycle at each change of the zone's availability (its offers change: production's
    scheduler sees it at its next cycle). The deadline rule asks for a cycle only where its
    answer would change while spot stays as it is (policies/burst/deadline.py), so these are
    the cycles that make it see each change at its step, as the replay does."""
    n = len(avail)
    for k in range(1, int(hours * 3600 / gap_s) + 2):
        if avail[(start + k) % n] != avail[(start + k - 1) % n]:
            sim._push(k * gap_s, CHANGE, "")


def run(folder: str | Path, s: Setup, replay_too: bool = True,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every (trace, start) of the experiment through the simulator; the standalone replay's
    figures beside it (``replay``) when ``replay_too``."""
    rule = DeadlineRule(changeover_h=s.changeover_h, spot_price=s.spot_price,
                        ondemand_price=s.ondemand_price)
    base = (s.work_h + s.changeover_h) * s.ondemand_price
    t0, c0 = time.perf_counter(), time.process_time()
    per: dict[str, dict[str, Any]] = {}
    means: list[float] = []
    misses = lost = 0
    missed: list[list[Any]] = []  # [trace, start step, end (hours after the submission)]
    for name, avail, gap in load(folder):
        span = len(avail) - int(s.deadline_h * 3600 / gap) - 1
        if span < 1:
            raise ConfigError(f"trace {name} is shorter than the deadline")
        watch, seen, costs = rule.market(gap / 3600.0), 0, []
        for st in (round(k * span / s.starts) for k in range(s.starts)):
            for j in range(seen, st):  # one watcher of the market, copied at each start
                watch.observe(avail[j])
            seen = st
            r = one(name, avail, gap, st, s, watch)
            costs.append(r["cost"] / base)
            if not r["met"]:
                misses += 1
                missed.append([name, st, round(r["end_h"], 4)])
            lost += r["jobs_lost"]
        per[name] = {"spillway": round(statistics.fmean(costs), 4)}
        means.append(statistics.fmean(costs))
        if progress is not None:
            progress(f"{name}: {per[name]['spillway']} ({time.perf_counter() - t0:.0f} s)")
    out: dict[str, Any] = {
        "cost_vs_ondemand": round(statistics.fmean(means), 4), "deadline_misses": misses,
        "missed": missed, "jobs_lost": lost, "per_trace": per, "runs": len(means) * s.starts,
        "wall_s": round(time.perf_counter() - t0, 1),
        "cpu_s": round(time.process_time() - c0, 1), "through": "simulator",
        "setup": {**s.__dict__, "traces": len(per)}}
    if replay_too:
        rep = replay_run(folder, s, rule)
        out["replay"] = {"cost_vs_ondemand": rep["cost_vs_ondemand"],
                         "deadline_misses": rep["deadline_misses"],
                         "greedy": rep["baselines"]["greedy"]}
        for name, row in rep["per_trace"].items():
            per[name] = {**per.get(name, {}), "replay": row["spillway"],
                         "greedy": row["greedy"]}
    return out
