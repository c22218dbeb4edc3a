"""The simulator's ``lower_bound`` section (broker/sim/lower_bound_sim.py): the bound of a
run's work on the run's cluster, clouds and spot replay, at most the run's own cost."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.cli import app
from broker.errors import ConfigError
from broker.sim.engine import Simulation
from broker.sim.lower_bound import LbJob, LbProblem
from broker.sim.lower_bound_sim import (
    _spot_seconds,
    lower_bound_section,
    run_misses,
    same_jobs_in_time,
    sim_problem,
    unpaused,
)
from broker.sim.run import SimRequest, simulate
from broker.sim.types import JobRecord
from tests.unit.test_sim_cloud import JOBS, cluster

H = 3600.0


def test_a_runs_bound_is_the_hour_it_had_to_rent_and_the_run_pays_boot_and_idle() -> None:
    """The hog holds the 4 on-prem GPUs for 10 h; the high job needs one GPU-hour within
    its SLA on p3.2xlarge on-demand ($3.06 an hour; the hog's 4 GPUs a node fit no offer).
    The bound is a relaxation: the hog's 5-minute SLA is 4 x 300 GPU-seconds of slack it may
    spend anywhere in its window, so a third of the high job's hour runs on-prem: 2/3 x
    $3.06. The run rents the whole hour and pays the boot and the idle timeout on top."""
    c = cluster()
    res = Simulation(c, JOBS, "spillway").run()
    sec = lower_bound_section(c, JOBS, res)
    assert sec["cloud_cost_usd"] == pytest.approx(3.06 * 2 / 3, abs=0.01)
    run = res.metrics["cloud_cost_usd"]
    assert sec["ratio"]["cloud_cost_usd"] == pytest.approx(run / 2.04, abs=0.01)
    assert 1.5 < sec["ratio"]["cloud_cost_usd"] < 1.8
    lp = sec["lp"]["cost"]
    assert lp["status"] == "optimal" and lp["variables"] > 0 and lp["solve_s"] >= 0
    assert "carbon" not in sec["lp"] and sec["carbon_kg"] is None  # no energy model given
    assert "no_pause" not in sec


def test_the_no_pause_bound_holds_the_hog_whole_so_the_high_job_rents_its_hour() -> None:
    """The same run: neither job was ever stopped, so in the no-pause bound each runs whole
    from one start. The hog's slack can no longer be spent around the high job, which now
    rents its whole hour, as the run did (less its boot and idle time)."""
    c = cluster()
    res = Simulation(c, JOBS, "spillway").run()
    sec = lower_bound_section(c, JOBS, res, no_pause=True)
    tight = sec["no_pause"]
    assert tight["whole_jobs"] == len(JOBS.jobs)
    assert tight["cloud_cost_usd"] == pytest.approx(3.06, abs=0.01)
    assert sec["cloud_cost_usd"] < tight["cloud_cost_usd"] <= res.metrics["cloud_cost_usd"]
    assert tight["ratio"] == pytest.approx(res.metrics["cloud_cost_usd"] / 3.06, abs=0.01)


def test_unpaused_marks_only_the_jobs_the_run_ran_through() -> None:
    jobs = tuple(LbJob(n, 0.0, 100.0, 1) for n in "abc")
    records = [JobRecord("a", "t", "normal", 1, 0.0, 100.0, 600.0, 0.0, 100.0),
               JobRecord("b", "t", "normal", 1, 0.0, 100.0, 600.0, 0.0, 150.0, preemptions=1),
               JobRecord("c", "t", "normal", 1, 0.0, 100.0, 600.0)]  # never ran
    out = unpaused(LbProblem(jobs, ()), records)
    assert [j.whole for j in out.jobs] == [True, False, False]


def test_spot_replay_gives_the_zone_until_its_capacity_goes_plus_the_notice(
        tmp_path: Path) -> None:
    doc = {"metadata": {"gap_seconds": 600}, "data": [0] * 6 + [1] * 100 + [0] * 1000}
    (tmp_path / "z.json").write_text(json.dumps(doc))
    c = cluster(tmp_path, ("spot", "ondemand"), availability={"us-east-1c": "z.json"})
    problem = sim_problem(c, JOBS, horizon_s=10 * H)
    spot = problem.spot_seconds
    assert spot is not None
    zone = "aws:us-east-1c"
    assert spot(zone, 0, H) == pytest.approx(H)
    assert spot(zone, H, 2 * H) == pytest.approx(120)  # the AWS notice
    assert spot(zone, 2 * H, 3 * H) == 0
    assert spot(zone, 106 * 600, 106 * 600 + 60) == pytest.approx(60)  # back again
    assert {o.spot_zone for o in problem.offers} == {zone, None}
    res = Simulation(c, JOBS, "spillway").run()
    sec = lower_bound_section(c, JOBS, res)
    assert 0 < sec["cloud_cost_usd"] < 3.06  # spot is cheaper, while the zone has it
    assert sec["cloud_cost_usd"] <= res.metrics["cloud_cost_usd"]


def test_spot_seconds_of_a_zone_without_a_trace_is_the_whole_slot() -> None:
    f = _spot_seconds({"a:z": ([0.0, 100.0], [50.0, 200.0])})
    assert f("a:other", 0, 900) == 900
    assert f("a:z", 0, 900) == pytest.approx(150)
    assert f("a:z", 40, 120) == pytest.approx(30)


def _rec(job: str, start: float | None, end: float | None, sla: float = 600.0) -> JobRecord:
    return JobRecord(job, "t", "normal", 1, 0.0, 100.0, sla, start, end)


def test_jobs_the_run_missed_or_held_back_may_end_as_late_as_the_run_ended_them() -> None:
    jobs = tuple(LbJob(n, 0.0, 100.0, 1, sla_s=600.0, cloud=True) for n in "abcd")
    records = [_rec("a", 10, 110), _rec("b", 700, 800), _rec("c", 10, 900), _rec("d", None,
                                                                                 None)]
    missed, late = run_misses(records, jobs, horizon=2000.0)
    assert (missed, late) == ({"normal": 2}, {"normal": 1})  # b late to start, d never; c
    out = same_jobs_in_time(LbProblem(jobs, ()), records)
    assert [j.end_s for j in out.jobs] == [700.0, 800.0, 900.0, math.inf]  # as the run did


def test_simulate_writes_the_section_when_asked(tmp_path: Path) -> None:
    csv = tmp_path / "jobs.csv"
    csv.write_text("id,submit_time,duration_s,num_gpus,priority,time_limit_s\n"
                   "hog,0,36000,4,critical,72000\nhi,10,3600,1,high,7200\n")
    yaml = tmp_path / "tiny.yaml"
    yaml.write_text("name: tiny\nnodes: [{prefix: n, gpus: 4xV100-16GB}]\n"
                    "cloud: {sites: [{provider: aws, region: us-east-1, zones: [us-east-1c], "
                    "instance_types: [p3.2xlarge], markets: [ondemand]}]}\n")
    out = tmp_path / "out.json"
    cli = CliRunner().invoke(app, ["simulate", "--trace", str(csv), "--cluster", str(yaml),
                                   "--lower-bound", "--json", str(out)])
    assert cli.exit_code == 0, cli.output
    sec = json.loads(out.read_text())["lower_bound"]
    assert sec["cloud_cost_usd"] == pytest.approx(2.04, abs=0.01)  # as above
    assert "no_pause" not in sec
    assert sec["carbon_kg"] > 0 and sec["ratio"]["carbon_kg"] >= 1.0
    assert sec["lp"]["carbon"]["status"] == "optimal"
    cli = CliRunner().invoke(app, ["simulate", "--trace", str(csv), "--cluster", str(yaml),
                                   "--lower-bound-no-pause", "--json", str(out)])
    assert cli.exit_code == 0, cli.output
    sec = json.loads(out.read_text())["lower_bound"]  # the flag implies --lower-bound
    assert sec["no_pause"]["cloud_cost_usd"] == pytest.approx(3.06, abs=0.01)
    with pytest.raises(ConfigError, match="--lower-bound-slot 0"):
        simulate(SimRequest(trace=str(csv), cluster=str(yaml), lower_bound=True,
                            lower_bound_slot_s=0.0))
