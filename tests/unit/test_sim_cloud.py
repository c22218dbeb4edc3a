"""Cloud sites in the simulator (broker/sim/cloud.py, cloudrun.py): a launch boots, registers,
runs the job, is released when idle and billed; spot interruptions from an availability trace
requeue the job, which finishes elsewhere; the cluster file's ``cloud`` section is checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from broker.errors import ConfigError
from broker.model.state import EvictionKind, JobState
from broker.sim.cluster import cluster_from_data
from broker.sim.engine import Simulation
from tests.unit.test_sim_engine import tj, trace

H = 3600.0


def cluster(tmp: Path | None = None, markets: tuple[str, ...] = ("ondemand",),
            **site: Any) -> Any:
    spec: dict[str, Any] = {
        "name": "tiny", "nodes": [{"prefix": "n", "gpus": "4xV100-16GB"}],
        "cloud": {"idle_timeout_s": 300, "sites": [{
            "provider": "aws", "region": "us-east-1", "zones": ["us-east-1c"],
            "instance_types": ["p3.2xlarge"], "markets": list(markets), "boot_s": [120, 300],
            "notice_s": 120, **site}]}}
    if tmp is not None:
        spec["cloud"]["spot_traces"] = str(tmp)
    return cluster_from_data(spec, "tiny.yaml")


# a critical job holds the on-prem node for 10 h; a high job (SLA 30 min) arrives at t=10
JOBS = trace(tj("hog", 0, 10 * H, 4, priority="critical"), tj("hi", 10, H, 1, priority="high"))


def run(c: Any, policy: str = "spillway") -> Any:
    return Simulation(c, JOBS, policy).run()


def test_a_burst_boots_runs_within_the_sla_and_is_released_when_idle() -> None:
    res = run(cluster())
    m = res.metrics
    hi = next(r for r in res.records if r.id == "hi")
    assert hi.first_start_s is not None and hi.first_start_s - hi.submit_s <= 1800
    assert hi.end_s is not None
    assert (m["bursts"], m["jobs_lost"], m["invariant_violations"]) == (1, 0, 0)
    site = m["sites"]["aws:us-east-1:ondemand"]
    assert site["instances"] == 1 and site["busy_gpu_hours"] == pytest.approx(1.0)
    # billed from the launch to the release: boot (120-300 s) + 1 h + 300 s idle
    assert 3.06 * (H + 420) / H <= m["cloud_cost_usd"] <= 3.06 * (H + 600) / H + 0.01
    assert m["idle_instance_hours"] == pytest.approx((m["cloud_gpu_hours"] - 1.0), abs=0.01)


def test_the_baselines_burst_at_once_or_after_their_timer() -> None:
    assert run(cluster(), "burst-immediate").metrics["bursts"] == 1
    timer = run(cluster(), "burst-timer")
    hi = next(r for r in timer.records if r.id == "hi")
    assert timer.metrics["bursts"] == 1 and hi.first_start_s is not None
    assert hi.first_start_s >= 10 + 300 + 120  # 5 min, then a boot


def test_a_spot_interruption_requeues_the_job_and_it_finishes(tmp_path: Path) -> None:
    # spot in us-east-1c until t=3600, then none for 100 x 600 s
    doc = {"metadata": {"gap_seconds": 600}, "data": [0] * 6 + [1] * 100 + [0] * 1000}
    (tmp_path / "z.json").write_text(json.dumps(doc))
    sim = Simulation(cluster(tmp_path, ("spot", "ondemand"),
                             availability={"us-east-1c": "z.json"}), JOBS, "spillway")
    res = sim.run()
    m = res.metrics
    hi = next(r for r in res.records if r.id == "hi")
    assert m["spot_interruptions"] == 1 and m["jobs_lost"] == 0
    assert hi.end_s is not None and hi.preemptions == 1
    assert m["bursts"] == 2  # the spot one, then on-demand: no spot left in the zone
    job = sim.store.get("hi")
    assert job.state is JobState.SUCCEEDED
    assert any(h.kind is EvictionKind.SPOT for h in job.history)
    assert m["invariant_violations"] == 0


def test_without_a_cloud_the_burst_policies_change_nothing() -> None:
    plain = cluster_from_data({"name": "tiny", "nodes": [{"prefix": "n", "gpus": "4xV100-16GB"}]},
                              "tiny.yaml")
    a = Simulation(plain, JOBS, "spillway").run().metrics
    b = Simulation(plain, JOBS, "burst-immediate").run().metrics
    assert "cloud_cost_usd" not in a
    keys = ("wait_mean_s", "sla_attainment", "preemptions")
    assert [a[k] for k in keys] == [b[k] for k in keys]


@pytest.mark.parametrize(("cloud", "error"), [
    ({"sites": []}, "cloud.sites: is required"),
    ({"sites": [{"provider": "aws"}]}, "sites[0].region: is required"),
    ({"sites": [{"provider": "aws", "region": "us-east-1", "markets": ["cheap"]}]},
     "markets: ['cheap'] is not allowed"),
    ({"sites": [{"provider": "aws", "region": "us-east-1", "boot_s": [300, 100]}]},
     "the low end is above the high"),
    ({"sites": [{"provider": "aws", "region": "us-east-1", "flavour": "x"}]},
     "unknown keys ['flavour']"),
    ({"idle": 3, "sites": []}, "unknown keys ['idle']"),
])
def test_a_bad_cloud_section_names_the_key(cloud: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error.replace("[", r"\[").replace("]", r"\]")):
        cluster_from_data({"nodes": [{"prefix": "n", "gpus": "4xL4"}], "cloud": cloud}, "c.yaml")


def test_an_instance_type_the_catalog_lacks_is_refused() -> None:
    with pytest.raises(ConfigError, match="the catalog has no offer"):
        Simulation(cluster(instance_types=["p9.huge"]), JOBS, "spillway")


def test_a_node_under_half_busy_is_drained_and_released_when_its_jobs_leave() -> None:
    """An 8-GPU instance holding one 1-GPU job drains after the idle timeout (no new job
    lands there) and goes as soon as that job ends, not an idle timeout later."""
    sim = Simulation(cluster(instance_types=["p3.16xlarge"]),
                     trace(*JOBS.jobs, tj("later", 2200, 600, 1)), "spillway")
    res = sim.run()
    hi = next(r for r in res.records if r.id == "hi")
    later = next(r for r in res.records if r.id == "later")
    assert sim.cloud is not None
    first, second = sorted(sim.cloud.clouds.instances.values(),
                           key=lambda i: i.record.requested_at)
    states = [h.state.value for h in first.record.history]
    assert states == ["BOOTING", "READY", "DRAINING", "TERMINATED"]
    assert first.record.ended_at == hi.end_s
    # the normal job did not land on the draining node: it burst on its own, near its SLA
    assert later.first_start_s is not None and later.first_start_s >= 2200 + 14400 - 800
    assert second.record.requested_at > first.record.requested_at
    assert res.metrics["jobs_lost"] == 0 and res.metrics["invariant_violations"] == 0


def test_a_node_whose_jobs_are_done_drains_even_if_others_keep_it_busy() -> None:
    """Jobs that land on a rented node do not keep it up for ever: once the job it was
    launched for has ended, it drains (no new job lands there) and goes when they leave."""
    jobs = trace(*JOBS.jobs, tj("b1", 1700, 5 * H, 1), tj("b2", 1700, 5 * H, 1),
                 tj("b3", 2 * H, 600, 1))
    sim = Simulation(cluster(instance_types=["p3.8xlarge"]), jobs, "spillway")
    res = sim.run()
    assert sim.cloud is not None
    first = min(sim.cloud.clouds.instances.values(), key=lambda i: i.record.requested_at)
    node = first.record.node_id
    assert [h.reason for h in first.record.history if h.state.value == "DRAINING"] == [
        "its jobs are done"]
    ran = {j.id for j in sim.store.list_jobs() if any(
        a.node_id == node for at in j.attempts for a in at.allocations)}
    assert ran == {"hi", "b1", "b2"}
    assert first.record.ended_at == max(r.end_s or 0 for r in res.records if r.id in ran)
    assert res.metrics["jobs_lost"] == 0 and res.metrics["invariant_violations"] == 0


def test_a_gpu_freed_on_prem_is_used_while_a_draining_cloud_node_still_runs_a_job() -> None:
    """The engine skips a cycle only when every GPU that takes jobs is busy. A draining cloud
    node's GPUs take none, so its busy ones are not counted either: when an on-prem GPU frees
    up while such a node still runs a job, the job waiting on-prem starts at once (before,
    the busy GPUs of the draining node made the cluster look full, and it waited until they
    left)."""
    jobs = trace(tj("hog", 0, 10 * H, 3, priority="critical"),
                 tj("short", 0, 1500, 1, priority="critical"),
                 tj("hi", 10, H, 1, priority="critical"),  # bursts: nothing on-prem to take
                 tj("lo", 1000, 600, 1, priority="low"))  # may not burst: waits on-prem
    sim = Simulation(cluster(instance_types=["p3.16xlarge"]), jobs, "spillway")
    res = sim.run()
    assert sim.cloud is not None
    (inst,) = sim.cloud.clouds.instances.values()
    drained = next(h.time for h in inst.record.history if h.state.value == "DRAINING")
    rec = {r.id: r for r in res.records}
    assert drained < 1500 < (rec["hi"].end_s or 0)  # the 8-GPU node drains with hi on it
    assert rec["lo"].first_start_s == 1500.0  # when short leaves its GPU
    assert res.metrics["jobs_lost"] == 0 and res.metrics["invariant_violations"] == 0


def test_a_machine_given_back_leaves_the_store_and_the_cycle_s_instances() -> None:
    """Released machines are forgotten (as the provisioner forgets them), so two months of
    rentals do not pile up DOWN nodes that every snapshot reads; the instances a cycle sees
    are those alive, and the books still hold every one."""
    sim = Simulation(cluster(), JOBS, "spillway")
    res = sim.run()
    assert res.metrics["bursts"] == 1
    assert sim.cloud is not None
    clouds = sim.cloud.clouds
    [inst] = clouds.instances.values()
    assert inst.record.ended and inst.node is not None
    assert [n.id for n in sim.store.nodes()] == ["n-00"]
    assert clouds.records() == ()
    assert res.metrics["sites"]["aws:us-east-1:ondemand"]["instances"] == 1
