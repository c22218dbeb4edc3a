"""Bringing a job home from a rented machine to idle on-prem GPUs (policies/burst/home.py):
the decision, table-driven, through the cycle, and in the simulator (its machine drains at
once, the job restarts on-prem, the bill falls)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from broker.model import Instance, InstanceState
from broker.model.state import LEAVES_MACHINE, RESUMES_FIRST, EvictionKind
from policies.burst.home import home_gain

OD = 24.48  # 8 x V100 on-demand, $/h
ON = {"sla": {"home_move": 1, "home_move_headroom_gpus": 0}}


@pytest.mark.parametrize("case, remaining_s, rent, gpus, move", [
    ("10 h left on 8-GPU on-demand: home", 36000, OD, 8, True),
    ("10 min left on 8-GPU on-demand: the lost work and the restart cost more", 600, OD, 8,
     False),
    ("40 h left on one spot GPU: home", 144000, 0.918, 1, True),
    ("10 h left on one spot GPU: $9 saved, under the floor: stay", 36000, 0.918, 1, False),
    ("unknown end: stay", math.inf, OD, 8, False),
])
def test_the_home_decision(case: str, remaining_s: float, rent: float, gpus: int,
                           move: bool) -> None:
    gain = home_gain(remaining_s, rent, gpus, restart_s=300.0, lost_s=900.0,
                     onprem_gpu_hour_usd=2.0)
    assert (gain > 20.0) is move, (case, gain)  # home_move_min_gain_usd


def test_the_gain_is_the_rent_saved_less_the_work_the_move_loses() -> None:
    # 2 h left at $24.48/h; 8 GPUs lose 900 + 300 s, valued at $2 an on-prem GPU-hour
    assert home_gain(7200, OD, 8, 300.0, 900.0, 2.0) == pytest.approx(
        2 * OD - 2.0 * 8 * 1200 / 3600)
    assert home_gain(0.0, OD, 8, 300.0, 900.0, 2.0) == -math.inf


def test_the_kind_resumes_first_and_its_machine_drains() -> None:
    assert EvictionKind.HOME in RESUMES_FIRST and EvictionKind.HOME in LEAVES_MACHINE
    assert str(EvictionKind.HOME) == "home"


def _cycle(extra_queue: tuple[Any, ...] = (), onprem_busy: bool = False,
           settings: Any = ON, checkpoint: str | None = "/ckpt", policies: Any = None,
           **kw: Any) -> Any:
    from broker.cycle.scheduler import run_cycle
    from policies.registry import PolicySet
    from tests.builders import node
    from tests.unit.test_burst import OD as OD1
    from tests.unit.test_preemption import NOW, running, snap

    away = running("m", 1, on="c", time_limit=36000.0, started=NOW - 600,
                   checkpoint_dir=checkpoint, sites=("onprem", "cloud", "spot"))
    inst = Instance("r-od", OD1.id, InstanceState.READY, provider_id="c", node_id="c",
                    price_per_hour=3.06, for_jobs=("m",))
    nodes = [node("a", 4), node("c", 1, "V100-16GB", site="aws:us-east-1:ondemand")]
    active = [away] + ([running("r", 4, time_limit=72000.0)] if onprem_busy else [])
    return run_cycle(snap(nodes, list(extra_queue), active, offers=(OD1,), instances=(inst,),
                          settings=settings, **kw),
                     policies or PolicySet(burst="sla", name="t"), NOW)


def test_through_the_cycle_a_job_comes_home_when_on_prem_stands_idle() -> None:
    from tests.unit.test_preemption import pending

    [move] = _cycle().preemptions
    assert (move.job_id, move.kind) == ("m", EvictionKind.HOME)
    assert move.reason.startswith("comes home from c: on-prem GPUs stand idle")
    assert _cycle(onprem_busy=True).preemptions == ()  # no room on-prem
    assert _cycle(settings={}).preemptions == ()  # off by default
    # the default headroom: 8 GPUs must stay free on-prem after the move; 3 would
    assert _cycle(settings={"sla": {"home_move": 1}}).preemptions == ()
    assert len(_cycle(settings={"sla": {"home_move": 1, "home_move_headroom_gpus": 3}})
               .preemptions) == 1
    assert _cycle(checkpoint=None).preemptions == ()  # it would lose all its work
    # a queued job takes the idle GPUs first
    blocked = _cycle(extra_queue=(pending("w", 4),))
    assert all(p.kind is not EvictionKind.HOME for p in blocked.preemptions)


def test_in_the_simulator_a_burst_job_comes_home_and_the_bill_falls(tmp_path: Any) -> None:
    """Four on-prem GPUs held by a 1-hour critical job; a 20-hour normal job arrives, bursts
    when its SLA would break, and with home moves comes back once the critical job is done:
    its machine drains at once, it restarts on-prem, and the cloud bill is a fraction."""
    from broker.sim.cluster import load_cluster
    from broker.sim.engine import Simulation
    from broker.sim.trace import load_trace

    csv = tmp_path / "jobs.csv"
    csv.write_text("id,submit_time,duration_s,num_gpus,priority,time_limit_s\n"
                   "hog,0,10800,4,critical,14400\nlong,60,72000,4,normal,86400\n")
    body = ("name: tiny\nnodes: [{prefix: n, gpus: 4xV100-16GB}]\n"
            "classes:\n"
            "  - {name: critical, rank: 400, sla_s: 300, may_burst: true}\n"
            "  - {name: normal, rank: 200, sla_s: 600, preemptible: true, may_burst: true}\n"
            "cloud: {sites: [{provider: aws, region: us-east-1, zones: [us-east-1c], "
            "instance_types: [p3.8xlarge], markets: [ondemand]}]}\n")
    results = {}
    for on in (0, 1):
        yaml = tmp_path / f"c{on}.yaml"
        yaml.write_text(body + f"settings: {{sla: {{home_move: {on}, "
                        "home_move_headroom_gpus: 0}}\n")
        c = load_cluster(str(yaml))
        trace = load_trace(str(csv), classes=c.classes)
        results[on] = Simulation(c, trace, "spillway", check_invariants=True).run()
    off, on_ = results[0], results[1]
    assert off.metrics["home_moves"] == 0 and on_.metrics["home_moves"] == 1
    assert off.metrics["jobs_lost"] == on_.metrics["jobs_lost"] == 0
    long_on = next(r for r in on_.records if r.id == "long")
    assert long_on.end_s is not None and long_on.preemptions == 1
    # rented for about the hog's 3 hours, not the long job's 20
    assert on_.metrics["cloud_cost_usd"] < 0.3 * off.metrics["cloud_cost_usd"]


def test_home_moves_leave_free_the_gpus_of_jobs_held_for_cleaner_power() -> None:
    """A flexible job waiting for a clean window (pending, not blocked) has the idle on-prem
    GPUs to itself: a long job from the cloud would hold them for days (the 14-day carbon runs
    lost `low` SLAs and a deadline that way, docs/carbon.md)."""
    from broker.config.core import DEFAULT_CLASSES
    from broker.model import PriorityClass, Site
    from policies.registry import PolicySet
    from tests.unit.test_preemption import NOW, pending

    h = 3600.0
    flex = (*DEFAULT_CLASSES, PriorityClass("flex", 150, 24 * h, flexible=True))
    dirty_then_clean = tuple((NOW + i * h, 300.0 if i < 6 else 100.0) for i in range(48))
    carbon = {"classes": flex, "sites": (Site(carbon_zone="US-CAL-CISO"),),
              "carbon_forecast": {"US-CAL-CISO": dirty_then_clean}}
    wait = PolicySet(admit="carbon-wait", burst="sla", name="t")
    held = pending("f", 4, priority="flex", submitted=NOW, time_limit=2 * h, sites=("onprem",))
    plan = _cycle((held,), settings={**ON, "carbon": {"step_s": h}}, policies=wait, **carbon)
    assert plan.pending["f"].code == "DeferredForCarbon"
    assert all(p.kind is not EvictionKind.HOME for p in plan.preemptions)
    small = pending("f", 2, priority="flex", submitted=NOW, time_limit=2 * h, sites=("onprem",))
    plan = _cycle((small,), settings={**ON, "carbon": {"step_s": h}}, policies=wait, **carbon)
    assert plan.pending["f"].code == "DeferredForCarbon"  # 2 of the 4 idle GPUs: room for it
    assert [p.kind for p in plan.preemptions] == [EvictionKind.HOME]
