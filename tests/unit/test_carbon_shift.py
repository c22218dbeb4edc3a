"""Deferrable work on the GPUs that spend the least energy on it (policies/carbon/place.py) and
pausing plans cut to the forecast's horizon (policies/carbon/wait.py ``within_forecast``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from broker.config.core import DEFAULT_CLASSES
from broker.cycle.scheduler import run_cycle
from broker.model import PriorityClass, Site
from broker.model.state import EvictionKind
from policies.carbon.place import energy_per_work, greenest_first
from policies.carbon.wait import within_forecast
from policies.registry import PolicySet
from tests.builders import job, node, snapshot
from tests.unit.test_carbon_wait import order_cycle

H = 3600.0
FLEX = (*DEFAULT_CLASSES, PriorityClass("flex", 150, 24 * H, flexible=True))
PLACE = PolicySet(order="fifo", place="aligned-carbon", name="t")
WAIT = PolicySet(order="fifo", admit="carbon-wait", defer="carbon-start", name="t")
# 300 g/kWh but from 06:00 to 14:00 (100), hourly over two days
DAY = tuple((h * H, 100.0 if 6 <= h % 24 < 14 else 300.0) for h in range(48))


# (now, work left, latest end, forecast's last step) -> (work, end) planned
HORIZON_ROWS: dict[str, tuple[tuple[float, float, float, float], tuple[float, float]]] = {
    "the window ends inside the forecast: as it is": (
        (0, 10 * H, 40 * H, 48 * H),
        (10 * H, 40 * H),
    ),
    "a quarter of a long window: a quarter of the known hours": (
        (0, 100 * H, 400 * H, 48 * H),
        (12 * H, 48 * H),
    ),
    "from a later now, half the time left": ((10 * H, 50 * H, 110 * H, 58 * H), (24 * H, 58 * H)),
    "no slack: all of the known hours": ((0, 500 * H, 400 * H, 48 * H), (48 * H, 48 * H)),
    "no forecast ahead: as it is": ((50 * H, 10 * H, 400 * H, 48 * H), (10 * H, 400 * H)),
}


@pytest.mark.parametrize("name", HORIZON_ROWS)
def test_a_pausing_plan_is_cut_to_the_forecast(name: str) -> None:
    args, want = HORIZON_ROWS[name]
    assert within_forecast(*args) == pytest.approx(want)


@pytest.mark.parametrize(
    ("model", "ref", "watts"),
    [
        ("V100-32GB", None, 300 * 1.46),  # board power x (1 + node overhead), same runtime
        ("H100-80GB", None, 700 * 1.82),
        ("A100-80GB", None, 400 * 2.03),
        ("H100-80GB", "V100", 700 * 1.82 / 4.2),  # measured on a V100: an H100 is 4.2 x faster
        ("V100-32GB", "V100", 300 * 1.46),
    ],
)
def test_energy_per_unit_of_work(model: str, ref: str | None, watts: float) -> None:
    assert energy_per_work(model, ref) == pytest.approx(watts / 1000)


def test_greenest_first() -> None:
    kinds = [("H100-80GB", None), ("A100-80GB", None), ("V100-32GB", None)]
    assert [k[0] for k in greenest_first(kinds, None)] == ["V100-32GB", "A100-80GB", "H100-80GB"]
    assert [k[0] for k in greenest_first(kinds, "V100")] == ["H100-80GB", "A100-80GB", "V100-32GB"]


# (job's priority, its gpu_types, the nodes with room) -> the node it starts on
PLACE_ROWS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...], str]] = {
    "flexible, speed-neutral: the lowest-power model": ("flex", (), ("v", "h"), "v"),
    "flexible, only an H100 free: the H100": ("flex", (), ("h",), "h"),
    "not deferrable: the fastest model (aligned)": ("normal", (), ("v", "h"), "h"),
    "flexible, measured on a V100: the least power over speed": (
        "flex",
        ("V100", "H100"),
        ("v", "h"),
        "h",
    ),
    "flexible, A100 against V100, speed-neutral": ("flex", (), ("v", "a"), "v"),
}
MODELS = {"v": "V100-32GB", "h": "H100-80GB", "a": "A100-80GB"}


@pytest.mark.parametrize("name", PLACE_ROWS)
def test_deferrable_work_goes_where_it_spends_least(name: str) -> None:
    priority, types, free, want = PLACE_ROWS[name]
    j = job("j", 1, priority=priority, gpu_types=types, time_limit=2 * H)
    nodes = [node(n, 1, MODELS[n]) for n in free]
    snap = replace(snapshot(nodes, [j]), classes=FLEX)
    plan = run_cycle(snap, PLACE, snap.now)
    assert [(s.job_id, s.allocations[0].node_id) for s in plan.starts] == [("j", want)]


@pytest.mark.parametrize(
    ("deadline", "paused"),
    [
        (1000 * H, True),  # a tenth of what is left: it runs the clean hours only
        (105 * H, False),  # nearly all of the time left: it runs on through the dirty hours
    ],
)
def test_a_long_job_pauses_for_its_share_of_the_forecast(deadline: float, paused: bool) -> None:
    from tests.unit.test_preemption import running

    r = running(
        "r",
        1,
        on="n",
        started=-H,
        priority="low",
        time_limit=100 * H,
        deadline=deadline,
        checkpoint_dir="/ckpt",
        sites=("onprem",),
    )
    snap = replace(
        snapshot([node("n", 1)], [], [r], now=0.0),
        classes=FLEX,
        sites=(Site(carbon_zone="US-CAL-CISO"),),
        carbon_forecast={"US-CAL-CISO": DAY},
        settings={"carbon": {"step_s": H}, "carbon-wait": {"pause": 1}},
    )
    plan = run_cycle(snap, WAIT, 0.0)
    got: list[Any] = [(p.job_id, p.kind) for p in plan.preemptions]
    assert got == ([("r", EvictionKind.CARBON)] if paused else [])
    if paused:
        assert plan.wake_at == 6 * H


# (hours waited since submission, started for how many hours (None: never), deadline in hours
# from now (None: none), time limit in hours) -> out of slack? (class SLA 24 h, sla_share 0.5)
SLACK_ROWS: dict[str, tuple[float, float | None, float | None, float, bool]] = {
    "waited 2 h of its 24 h SLA": (2, None, None, 4, False),
    "waited 12 h, half its SLA: goes ahead": (12, None, None, 4, True),
    "started, no deadline: the SLA is met": (30, 1, None, 4, False),
    "started, deadline far: slack left": (30, 1, 100, 4, False),
    "started, 3 h of its limit left, deadline in 14 h: 11 h slack": (30, 1, 14, 4, True),
    "started, 3 h left, deadline in 16 h: 13 h slack": (30, 1, 16, 4, False),
}


@pytest.mark.parametrize("name", SLACK_ROWS)
def test_out_of_slack(name: str) -> None:
    from broker.model import Attempt
    from policies.carbon.wait import out_of_slack
    from policies.cycle import Memory

    waited, ran, deadline, limit, want = SLACK_ROWS[name]
    now = 100 * H
    j = job(
        "j",
        1,
        priority="flex",
        submitted=now - waited * H,
        time_limit=limit * H,
        deadline=None if deadline is None else now + deadline * H,
    )
    if ran is not None:
        j = replace(j, attempts=(Attempt(1, (), now - 10 * H, now - 10 * H + ran * H),))
    snap = replace(snapshot([node("n", 1)], [j], now=now), classes=FLEX)

    class _C:
        def __init__(self) -> None:
            self.snap, self.now, self.memory = snap, now, Memory()

        def settings(self, name: str) -> dict[str, Any]:
            from policies.registry import settings_of

            return settings_of({}, name)

        def estimate(self, job: Any) -> float:
            return float(job.spec.time_limit)

    assert out_of_slack(_C(), j) is want  # type: ignore[arg-type]


# (now, job b holds the reservation, hours flexible job a has waited) -> the order
ORDER_ROWS: dict[str, tuple[float, bool, float, list[str]]] = {
    "dirty: a waits behind b": (0.0, False, 0, ["crit", "b", "a"]),
    "clean: a leads": (7 * H, False, 0, ["crit", "a", "b"]),
    "clean, b holds the reservation: b keeps its place": (7 * H, True, 0, ["crit", "b", "a"]),
    "dirty, a out of slack (waited 12 h of 24): a leads": (0.0, False, 12, ["crit", "a", "b"]),
}


@pytest.mark.parametrize("name", ORDER_ROWS)
def test_the_carbon_order(name: str) -> None:
    from broker.cycle.plan import Reservation
    from policies.carbon.wait import spillway_carbon

    now, held, waited, want = ORDER_ROWS[name]
    a = job("a", 1, submitted=now - waited * H, priority="flex", time_limit=2 * H)
    b = job("b", 1, submitted=now - waited * H + 1, priority="normal", time_limit=2 * H)
    crit = job("crit", 1, submitted=now - waited * H + 2, priority="critical", time_limit=2 * H)
    ahead = tuple((t, g) for t, g in DAY if t >= now)
    snap = replace(
        snapshot([node("n", 1)], [a, b, crit], now=now),
        classes=FLEX,
        sites=(Site(carbon_zone="US-CAL-CISO"),),
        carbon_forecast={"US-CAL-CISO": ahead},
        reservation=Reservation("b", now + H, ("n",), "A100-80GB") if held else None,
    )

    assert [j.id for j in spillway_carbon(order_cycle(snap, now), [a, b, crit])] == want


def test_the_jobs_out_of_slack_go_soonest_due_first() -> None:
    """Two flexible jobs out of slack: spillway's order puts the older first; the carbon
    order puts first the one that must start sooner (its deadline less its limit)."""
    from policies.carbon.wait import must_start_by, spillway_carbon
    from policies.order.orderings import spillway

    now = 100 * H
    old = job("old", 4, submitted=now - 13 * H, priority="flex", time_limit=2 * H)
    due = job("due", 4, submitted=now - 12.5 * H, priority="flex", time_limit=2 * H,
              deadline=now + 5 * H)
    snap = replace(snapshot([node("n", 8)], [old, due], now=now), classes=FLEX,
                   sites=(Site(carbon_zone="US-CAL-CISO"),),
                   carbon_forecast={"US-CAL-CISO": DAY})
    cyc = order_cycle(snap, now)
    assert [j.id for j in spillway(cyc, [old, due])] == ["old", "due"]
    assert (must_start_by(cyc, old), must_start_by(cyc, due)) == (now + 11 * H, now + 3 * H)
    assert [j.id for j in spillway_carbon(cyc, [old, due])] == ["due", "old"]


# (reserve policy, hours flexible job G has waited, G's limit in hours) -> what starts on the
# one free GPU: the head H (a 2 x 4-GPU gang) waits 10 h for node a; G (4 GPUs) could have
# node b in 1 h; "small" (1 GPU, 5 h) would hold a GPU of b past then, "tiny" (0.5 h) not
GUARD_ROWS: dict[str, tuple[str, float, float, str]] = {
    "easy: small backfills and G waits on": ("easy", 13, 1, "small"),
    "easy-deadline, G out of slack: a guard keeps b for it": ("easy-deadline", 13, 1, "tiny"),
    "easy-deadline, G not out of slack: no guard": ("easy-deadline", 1, 1, "small"),
    "easy-deadline, G would outlive the head's start: no guard": ("easy-deadline", 13, 20,
                                                                  "small"),
}


@pytest.mark.parametrize("name", GUARD_ROWS)
def test_a_job_out_of_slack_behind_the_head_keeps_the_gpus_it_needs(name: str) -> None:
    from broker.model import Allocation
    from broker.model.state import JobState
    from tests.builders import job as make

    reserve, waited, limit, want = GUARD_ROWS[name]
    now = 100 * H

    def running(job_id: str, n: int, on: str, hours_left: float) -> Any:
        j = make(job_id, n, state=JobState.RUNNING, time_limit=(hours_left + 1) * H,
                 allocations=(Allocation(on, tuple(f"GPU-{on}-{i}" for i in range(n))),))
        return replace(j, started_at=now - H)

    wall, busy = running("wall", 4, "a", 10), running("busy", 3, "b", 1)
    head = job("H", 4, nodes=2, submitted=now - 20 * H, time_limit=5 * H)
    g = job("G", 4, priority="flex", submitted=now - waited * H, time_limit=limit * H)
    small = job("small", 1, submitted=now - 0.5 * H, time_limit=5 * H)
    tiny = job("tiny", 1, submitted=now - 0.4 * H, time_limit=0.5 * H)
    snap = replace(snapshot([node("a", 4), node("b", 4)], [head, g, small, tiny],
                            [wall, busy], now=now), classes=FLEX)
    policies = PolicySet(order="fifo", reserve=reserve, estimate="limit", evict=(), name="t")
    plan = run_cycle(snap, policies, now)
    assert [s.job_id for s in plan.starts] == [want]
    assert plan.reservation is not None and plan.reservation.job_id == "H"
    assert plan.reservation.start_at == now + 10 * H


LOW = PolicySet(order="fifo", admit="carbon-wait", place="aligned-carbon",
                defer="carbon-start", name="t")
FLAT = tuple((h * H, 200.0) for h in range(48))  # no cleaner hour: only the GPUs matter


# (job's priority, hours it has waited, the cluster's nodes, those busy, low_power_factor) ->
# where it starts (None: it waits), and whether the wait is a low-power one
LOW_POWER_ROWS: dict[str, tuple[str, float, str, str, float, tuple[str | None, bool]]] = {
    "a V100 free: it starts there": ("flex", 0, "vh", "", 1.5, ("v", False)),
    "only the H100 free: it waits for the V100": ("flex", 0, "vh", "v", 1.5, (None, True)),
    "only the A100 free, factor 1.5 (an A100 needs 1.85x): waits": (
        "flex", 0, "va", "v", 1.5, (None, True)),
    "only the A100 free, factor 2: the A100 is low-power enough": (
        "flex", 0, "va", "v", 2.0, ("a", False)),
    "waited 2 h of its 24 h SLA: it waits on": ("flex", 2, "vh", "v", 1.5, (None, True)),
    "waited 3 h, an eighth of its SLA: the H100": ("flex", 3, "vh", "v", 1.5, ("h", False)),
    "no V100 in the cluster: the H100": ("flex", 0, "hh", "", 1.5, ("h", False)),
    "nothing free: it waits in the queue, not for low power": ("flex", 0, "vh", "vh", 1.5,
                                                               (None, False)),
    "factor 0 (off): the H100": ("flex", 0, "vh", "v", 0.0, ("h", False)),
    "not deferrable: the H100": ("normal", 0, "vh", "v", 1.5, ("h", False)),
}


@pytest.mark.parametrize("name", LOW_POWER_ROWS)
def test_deferrable_work_waits_for_low_power_gpus(name: str) -> None:
    from tests.unit.test_preemption import running

    priority, waited, models, busy, factor, (want, low_wait) = LOW_POWER_ROWS[name]
    now = 100 * H
    nodes = [node(f"{m}{i}", 1, MODELS[m]) for i, m in enumerate(models)]
    hogs = [running(f"hog{n.id}", 1, on=n.id, priority="critical")
            for n in nodes if n.id[0] in busy]
    j = job("j", 1, priority=priority, submitted=now - waited * H, time_limit=2 * H,
            sites=("onprem",))
    snap = replace(snapshot(nodes, [j], hogs, now=now), classes=FLEX,
                   sites=(Site(carbon_zone="US-CAL-CISO"),),
                   carbon_forecast={"US-CAL-CISO": tuple((now + t, g) for t, g in FLAT)},
                   settings={"carbon": {"step_s": H},
                             "carbon-wait": {"low_power_factor": factor}})
    plan = run_cycle(snap, LOW, now)
    assert [s.allocations[0].node_id[0] for s in plan.starts] == ([want] if want else [])
    why = plan.pending.get("j")
    assert (why is not None and "lower-power GPUs" in why.message) is low_wait, why
    if low_wait:
        assert why is not None and why.code == "DeferredForCarbon"
        assert plan.wake_at == j.submitted_at + 3 * H  # low_power_share 0.125 of its SLA
