"""Moving a job from on-demand to spot (policies/burst/spot_move.py): the decision, table-driven,
and the scale-down rule's part (its on-demand machine drains at once)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from broker.cloud.lifecycle import NodeUse, Verdict, scale_down
from broker.model.state import RESUMES_FIRST, EvictionKind
from policies.burst.spot_move import move_gain

OD, SPOT = 24.48, 7.344  # 8 x V100, on-demand and spot, $/h
ON = {"sla": {"spot_move": 1}}


@pytest.mark.parametrize("case, remaining_s, ratio, spot, rate, move", [
    ("10 h left, same GPU, median interruption rate: move", 36000, 1.0, SPOT, 0.8, True),
    ("20 min left: the saving still beats a restart and a boot", 1200, 1.0, SPOT, 0.8, True),
    ("20 min left in a zone losing spot 6 times an hour: stay", 1200, 1.0, SPOT, 6.0, False),
    ("ends before the spot machine boots: stay", 200, 1.0, SPOT, 0.8, False),
    ("spot 3 times as slow: stay", 36000, 3.0, SPOT, 0.8, False),
    ("spot twice as fast at the on-demand price: move", 36000, 0.5, OD, 0.0, True),
    ("same GPU, same price, no interruptions: the boot and restart lose", 36000, 1.0, OD, 0.0,
     False),
])
def test_the_move_decision(case: str, remaining_s: float, ratio: float, spot: float,
                           rate: float, move: bool) -> None:
    gain = move_gain(remaining_s, ratio, OD, spot, boot_s=240.0, restart_s=300.0,
                     rate_per_h=rate, lost_s=900.0)
    assert (gain > 0) is move, (case, gain)


def test_the_gain_is_the_on_demand_hours_saved_less_what_spot_costs() -> None:
    # 1 h left, boot 0, restart 0, no interruptions: (24.48 - 7.344) x 1 h
    assert move_gain(3600, 1.0, OD, SPOT, 0.0, 0.0, 0.0, 0.0) == pytest.approx(OD - SPOT)
    # the job runs on on-demand while spot boots (paid on both), then restarts on spot
    assert move_gain(3600, 1.0, OD, SPOT, 600.0, 300.0, 0.0, 0.0) == pytest.approx(
        (OD * 3000 - SPOT * (600 + 3000 + 300)) / 3600)
    assert move_gain(100, 1.0, OD, SPOT, 240.0, 0.0, 0.0, 0.0) == -math.inf


def test_its_on_demand_machine_drains_at_once_and_the_job_resumes_first() -> None:
    busy = NodeUse(8, 8, 0.0, None, 0.0, True, leaving=True)
    assert scale_down(10.0, busy, 300.0, lambda: True)[0] is Verdict.DRAIN
    assert EvictionKind.SPOT_MOVE in RESUMES_FIRST and str(EvictionKind.SPOT_MOVE) == "spot-move"


def test_through_the_cycle_launch_spot_then_move_when_it_is_up() -> None:
    from broker.cycle.scheduler import run_cycle
    from broker.model import Instance, InstanceState
    from policies.registry import PolicySet
    from tests.builders import node
    from tests.unit.test_burst import OD as OD1
    from tests.unit.test_burst import SPOT as SPOT1
    from tests.unit.test_burst import late
    from tests.unit.test_preemption import NOW, running, snap

    sla = PolicySet(burst="sla", name="t")
    sites = ("onprem", "cloud", "spot")
    moved = running("m", 1, on="c", time_limit=36000.0, started=NOW - 600,
                    checkpoint_dir="/ckpt", sites=sites)
    od = Instance("r-od", OD1.id, InstanceState.READY, provider_id="c", node_id="c",
                  price_per_hour=3.06, for_jobs=("m",))
    nodes = [node("a", 4), node("c", 1, "V100-16GB", site="aws:us-east-1:ondemand"),
             node("s", 1, "V100-16GB", site="aws:us-east-1:us-east-1a:spot")]
    held = [running("r", 4, time_limit=72000.0), moved]

    def plan(instances: tuple[Instance, ...], queue: tuple[Any, ...] = (),
             used: tuple[str, ...] = ("s",)) -> Any:
        active = held + ([running("x", 1, on="s", time_limit=36000.0)] if "x" in used else [])
        ns = nodes if "s" in used or "x" in used else nodes[:2]
        return run_cycle(snap(ns, list(queue), active, offers=(SPOT1, OD1), instances=instances,
                              settings=ON), sla, NOW)

    first = plan((od,), used=())
    assert [(x.offer_id, x.for_jobs) for x in first.launches] == [(SPOT1.id, ("m",))]
    assert first.preemptions == ()
    rid = first.launches[0].request_id
    booting = Instance(rid, SPOT1.id, InstanceState.BOOTING, requested_at=NOW,
                       provider_id="s", for_jobs=("m",))
    # while it boots: no second launch, no move, and a late job does not wait for it
    wait = plan((od, booting), queue=(late(sites=sites),), used=())
    assert [x.for_jobs for x in wait.launches] == [("p",)] and wait.preemptions == ()
    up = replace(booting, state=InstanceState.READY, node_id="s")
    [move] = plan((od, up)).preemptions
    assert (move.job_id, move.kind) == ("m", EvictionKind.SPOT_MOVE)
    assert "to spot" in move.reason
    # the spot machine was taken by another job meanwhile: the job stays
    assert plan((od, up), used=("x",)).preemptions == ()
    # a job without a checkpoint never moves
    held[1] = replace(moved, spec=moved.spec.model_copy(update={"checkpoint_dir": None}))
    assert plan((od,), used=()).launches == ()


def test_a_gang_moves_with_one_spot_machine_a_node() -> None:
    from broker.cycle.scheduler import run_cycle
    from broker.model import Instance, InstanceState
    from policies.registry import PolicySet
    from tests.builders import node
    from tests.unit.test_burst import OD as OD1
    from tests.unit.test_burst import SPOT as SPOT1
    from tests.unit.test_preemption import NOW, running, snap

    gang = running("g", 1, nodes=("c1", "c2"), time_limit=36000.0, started=NOW - 600,
                   checkpoint_dir="/ckpt", sites=("onprem", "cloud", "spot"))
    ods = tuple(Instance(f"r-{n}", OD1.id, InstanceState.READY, provider_id=n, node_id=n,
                         price_per_hour=3.06, for_jobs=("g",)) for n in ("c1", "c2"))
    nodes = [node("a", 4)] + [node(n, 1, "V100-16GB", site="aws:us-east-1:ondemand")
                              for n in ("c1", "c2")]
    s = snap(nodes, [], [running("r", 4, time_limit=72000.0), gang], offers=(SPOT1, OD1),
             instances=ods, settings=ON)
    plan = run_cycle(s, PolicySet(burst="sla", name="t"), NOW)
    assert [(x.offer_id, x.count, x.for_jobs) for x in plan.launches] == [(SPOT1.id, 2, ("g",))]
    off = run_cycle(replace(s, settings={}), PolicySet(burst="sla", name="t"), NOW)
    assert off.launches == ()  # spot_move is off by default
