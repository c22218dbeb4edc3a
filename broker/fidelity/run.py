"""A fidelity run: one trace window, time-scaled by K, on the real system and in the
simulator, with the same configuration and seed; their metrics side by side.

Order: the ideal simulator first (no delays; it also says how long the real run may take),
then the real system, then the simulator again with the delays measured in the real run
(:class:`~broker.sim.latency.Latencies`). Both worlds are cut at the same horizon: the moment
the real run stopped (every job had started, or it gave up). ``real`` and ``sim`` (the
simulator with the delays) are compared; ``sim_ideal`` shows what the delays are worth.
Cloud sites (broker/fidelity/cloud.py): the real run rents from local providers with the
sites' offers, prices, boot time and quotas; the simulator runs its cloud model; cloud cost,
launches, cloud GPU-hours and each job's site (on-prem or cloud) are compared too.
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from broker.config.core import Config
from broker.errors import ConfigError
from broker.fidelity import cloud as fc
from broker.fidelity.compare import relative_diff, result_of, world
from broker.fidelity.diverge import per_job
from broker.fidelity.real import RealResult, RealRun, refuse_custom
from broker.fidelity.scale import check_k, inventory_text, scale_cluster, scale_trace
from broker.model import JobSpec
from broker.model.fit import could_hold
from broker.model.state import JobState
from broker.sim.cluster import Cluster
from broker.sim.latency import Latencies, LatencySimulation
from broker.sim.run import SimRequest, prepare
from broker.sim.types import SimResult, Trace
from policies.registry import bundle

CHECKPOINT_SHARE = 0.5  # an evicted job takes this share of grace_s to checkpoint and exit
AT_LEAST = 1.1  # the real run goes on to this x the ideal simulator's last start, so that a
# simulator a little later than the real system still has its jobs started by the horizon


@dataclass(frozen=True)
class FidelityRequest:
    sim: SimRequest  # the window, the load and the seed, as `spillway simulate` takes them
    time_scale: float
    workdir: Path | None = None  # None: a temporary directory, removed afterwards
    give_up_factor: float = 3.0  # the real run stops at this x the ideal last start, at most


def _feasible(cluster: Cluster, trace: Trace) -> Trace:
    keep = tuple(j for j in trace.jobs if could_hold(cluster.nodes, JobSpec(
        command=["x"], gpus=j.gpus, nodes=j.nodes, cpus=0.0,
        gpu_types=(j.gpu_type,) if j.gpu_type else ()).resources))
    return replace(trace, jobs=keep)


def _sim(cluster: Cluster, trace: Trace, policy: str, lat: Latencies, stop_s: float,
         lifecycle: bool = False) -> LatencySimulation:
    s = LatencySimulation(cluster, trace, bundle(policy, cluster.policies), latencies=lat,
                          stop_delay_s=stop_s, config=Config(), lifecycle=lifecycle)
    s.run()
    return s


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0


def measure(res: RealResult, checkpoint_s: float, cycle_s: float,
            at_once: set[str], cluster: Cluster | None = None) -> Latencies:
    """The real system's delays (real seconds), from the histories of the real run.
    ``at_once``: the jobs the ideal simulator started the instant they arrived; their real
    wait for a decision is the cycle's reaction time."""
    dispatch, end, stop, react = [], [], [], []
    for trace_id, job in res.jobs.items():
        h = job.history
        for a, b in itertools.pairwise(h):
            if a.state is JobState.STARTING and b.state is JobState.RUNNING:
                dispatch.append(b.time - a.time)
            if a.state is JobState.STOPPING and b.state is JobState.PREEMPTED:
                stop.append(b.time - a.time - checkpoint_s)
        if trace_id in at_once and len(h) > 1 and h[1].state is JobState.STARTING:
            react.append(h[1].time - h[0].time)
        if job.state is JobState.SUCCEEDED and job.attempt == 1 and job.started_at:
            work = float(job.spec.command[2]) if isinstance(job.spec.command, list) else 0.0
            end.append((job.finished_at or 0.0) - job.started_at - work)
    spec = cluster.cloud if cluster is not None else None
    cloud = fc.measured(res.instances, res.registered, res.jobs.values(),
                        fc.real_offer_ids(spec), spec.idle_timeout_s) if spec else {}
    react.sort()  # the slowest tenth waited for room in the real run: not a reaction
    react = react[:max(1, len(react) * 9 // 10)] if react else []
    return Latencies(cycle_s=max(0.0, _mean(react)), dispatch_s=max(0.0, _mean(dispatch)),
                     end_s=max(0.0, _mean(end)), stop_s=max(0.0, _mean(stop)),
                     period_s=cycle_s,
                     dispatch_samples=tuple(sorted(max(0.0, x) for x in dispatch)),
                     launch_s=max(0.0, _mean(cloud.get("launch", []))),
                     register_s=max(0.0, _mean(cloud.get("register", []))),
                     release_s=max(0.0, _mean(cloud.get("release", []))))


def run_fidelity(req: FidelityRequest, say: Callable[[str], None] = lambda _: None
                 ) -> tuple[dict[str, Any], list[SimResult]]:
    """The comparison (the JSON ``--json`` writes) and the three worlds as simulator results
    (real, sim, sim-ideal: what ``--report`` draws)."""
    k = check_k(req.time_scale)
    if len(req.sim.policies) != 1:
        raise ConfigError("--policy: give one policy (run the command once per policy)")
    policy = req.sim.policies[0]
    cluster, trace, meta = prepare(req.sim)  # the same window and load as `simulate`
    refuse_custom(policy, cluster)
    for node in cluster.nodes:
        inventory_text(node)  # (refuses MIG layouts now, not after the simulation)
    trace = _feasible(cluster, trace)
    sc, st = fc.scale_cloud(scale_cluster(cluster, k), k), scale_trace(trace, k)
    checkpoint_s = min(30.0 / k, float(sc.settings["grace_s"])) * CHECKPOINT_SHARE
    ideal = _sim(sc, st, policy, Latencies(), checkpoint_s)
    last = max((r.first_start_s or 0.0 for r in ideal.records.values()), default=0.0)
    last = max(last, st.jobs[-1].submit_s if st.jobs else 0.0)
    give_up = last * req.give_up_factor + 20.0
    say(f"{policy}: {len(st.jobs)} jobs on {len(cluster.nodes)} agents at K={k:g}: the real "
        f"run takes about {last:.0f} s (gives up after {give_up:.0f} s)")
    with tempfile.TemporaryDirectory(prefix="spillway-fidelity-") as tmp:
        workdir = req.workdir or Path(tmp)
        real = RealRun(sc, st, policy, workdir, checkpoint_s, say)
        t_start = time.monotonic()
        try:
            real.start()
            say(f"{policy}: {len(cluster.nodes)} agents up in "
                f"{time.monotonic() - t_start:.0f} s; replaying")
            res = real.run(list(st.jobs), give_up, at_least_s=last * AT_LEAST)
        finally:
            real.stop()
    at_once = {i for i, r in ideal.records.items() if r.first_start_s == r.submit_s}
    lat = measure(res, checkpoint_s, Config().cycle_s, at_once, sc)
    model = _sim(sc, st, policy, lat, checkpoint_s, lifecycle=True)  # (production's
    # scale-down rule for cloud nodes: broker/sim/latency.py LifecycleCloudRun)
    out, results = _compare(res, model, ideal, lat, cluster, trace, policy, k, meta)
    if sc.cloud is not None:
        _compare_cloud(out, results, res, model, ideal, sc, k)
    return out, results


def _compare_cloud(out: dict[str, Any], results: list[SimResult], res: RealResult,
                   model: LatencySimulation, ideal: LatencySimulation, sc: Cluster,
                   k: float) -> None:
    """Cloud cost, launches and GPU-hours of the three worlds (into their metrics and the
    diffs), and where each job first ran."""
    assert sc.cloud is not None
    horizon = out["horizon_s"]
    offers = fc.real_offer_ids(sc.cloud)
    sim_offers = {o.id: o for o in offers.values()}
    real_nodes = fc.cloud_nodes(res)
    real_fig = fc.figures(res.instances, offers, res.t0, k, horizon)
    sites = {"real": fc.on_cloud(res.jobs, real_nodes, res.t0, k, horizon)}
    figs = {"real": real_fig}
    for name, s in (("sim", model), ("sim_ideal", ideal)):
        assert s.cloud is not None
        recs = [i.record for i in s.cloud.clouds.instances.values()]
        figs[name] = fc.figures(recs, sim_offers, 0.0, k, horizon)
        sites[name] = fc.on_cloud({i: s.store.get(i) for i in s.trace_jobs},
                                  fc.cloud_nodes(s), 0.0, k, horizon)
    for name, result in zip(("real", "sim", "sim_ideal"), results):
        out[name].update(figs[name])
        result.metrics.update(figs[name])
    out["diff"].update(relative_diff(figs["real"], figs["sim"], fc.CLOUD_KEYS))
    out["diff_ideal"].update(relative_diff(figs["real"], figs["sim_ideal"], fc.CLOUD_KEYS))
    out["per_job"]["site"] = fc.site_agreement(sites["real"], sites["sim"])
    out["cloud"] = {"providers": sorted(fc.local_providers(sc.cloud, Path("-"))),
                    "offers": sorted(offers), "spot_interruptions": "off in both worlds",
                    "boot_s_real": {i: float(o.extra.get("boot_s", 0.0))
                                    for i, o in offers.items()},
                    "idle_timeout_s_real": sc.cloud.idle_timeout_s,
                    "machines_real": fc.rows(res.instances, res.t0, k),
                    "machines_sim": fc.rows([i.record for i in model.cloud.clouds.instances
                                             .values()] if model.cloud else [], 0.0, k)}


def _compare(res: RealResult, model: LatencySimulation, ideal: LatencySimulation,
             lat: Latencies, cluster: Cluster, trace: Trace, policy: str, k: float,
             meta: dict[str, Any]) -> tuple[dict[str, Any], list[SimResult]]:
    """The three worlds cut at the real run's end, their metrics and differences."""
    horizon = (res.stopped_at - res.t0) * k
    sla = {c.name: c.sla_s for c in cluster.classes}
    real_w = world(res.jobs, trace.jobs, sla, res.t0, k, horizon)
    sim_w = world({i: model.store.get(i) for i in model.trace_jobs}, trace.jobs, sla, 0.0, k,
                  horizon)
    ideal_w = world({i: ideal.store.get(i) for i in ideal.trace_jobs}, trace.jobs, sla, 0.0,
                    k, horizon)
    meta = {**meta, "policy": policy, "horizon_s": round(horizon, 1), "time_scale": k,
            "real_all_started": res.all_started, "trace_origin": trace.origin,
            "last_submit_s": trace.jobs[-1].submit_s if trace.jobs else 0.0}
    cap = cluster.capacity_gpus
    results = [result_of(real_w, f"{policy} real", cap, meta),
               result_of(sim_w, f"{policy} sim", cap, meta),
               result_of(ideal_w, f"{policy} sim-ideal", cap, meta)]
    m_real, m_sim, m_ideal = (r.metrics for r in results)
    near = (lat.cycle_s + lat.dispatch_s + lat.end_s) * k * 3
    jobs = per_job(fc.as_cloud(real_w.views, fc.cloud_nodes(res)),
                   fc.as_cloud(sim_w.views, fc.cloud_nodes(model)), near)
    lags = sorted(res.submit_lag_s)
    # The real run kept up with the replay: every job ran, and none was submitted more than
    # one scheduling period late (a busier machine delays the submitter; a job submitted late
    # meets another queue than the simulator's, which no bound on the scheduler covers).
    kept_up = res.all_started and (not lags or lags[-1] <= lat.period_s)
    load = {**res.load, "dispatch_latency_s": _lat_dist(res),
            "submit_lag_s": {"p50": round(_median(lags), 4),
                             "max": round(lags[-1], 4) if lags else None}}
    return {
        "policy": policy, "jobs": len(trace.jobs), "agents": len(cluster.nodes),
        "time_scale": k, "horizon_s": round(horizon, 1), "real_all_started": res.all_started,
        "real_kept_up": kept_up, "real": m_real, "sim": m_sim, "diff": relative_diff(m_real, m_sim),
        "sim_ideal": m_ideal, "diff_ideal": relative_diff(m_real, m_ideal),
        "start_rank_correlation": jobs["start_rank_correlation"],
        "latencies_real_s": lat.as_dict(), "latencies_trace_s": lat.times(k).as_dict(),
        "per_job": {key: v for key, v in jobs.items() if key != "rows"},
        "job_rows": jobs["rows"], "load": load,
    }, results


def _lat_dist(res: RealResult) -> dict[str, Any]:
    """Cycle decision (STARTING) -> process running (RUNNING), real seconds, every attempt."""
    from broker.sim.metrics import percentile

    xs = sorted(b.time - a.time for j in res.jobs.values()
                for a, b in zip(j.history, j.history[1:])
                if a.state is JobState.STARTING and b.state is JobState.RUNNING)
    return {"n": len(xs), **{f"p{p}": None if not xs else round(percentile(xs, p) or 0.0, 4)
                             for p in (50, 95, 99)}}
