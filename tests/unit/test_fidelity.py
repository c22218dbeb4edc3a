"""The fidelity harness's pure parts: Spearman's correlation, time scaling, the simulator's
latency model (off = the ideal simulator exactly; on = the delays where they belong) and the
reading of job histories into the simulator's records, cut at a horizon."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from broker.errors import ConfigError
from broker.fidelity.compare import relative_diff, result_of, spearman, world
from broker.fidelity.diverge import per_job
from broker.fidelity.scale import inventory_text, real_config, scale_cluster, scale_trace
from broker.model.state import EvictionKind, JobState
from broker.sim.cluster import load_cluster
from broker.sim.engine import Simulation
from broker.sim.latency import Latencies, LatencySimulation
from tests.unit.test_sim_engine import MIXED, tiny


@pytest.mark.parametrize(("xs", "ys", "rho"), [
    ([1, 2, 3, 4], [10, 20, 30, 40], 1.0),
    ([1, 2, 3, 4], [4, 3, 2, 1], -1.0),
    ([1, 2, 3, 4, 5], [2, 1, 4, 3, 5], 0.8),  # 1 - 6 * 4 / (5 * 24)
    ([1, 1, 2, 3], [1, 2, 3, 4], 0.9487),  # a tie shares its average rank
])
def test_spearman_matches_the_textbook(xs: list[float], ys: list[float], rho: float) -> None:
    got = spearman(xs, ys)
    assert got is not None and math.isclose(got, rho, abs_tol=1e-4)


def test_spearman_of_too_little_is_none() -> None:
    assert spearman([1.0], [2.0]) is None
    assert spearman([1.0, 1.0], [1.0, 2.0]) is None
    with pytest.raises(ValueError, match="length"):
        spearman([1.0], [1.0, 2.0])


def test_relative_diff() -> None:
    d = relative_diff({"wait_mean_s": 105.0, "preemptions": 0, "started": 3},
                      {"wait_mean_s": 100.0, "preemptions": 0, "started": 0})
    assert d["wait_mean_s"] == 0.05 and d["preemptions"] == 0.0 and d["started"] is None


def test_scaling_divides_every_duration_of_the_workload_and_the_policies() -> None:
    cluster = load_cluster("seed-160")
    sc = scale_cluster(cluster, 100)
    assert sc.settings["grace_s"] == 0.3 and sc.settings["min_runtime_s"] == 6.0
    assert sc.settings["fairshare_half_life_s"] == 7 * 86400 / 100
    assert sc.settings["relief"]["min_gain_s"] == 6.0
    assert "relief_ratio" not in sc.settings["relief"]  # not a duration: its default holds
    assert sc.settings["multifactor"]["max_age_s"] == 14 * 86400 / 100
    assert [c.sla_s for c in sc.classes] == [c.sla_s / 100 for c in cluster.classes]
    st = scale_trace(MIXED, 10)
    assert [(j.submit_s, j.duration_s, j.time_limit_s) for j in st.jobs] == [
        (j.submit_s / 10, j.duration_s / 10, j.time_limit_s / 10) for j in MIXED.jobs]
    cfg = real_config(sc, "spillway")
    assert cfg["grace_s"] == 0.3 and cfg["classes"][0]["sla_s"] == 3.0
    assert "grace_s" not in cfg["policy_settings"]
    assert inventory_text(cluster.nodes[0]) == "8xV100-32GB"


def test_a_mig_cluster_is_refused_naming_the_node() -> None:
    mig = load_cluster("small-mig")
    node = next(n for n in mig.nodes if any(g.mig_profile for g in n.gpus))
    with pytest.raises(ConfigError, match=f"node {node.id} has MIG"):
        inventory_text(node)


def test_bad_latency_is_refused() -> None:
    with pytest.raises(ConfigError, match="dispatch_s"):
        Latencies(dispatch_s=-1.0)


@pytest.mark.parametrize("policy", ["fcfs", "slurm-like", "spillway"])
def test_no_latency_is_the_ideal_simulator(policy: str) -> None:
    a = Simulation(tiny(), MIXED, policy).run()
    b = LatencySimulation(tiny(), MIXED, policy, latencies=Latencies()).run()
    rows = [sorted((r.id, r.first_start_s, r.end_s, r.preemptions) for r in x.records)
            for x in (a, b)]
    assert rows[0] == rows[1]


def test_delays_land_where_they_belong() -> None:
    lat = Latencies(cycle_s=3.0, dispatch_s=5.0, end_s=2.0)
    sim = LatencySimulation(tiny(), MIXED, "fcfs", latencies=lat)
    res = sim.run()
    assert res.metrics["invariant_violations"] == 0
    first = next(r for r in res.records if r.id == "j00")  # arrives on an empty cluster
    assert first.first_start_s == 0.0 + 3.0 + 5.0  # the cycle's delay, then dispatch
    assert first.end_s == 8.0 + 600.0 + 2.0  # it runs its 600 s, then its exit is known
    job = sim.store.get("j00")
    assert [(h.state, h.time) for h in job.history][:3] == [
        (JobState.PENDING, 0.0), (JobState.STARTING, 3.0), (JobState.RUNNING, 8.0)]
    assert all(r.end_s is not None for r in res.records if not r.infeasible)


def test_periodic_cycle_serves_a_plan_wake_up_on_its_tick() -> None:
    sim = LatencySimulation(tiny(), MIXED, "spillway", latencies=Latencies(period_s=7.0))
    sim._push(12.5, 3, "")
    assert sim._events[-1][0] == 14.0 and 14.0 in sim._plan_wakes


def test_histories_read_into_records_and_samples_cut_at_the_horizon() -> None:
    sim = LatencySimulation(tiny(), MIXED, "spillway", latencies=Latencies())
    sim.run()
    jobs = {i: sim.store.get(i) for i in sim.trace_jobs}
    sla = {"normal": 3600.0, "high": 600.0, "low": 86400.0}
    whole = world(jobs, MIXED.jobs, sla, 0.0, 1.0, 1e9)
    by_id = {r.id: r for r in whole.records}
    for rec in sim.records.values():
        if rec.infeasible:
            continue
        assert by_id[rec.id].first_start_s == rec.first_start_s
        assert by_id[rec.id].end_s == rec.end_s
        assert by_id[rec.id].preemptions == rec.preemptions
    assert whole.samples[-1].busy_gpus == 0 and whole.samples[-1].queued_jobs == 0
    cut = world(jobs, MIXED.jobs, sla, 0.0, 1.0, 300.0)
    assert max(s.t for s in cut.samples) == 300.0
    assert all(r.first_start_s is None or r.first_start_s <= 300.0 for r in cut.records)
    # a scaled world reads back in the trace's seconds
    halved = world(jobs, MIXED.jobs, sla, 0.0, 2.0, 1e9)
    assert {r.id: r.first_start_s for r in halved.records} == {
        r.id: None if r.first_start_s is None else 2 * r.first_start_s for r in whole.records}


def test_per_job_names_the_reason_of_a_divergence() -> None:
    sim = LatencySimulation(tiny(), MIXED, "spillway", latencies=Latencies())
    sim.run()
    jobs = {i: sim.store.get(i) for i in sim.trace_jobs}
    sla = {"normal": 3600.0, "high": 600.0, "low": 86400.0}
    a = world(jobs, MIXED.jobs, sla, 0.0, 1.0, 1e9).views
    late = LatencySimulation(tiny(), MIXED, "spillway", latencies=Latencies(dispatch_s=4.0))
    late.run()
    b = world({i: late.store.get(i) for i in late.trace_jobs}, MIXED.jobs, sla, 0.0, 1.0,
              1e9).views
    out = per_job(a, b, near_s=10.0)
    assert out["compared"] == len([v for v in a.values() if v.start is not None])
    assert out["start_rank_correlation"] is not None and out["start_rank_correlation"] > 0.9
    assert all(row["reason"] for row in out["divergent"])
    assert out["same_gpu_count"] == 1.0
    assert EvictionKind.PRIORITY.value == "priority"  # the kinds are reported by value


def test_dispatch_samples_are_drawn_per_attempt_and_kept_in_scale() -> None:
    lat = Latencies(dispatch_s=1.0, dispatch_samples=(0.1, 0.2, 5.0))
    draws = {lat.dispatch(f"j{i}", 1) for i in range(50)}
    assert draws == {0.1, 0.2, 5.0}  # each measured value, the tail included
    assert lat.dispatch("j7", 2) == lat.dispatch("j7", 2)  # deterministic
    assert Latencies(dispatch_s=1.0).dispatch("j7", 1) == 1.0
    scaled = lat.times(10)
    assert scaled.dispatch_samples == (1.0, 2.0, 50.0) and scaled.dispatch_s == 10.0
    assert scaled.as_dict()["dispatch_samples_n"] == 3


def test_the_worlds_draw_with_the_simulators_report(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from broker.sim.report import write_report

    sla = {"normal": 3600.0, "high": 600.0, "low": 86400.0}
    results = []
    for label, lat in (("real", Latencies(dispatch_s=4.0)), ("sim", Latencies())):
        sim = LatencySimulation(tiny(), MIXED, "spillway", latencies=lat)
        sim.run()
        w = world({i: sim.store.get(i) for i in sim.trace_jobs}, MIXED.jobs, sla, 0.0, 1.0,
                  5000.0)
        results.append(result_of(w, label, 8, {"trace_origin": 0.0, "last_submit_s": 1200.0}))
    index = write_report(results, tmp_path / "out")
    assert index.exists() and "real" in index.read_text()
