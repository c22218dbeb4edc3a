"""Carbon waits decided before placement (policies/carbon/wait.py): who waits, until when, and
that the GPUs a waiting job leaves go to the job behind it in the same cycle."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from broker.config.core import DEFAULT_CLASSES
from broker.cycle.plan import Plan
from broker.cycle.scheduler import run_cycle
from broker.model import PriorityClass, Site
from policies.cycle import Memos
from policies.registry import PolicySet
from tests.builders import job, node, snapshot

H = 3600.0
NOW = 0.0
WAIT = PolicySet(order="fifo", admit="carbon-wait", defer="carbon-start", name="t")
# 300 g/kWh until 06:00, 100 from 06:00 to 14:00, 300 after (hourly steps over two days)
DAY = tuple((h * H, 100.0 if 6 <= h % 24 < 14 else 300.0) for h in range(48))
FLEX = (*DEFAULT_CLASSES, PriorityClass("flex", 150, 24 * H, flexible=True))


def cycle(first: dict[str, Any], *, settings: dict[str, Any] | None = None,
          forecast: tuple[tuple[float, float], ...] = DAY, gpus: int = 1) -> Plan:
    """One node of ``gpus`` GPUs; job ``a`` (``first``'s spec, 2 h) then ``b`` (normal, 2 h,
    not deferrable) in strict submission order."""
    spec = {"priority": "flex", "time_limit": 2 * H, "sites": ("onprem",), **first}
    a = job("a", 1, submitted=NOW, **spec)
    b = job("b", 1, submitted=NOW + 1, priority="normal", time_limit=2 * H, sites=("onprem",))
    snap = replace(snapshot([node("n", gpus)], [a, b], now=NOW), classes=FLEX,
                   sites=(Site(carbon_zone="US-CAL-CISO"),),
                   carbon_forecast={"US-CAL-CISO": forecast},
                   settings={"carbon": {"step_s": H}, **(settings or {})})
    return run_cycle(snap, WAIT, NOW)


# (job a's spec, settings, does a wait, b starts)
ROWS: dict[str, tuple[dict[str, Any], dict[str, Any], bool]] = {
    "flexible: waits for 06:00": ({}, {}, True),
    "a deadline: waits too": ({"priority": "low", "deadline": 20 * H}, {}, True),
    "a deadline too close: starts now": ({"priority": "low", "deadline": 3 * H}, {}, False),
    "neither deadline nor flexible: starts now": ({"priority": "normal"}, {}, False),
    "the window opens past its SLA share: starts now": (
        {}, {"carbon-wait": {"sla_share": 0.2}}, False),
    "it may go to the cloud (zone unknown before placement), placed, then waits": (
        {"sites": ("onprem", "cloud")}, {}, True),
    "a carbon price, waiting costs more than it saves: starts now": (
        {}, {"objective": {"carbon_usd_per_tonne": 100},
             "carbon-wait": {"wait_usd_per_gpu_hour": 1.0}}, False),
    "a carbon price, waiting cheap: waits": (
        {}, {"objective": {"carbon_usd_per_tonne": 100},
             "carbon-wait": {"wait_usd_per_gpu_hour": 0.001}}, True),
    "it must save 80%: starts now": ({}, {"carbon": {"step_s": H, "min_saving": 0.8}}, False),
}


@pytest.mark.parametrize("name", ROWS)
def test_who_waits(name: str) -> None:
    spec, settings, waits = ROWS[name]
    plan = cycle(spec, settings=settings, gpus=2)
    started = {s.job_id for s in plan.starts}
    assert ("a" not in started) is waits
    assert "b" in started
    if waits:
        why = plan.pending["a"]
        assert why.code == "DeferredForCarbon"
        assert "until 1970-01-01 06:00 UTC (in 6.0h)" in why.message
        assert plan.wake_at == 6 * H


def test_the_gpu_a_waiting_job_leaves_goes_to_the_next_job_in_the_same_cycle() -> None:
    plan = cycle({}, gpus=1)
    assert [s.job_id for s in plan.starts] == ["b"]
    # a job that may go to the cloud is placed first, then waits: its GPU stays idle
    placed = cycle({"sites": ("onprem", "cloud")}, gpus=1)
    assert placed.starts == () and placed.pending["a"].code == "DeferredForCarbon"


def test_at_the_window_it_starts_and_a_flat_forecast_never_waits() -> None:
    later = tuple((t - 6 * H, g) for t, g in DAY if t >= 6 * H)
    assert {s.job_id for s in cycle({}, forecast=later, gpus=2).starts} == {"a", "b"}
    flat = tuple((h * H, 200.0) for h in range(48))
    assert {s.job_id for s in cycle({}, forecast=flat, gpus=2).starts} == {"a", "b"}
    assert {s.job_id for s in cycle({}, forecast=(), gpus=2).starts} == {"a", "b"}


@pytest.mark.parametrize(("now", "first"), [(NOW, ["crit", "b", "a"]),  # dirty: a waits
                                            (7 * H, ["crit", "a", "b"])])  # clean: a leads
def test_the_carbon_order_gives_the_clean_hours_to_deferrable_work(
        now: float, first: list[str]) -> None:
    from policies.carbon.wait import spillway_carbon

    a = job("a", 1, submitted=NOW, priority="flex", time_limit=2 * H)
    b = job("b", 1, submitted=NOW + 1, priority="normal", time_limit=2 * H)
    crit = job("crit", 1, submitted=NOW + 2, priority="critical", time_limit=2 * H)
    ahead = tuple((t, g) for t, g in DAY if t >= now)
    snap = replace(snapshot([node("n", 1)], [a, b, crit], now=now), classes=FLEX,
                   sites=(Site(carbon_zone="US-CAL-CISO"),),
                   carbon_forecast={"US-CAL-CISO": ahead})

    assert [j.id for j in spillway_carbon(order_cycle(snap, now), [a, b, crit])] == first


@pytest.mark.parametrize(("factor", "cls", "want"), [
    (0.0, FLEX[-1], None),  # no factor: no deadlines
    (2.0, FLEX[-1], 100 + 24 * H + 2 * 5 * H),  # submit + SLA + 2 x its time limit
    (2.0, DEFAULT_CLASSES[0], None),  # not a flexible class
    (2.0, None, None),
])
def test_simulated_deadlines(factor: float, cls: Any, want: float | None) -> None:
    from broker.sim.carbon_metrics import sim_deadline

    assert sim_deadline({"sim_deadlines": {"factor": factor}}, cls, 100.0, 5 * H) == want


@pytest.mark.parametrize(("pause", "deadline", "paused"), [
    (1, 40 * H, True),  # a dirty peak now, clean hours at 06:00 and time to spare: it pauses
    (0, 40 * H, False),  # pausing off: it runs on
    (1, 5 * H, False),  # its limit (4 h) leaves no slack before the deadline: it runs on
    # its limit's 4 h to plan, clean hours 06:00-14:00, its deadline at 14:00: it could pause
    # until 06:00 and end at 10:00, but that is within the margin it keeps before its deadline
    # (half the low class's SLA, 12 h: it must end by 02:00): it runs on
    (1, 14 * H, False),
    (1, 22 * H, True),  # deadline 22:00: it must end by 10:00, and pauses until 06:00
])
def test_a_running_job_pauses_through_a_dirty_peak(pause: int, deadline: float,
                                                   paused: bool) -> None:
    from broker.model.state import EvictionKind
    from tests.unit.test_preemption import running

    r = running("r", 1, on="n", started=NOW - H, priority="low", time_limit=4 * H,
                deadline=deadline, checkpoint_dir="/ckpt", sites=("onprem",))
    snap = replace(snapshot([node("n", 1)], [], [r], now=NOW), classes=FLEX,
                   sites=(Site(carbon_zone="US-CAL-CISO"),),
                   carbon_forecast={"US-CAL-CISO": DAY},
                   settings={"carbon": {"step_s": H}, "carbon-wait": {"pause": pause}})
    plan = run_cycle(snap, WAIT, NOW)
    assert [(p.job_id, p.kind) for p in plan.preemptions] == (
        [("r", EvictionKind.CARBON)] if paused else [])
    if paused:
        assert plan.wake_at == 6 * H and "for 6.0h" in plan.preemptions[0].reason


class OrderCycle(Memos):
    """Just what an order policy reads of a cycle: its snapshot, time, memory, memos and
    settings (each at its defaults), no fair share."""

    def __init__(self, snap: Any, now: float) -> None:
        from policies.cycle import Memory

        super().__init__()
        self.snap, self.now, self.memory = snap, now, Memory()

    @property
    def fairshare(self) -> dict[str, float]:
        return {}

    def settings(self, name: str) -> dict[str, Any]:
        from policies.registry import settings_of

        return settings_of({}, name)


def order_cycle(snap: Any, now: float) -> Any:
    """An :class:`OrderCycle`, typed as the cycle the order policies take."""
    return OrderCycle(snap, now)
