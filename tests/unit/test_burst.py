"""The burst phase (policies/burst/sla.py, ``sla``): one row per rule, on small snapshots.

The cluster: node ``a`` with 4 A100s held by ``r`` (normal, limit 20 h: it ends long after
every SLA below). Offers boot in 60 s unless a row says otherwise; the decision margin is 300 s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from broker.cycle.plan import Plan
from broker.cycle.scheduler import run_cycle
from broker.model import Instance, InstanceState, Job, Offer
from broker.model.cloud import Market
from policies.registry import PolicySet
from tests.builders import node
from tests.unit.test_preemption import NOW, pending, running, snap

SLA = PolicySet(burst="sla", name="t")
H = 3600.0


def offer(kind: str = "spot", *, gpus: int = 1, model: str = "V100-16GB",
          price: float | None = None, zone: str = "us-east-1a", boot: float = 60.0,
          rate: float = 0.05, typ: str | None = None, **extra: Any) -> Offer:
    spot = kind == "spot"
    return Offer("aws", zone[:-1], zone if spot else "", typ or f"p3.{gpus}x", model, gpus,
                 16, Market(kind), price if price is not None else
                 (0.918 if spot else 3.06) * gpus,
                 extra={"boot_s": boot, "interruption_rate_per_hour": rate, **extra})


SPOT, OD = offer("spot"), offer("ondemand")
A100X8 = offer("ondemand", gpus=8, model="A100-80GB", price=32.77, typ="p4d")


def late(job_id: str = "p", gpus: int = 1, priority: str = "normal", left: float = 100.0,
         **spec: Any) -> Job:
    """A pending job whose SLA target is ``left`` seconds from now."""
    sla = {"critical": 300, "high": 1800, "normal": 14400, "low": 86400}[priority]
    spec.setdefault("time_limit", 2 * H)
    return pending(job_id, gpus, priority=priority, submitted=NOW + left - sla, **spec)


def cycle(queue: list[Job], offers: tuple[Offer, ...] = (SPOT, OD), *,
          active: list[Job] | None = None, instances: tuple[Instance, ...] = (),
          settings: dict[str, Any] | None = None, nodes: list[Any] | None = None,
          now: float = NOW) -> Plan:
    active = [running("r", 4, time_limit=20 * H)] if active is None else active
    s = snap(nodes or [node("a", 4)], queue, active, now=now, offers=offers,
             instances=instances, settings={"sla": settings or {}})
    return run_cycle(s, SLA, now)


def launched(plan: Plan) -> list[tuple[str, int, tuple[str, ...]]]:
    return [(x.offer_id, x.count, x.for_jobs) for x in plan.launches]


# (queue, cycle kwargs, launches [(offer id, count, jobs)], reason codes)
ROWS: dict[str, tuple[list[Job], dict[str, Any], list[Any], dict[str, str]]] = {
    "SLA breaks: the cheapest expected cost (spot)": (
        [late()], {}, [(SPOT.id, 1, ("p",))], {"p": "Bursting"}),
    "the class may not burst": (
        [late(priority="low", left=-10)], {}, [], {"p": "ClassMayNotBurst"}),
    "its sites keep it on-prem": (
        [late(left=-10, sites=("onprem",))], {}, [], {"p": "ClassMayNotBurst"}),
    "over its max price": (
        [late(max_price_per_hour=0.5)], {}, [], {"p": "OverMaxPrice"}),
    "max price leaves only spot": (
        [late(max_price_per_hour=1.0)], {"offers": (OD, SPOT)}, [(SPOT.id, 1, ("p",))], {}),
    "critical allows no spot: on-demand": (
        [late(priority="critical", left=100)], {"active": [running("r", 4, time_limit=20 * H,
                                                                   priority="critical")]},
        [(OD.id, 1, ("p",))], {"p": "Bursting"}),
    "cloud-only: on-prem in time does not keep it (it cannot run there)": (
        [late(left=100, sites=("cloud",))],
        {"active": [running("r", 4, time_limit=10_000 - 1000 + 20)], "offers": (OD,)},
        [(OD.id, 1, ("p",))], {"p": "Bursting"}),
    "no offer holds it": (
        [late(gpu_types=("H100",), left=-10)], {"nodes": [node("a", 4, "H100-80GB")],
                                                 "active": [running("r", 4, time_limit=20 * H)]},
        [], {"p": "NoOffer"}),
    "before its decision time, no spot: it waits": (
        [late(left=1000)], {"offers": (OD,)}, [], {"p": "Resources"}),
    "before its decision time, on-prem in time: it waits": (
        [late(left=1000)], {"active": [running("r", 4, time_limit=10_000 - 1000 + 50)]},
        [], {"p": "Resources"}),
    "before its decision time, forecast to breach: spot now": (
        [late(left=5000)], {}, [(SPOT.id, 1, ("p",))], {"p": "Bursting"}),
    "spot only early: on-demand waits for the decision time": (
        [late(left=5000)], {"offers": (offer("spot", available=False), OD)}, [],
        {"p": "Resources"}),
    "on-prem meets its SLA: it stays": (
        [late(left=100)], {"active": [running("r", 4, time_limit=10_000 - 1000 + 20)]},
        [], {"p": "Resources"}),
    "on-prem meets its SLA with no boot to spare: it bursts": (
        [late(left=300)], {"active": [running("r", 4, time_limit=10_000 - 1000 + 270)]},
        [(SPOT.id, 1, ("p",))], {"p": "Bursting"}),
    "on-prem meets its SLA with no boot to spare: it stays (stay_needs_boot 0)": (
        [late(left=300)], {"active": [running("r", 4, time_limit=10_000 - 1000 + 270)],
                           "settings": {"stay_needs_boot": 0}}, [], {"p": "Resources"}),
    "on-prem starts it sooner than a boot": (
        [late(left=-500)], {"active": [running("r", 4, time_limit=10_000 - 1000 + 30)]},
        [], {"p": "BurstNotWorthIt"}),
    "SLA lost, cloud barely sooner": (
        [late(left=-500)], {"active": [running("r", 4, time_limit=10_000 - 1000 + 1800)]},
        [], {"p": "BurstNotWorthIt"}),
    "SLA lost, cloud much sooner: bursts anyway": (
        [late(left=-500)], {}, [(SPOT.id, 1, ("p",))], {"p": "Bursting"}),
    "SLA lost, no spot: on-demand would buy only time (lost_sla_spot_only)": (
        [late(left=-500)], {"offers": (offer("spot", available=False), OD),
                            "settings": {"lost_sla_spot_only": 1}}, [],
        {"p": "BurstNotWorthIt"}),
    "SLA lost, no spot: on-demand by default": (
        [late(left=-500)], {"offers": (offer("spot", available=False), OD)},
        [(OD.id, 1, ("p",))], {"p": "Bursting"}),
    "a slow boot that misses the SLA is passed over": (
        [late()], {"offers": (offer("spot", boot=400), OD)}, [(OD.id, 1, ("p",))], {}),
    "the queue ahead pushes it past its SLA": (
        [late("first", 4, priority="high", left=50_000), late("p", 1, left=100)],
        {"active": [running("r", 4, time_limit=10_000 - 1000 + 50, priority="critical")]},
        [(SPOT.id, 1, ("p",))], {"p": "Bursting"}),
    "spot interrupted too often: on-demand": (
        [late()], {"offers": (offer("spot", rate=5.0), OD)}, [(OD.id, 1, ("p",))], {}),
    "a faster GPU finishes it cheaper": (
        [late(gpu_types=("V100", "H100"), time_limit=10 * H)],
        {"offers": (offer("ondemand", price=3.06),
                    offer("ondemand", model="H100-80GB", price=9.0, typ="p5"))},
        [(offer("ondemand", model="H100-80GB", price=9.0, typ="p5").id, 1, ("p",))], {}),
    "two jobs share one 8-GPU instance": (
        [late("p1"), late("p2")], {"offers": (A100X8,)},
        [(A100X8.id, 1, ("p1", "p2"))], {"p1": "Bursting", "p2": "Bursting"}),
    "a region quota that is used up": (
        [late()], {"offers": (offer("spot", region_quota_gpus=0),
                              offer("ondemand", region_quota_gpus=0))}, [], {"p": "NoOffer"}),
    "deadline with little slack: on-demand": (
        [late(deadline=NOW + 2 * H + 200)], {}, [(OD.id, 1, ("p",))], {}),
    "deadline with room: spot": (
        [late(deadline=NOW + 10 * H)], {}, [(SPOT.id, 1, ("p",))], {}),
    "cheaper jobs ahead burst to make room for a long one": (
        [late("short", 1, priority="high", left=50_000, time_limit=H),
         late("long", 1, left=100, time_limit=20 * H)],
        {"nodes": [node("a", 1)],
         "active": [running("r", 1, time_limit=10_000 - 1000 + 20, priority="critical")]},
        [(SPOT.id, 1, ("short",))], {"short": "Bursting", "long": "Resources"}),
    "a gang takes one instance a node": (
        [late(nodes=2)], {}, [(SPOT.id, 2, ("p",))], {}),
}


@pytest.mark.parametrize(("queue", "kw", "want", "codes"), list(ROWS.values()), ids=list(ROWS))
def test_burst_rules(queue: list[Job], kw: dict[str, Any], want: list[Any],
                     codes: dict[str, str]) -> None:
    plan = cycle(queue, **kw)
    assert launched(plan) == want
    for job_id, code in codes.items():
        assert plan.pending[job_id].code == code, plan.pending[job_id]


def test_it_asks_to_be_woken_at_its_decision_time() -> None:
    plan = cycle([late(left=1000)], offers=(OD,))
    assert plan.wake_at == pytest.approx(NOW + 1000 - 60 - 300)
    assert launched(cycle([late(left=1000)], offers=(OD,), now=NOW + 640)) == \
        [(OD.id, 1, ("p",))]


def test_a_booting_instance_is_used_before_renting_another() -> None:
    first = cycle([late()])
    (launch,) = first.launches
    inst = Instance(launch.request_id, launch.offer_id, InstanceState.BOOTING,
                    requested_at=NOW)
    again = cycle([late()], instances=(inst,), now=NOW + 10)
    assert again.launches == ()
    assert again.pending["p"].code == "Bursting" and "booting" in again.pending["p"].message
    # a second job does not fit the one-GPU instance: it gets its own
    both = cycle([late(), late("q")], instances=(inst,), now=NOW + 10)
    assert launched(both) == [(SPOT.id, 1, ("q",))]


def test_request_ids_are_deterministic_and_distinct() -> None:
    a, b = cycle([late(), late("q")]), cycle([late(), late("q")])
    assert [x.request_id for x in a.launches] == [x.request_id for x in b.launches]
    assert len({x.request_id for x in a.launches}) == 2


def test_no_offers_no_change() -> None:
    """On-prem (no offers, no instances) the burst phase changes nothing."""
    queue = [late(), late("q", priority="critical", left=-100)]
    with_sla = cycle(queue, offers=())
    without = run_cycle(snap([node("a", 4)], queue, [running("r", 4, time_limit=20 * H)]),
                        replace(SLA, burst="none"), NOW)
    assert with_sla == without


@pytest.mark.parametrize(("prefer", "launches", "evictions"), [
    (0, [], {"v"}),  # preemption preferred: it stays and evicts
    (2, [(OD.id, 1, ("p",))], set()),  # bursting preferred: evictions for it dropped
    (1, [], {"v"}),  # the cheaper: the victim loses little (it checkpoints) against $6
])
def test_preempt_or_burst(prefer: int, launches: list[Any], evictions: set[str]) -> None:
    victim = running("v", 4, started=NOW - 3600, checkpoint_dir="/ck", time_limit=20 * H)
    plan = cycle([late(priority="critical", left=100)], active=[victim],
                 settings={"preempt_or_burst": prefer})
    assert launched(plan) == launches
    assert {p.job_id for p in plan.preemptions} == evictions
    assert all(p.for_job == "p" for p in plan.preemptions)


def test_preempt_or_burst_cheaper_bursts_when_victims_lose_much() -> None:
    victim = running("v", 4, started=NOW - 5 * H, time_limit=20 * H)  # no checkpoint: 20 GPU-h
    plan = cycle([late(priority="critical", left=100)], active=[victim],
                 settings={"preempt_or_burst": 1})
    assert launched(plan) == [(OD.id, 1, ("p",))]
    assert plan.preemptions == ()


def test_a_spot_offer_without_a_rate_takes_the_catalogs_median() -> None:
    from policies.burst.offers import CostModel
    from providers.catalog import DEFAULT_INTERRUPTION_RATE

    bare = replace(SPOT, extra={"boot_s": 60.0})
    assert CostModel().rate(bare) == DEFAULT_INTERRUPTION_RATE
    assert CostModel().rate(OD) == 0.0 and CostModel().rate(SPOT) == 0.05


def test_a_job_a_spot_interruption_sent_back_takes_spot_again_at_once() -> None:
    """With ``spot_failover``: its new SLA target is hours away and on-prem is forecast to
    start it in time, yet it fails over to spot at once (the on-prem queue would drain a node
    for it meanwhile); a job preempted on-prem for another reason waits for its decision
    time."""
    from broker.model.job import HistoryEntry
    from broker.model.state import EvictionKind, JobState

    def back(kind: EvictionKind) -> Job:
        j = late(left=5000)
        hist = (*j.history, HistoryEntry(JobState.STOPPING, NOW - 60, "stop", 1, kind),
                HistoryEntry(JobState.PENDING, NOW - 10, "back", 2))
        return replace(j, attempt=2, history=hist)

    soon = [running("r", 4, time_limit=10_000 - 1000 + 600)]  # on-prem frees in 10 minutes
    on = {"spot_failover": 1}
    assert launched(cycle([back(EvictionKind.SPOT)], active=soon, settings=on)) == \
        [(SPOT.id, 1, ("p",))]
    assert launched(cycle([back(EvictionKind.PRIORITY)], active=soon, settings=on)) == []
    assert launched(cycle([back(EvictionKind.SPOT)], active=soon)) == []  # off by default


def test_cheapest_returns_its_reason_and_tells_the_job_nothing() -> None:
    """``cheapest`` (policies/burst/choice.py) gives the offer, or the reason there is none,
    and leaves the job's reason to its caller; the burst phase's shared state is one
    ``Phase``."""
    from broker.cycle.scheduler import CycleState
    from broker.model import Reason
    from policies.burst.choice import Choice, cheapest, offers_for
    from policies.burst.offers import CostModel, Phase, region_room

    dear, fine = late("dear", max_price_per_hour=0.5), late("fine", max_price_per_hour=1.0)
    s = snap([node("a", 4)], [dear, fine], [running("r", 4, time_limit=20 * H)], now=NOW,
             offers=(SPOT, OD), settings={"sla": {}})
    cycle = CycleState(s, SLA, NOW)
    cfg = cycle.settings("sla")
    p = Phase(cycle, cfg, CostModel.of(cfg), region_room(cycle))
    cls = s.class_by_name["normal"]
    before = dict(cycle.pending)
    got = cheapest(p, dear, cls, offers_for(cycle, dear, cls), NOW + 100)
    assert isinstance(got, Reason) and got.code == "OverMaxPrice"
    ok = cheapest(p, fine, cls, offers_for(cycle, fine, cls), NOW + 100)
    assert isinstance(ok, Choice) and ok.offer == SPOT and ok.bin is None
    assert cycle.pending == before and p.new == [] and p.leaving == set()
