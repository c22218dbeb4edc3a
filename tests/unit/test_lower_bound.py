"""The offline lower bound (broker/sim/lower_bound.py) on instances small enough to check by
hand, and against feasible schedules built by hand or greedily."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.sim.lower_bound import LbJob, LbOffer, LbPool, LbProblem, solve

H = 3600.0
OD = LbOffer("od", "aws:r", "V100", 1, 3.0, "aws:r:ondemand")
SPOT = LbOffer("spot", "aws:r", "V100", 1, 1.0, "aws:r:z:spot", "aws:z")
FAR = LbOffer("far", "aws:r2", "V100", 1, 5.0, "aws:r2:ondemand")
WIDE = LbOffer("wide", "aws:r", "V100", 8, 4.5, "aws:r:ondemand")  # dollars a GPU-hour
A100 = LbOffer("a100", "aws:r", "A100-40GB", 1, 4.0, "aws:r:ondemand")


def job(name: str, submit: float = 0.0, runtime: float = H, gpus: int = 1, *,
        sla: float = 0.0, cloud: bool = True, spot: bool = False, **kw: Any) -> LbJob:
    return LbJob(name, submit, runtime, gpus, sla_s=sla, cloud=cloud, spot=spot, **kw)


def first_hour_only(zone: str, t0: float, t1: float) -> float:
    return max(0.0, min(t1, H) - t0)


# name, jobs, on-prem GPUs (V100), offers, quotas, misses, spot seconds, cheapest cost
CASES: list[tuple[Any, ...]] = [
    ("one job, two offers: spot", [job("a", runtime=2 * H, spot=True)], 0, [OD, SPOT], {}, {},
     None, 2.0),
    ("one job, two offers: no spot for its class", [job("a", runtime=2 * H)], 0, [OD, SPOT], {},
     {}, None, 6.0),
    ("spot only in the first hour", [job("a", runtime=2 * H, spot=True)], 0, [OD, SPOT],
     {"aws:r": 4}, {}, first_hour_only, 1.0 + 3.0),
    ("on-prem suffices", [job("a"), job("b")], 2, [OD, SPOT], {}, {}, None, 0.0),
    ("capacity-bound: one of two on-prem", [job("a"), job("b")], 1, [OD], {}, {}, None, 3.0),
    ("a wait within the SLA gets on-prem", [job("a", cloud=False), job("b", sla=H)], 1, [OD],
     {}, {}, None, 0.0),
    ("deadline-bound: it must rent", [job("a", runtime=2 * H, cloud=False),
                                      job("b", sla=math.inf, deadline_s=2 * H)], 1, [OD], {},
     {}, None, 3.0),
    ("deadline loose enough to wait", [job("a", runtime=2 * H, cloud=False),
                                       job("b", sla=math.inf, deadline_s=3 * H)], 1, [OD], {},
     {}, None, 0.0),
    ("region quota: the second job to the dear region", [job("a", spot=True),
                                                         job("b", spot=True)], 0,
     [OD, SPOT, FAR], {"aws:r": 1}, {}, None, 1.0 + 5.0),
    ("one miss allowed: the largest job", [job("a", gpus=4), job("b")], 0, [OD], {},
     {"normal": 1}, None, 3.0),
    ("pinned to A100: not the V100s", [job("a", gpu_types=("A100",))], 2, [OD, A100], {}, {},
     None, 4.0),
    ("8 GPUs a node: only the 8-GPU instance holds it", [job("a", gpus=8)], 0, [OD, WIDE], {},
     {}, None, 8 * 4.5),
]


@pytest.mark.parametrize(("name", "jobs", "onprem", "offers", "quotas", "misses", "spot",
                          "want"), CASES, ids=[c[0] for c in CASES])
def test_the_bound_on_hand_checked_instances(name: str, jobs: list[LbJob], onprem: int,
                                             offers: list[LbOffer], quotas: Mapping[str, float],
                                             misses: Mapping[str, int], spot: Any,
                                             want: float) -> None:
    problem = LbProblem(tuple(jobs), (LbPool("V100-16GB", onprem),), tuple(offers), quotas,
                        spot)
    res = solve(problem, "cost", misses)
    assert res.status == "optimal"
    assert res.value == pytest.approx(want, abs=1e-6)
    assert res.variables > 0 and res.constraints > 0 and res.nonzeros > 0


def test_a_job_nothing_can_hold_in_time_is_infeasible_not_a_crash() -> None:
    problem = LbProblem((job("a", cloud=False, gpus=2),), (LbPool("V100", 1),))
    assert solve(problem).status == "infeasible"
    assert solve(problem, misses={"normal": 1}).value == pytest.approx(0.0)


def test_the_carbon_objective_waits_for_the_cleaner_hour() -> None:
    def rate(site: str, model: str, t0: float, t1: float) -> float:
        return 1.0 if t0 < H else 0.2  # kg per GPU-hour

    for sla, want in ((0.0, 1.0), (H, 0.2)):
        problem = LbProblem((job("a", sla=sla, cloud=False),), (LbPool("V100", 1),),
                            kg_per_gpu_hour=rate)
        assert solve(problem, "carbon").value == pytest.approx(want)


@pytest.mark.parametrize(("objective", "misses", "slot", "error"), [
    ("speed", {}, 900.0, "objective 'speed' is not allowed"),
    ("cost", {}, 0.0, "slot_s 0.0 is not allowed"),
    ("cost", {"normal": -1}, 900.0, r"misses\['normal'\]: -1 is not allowed"),
    ("carbon", {}, 900.0, "has no kg_per_gpu_hour"),
])
def test_bad_arguments_name_what_is_wrong(objective: str, misses: dict[str, int], slot: float,
                                          error: str) -> None:
    with pytest.raises(ValueError, match=error):
        solve(LbProblem((job("a"),), ()), objective, misses, slot)


def test_the_bound_is_below_a_schedule_built_by_hand() -> None:
    """Two on-prem GPUs; a (2 h) and b (1 h) start at 0 on-prem; c arrives at 30 min, finds
    no free GPU and rents on-demand for its hour: $3. The bound may not exceed it, and is
    above 0: c cannot all wait for b's GPU."""
    jobs = (job("a", runtime=2 * H), job("b"), job("c", 0.5 * H))
    res = solve(LbProblem(jobs, (LbPool("V100", 2),), (OD,)))
    assert 0.0 < res.value <= 3.0  # type: ignore[operator]


def _greedy(jobs: list[LbJob], gpus: int, price: float) -> float:
    """Start every job at its arrival: on-prem when enough GPUs are free, else on-demand."""
    ends: list[tuple[float, int]] = []
    cost = 0.0
    for j in sorted(jobs, key=lambda j: (j.submit_s, j.id)):
        busy = sum(g for end, g in ends if end > j.submit_s)
        if busy + j.gpus <= gpus:
            ends.append((j.submit_s + j.runtime_s, j.gpus))
        else:
            cost += price * j.gpu_hours
    return cost


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(1, 12), st.integers(1, 4),
                          st.sampled_from([0.0, 1800.0, 4 * H])), min_size=1, max_size=7),
       st.integers(0, 4))
def test_the_bound_never_exceeds_a_feasible_greedy_schedule(
        raw: list[tuple[int, int, int, float]], onprem: int) -> None:
    jobs = [job(f"j{i}", 900.0 * t, 900.0 * d, g, sla=sla)
            for i, (t, d, g, sla) in enumerate(raw)]
    four = LbOffer("od4", "aws:r", "V100", 4, 3.0, "aws:r:ondemand")  # holds every job here
    res = solve(LbProblem(tuple(jobs), (LbPool("V100", onprem),), (four, FAR)))
    assert res.status == "optimal"
    assert res.value <= _greedy(jobs, onprem, 3.0) + 1e-6  # type: ignore[operator]


def test_a_whole_job_may_not_pause_around_another() -> None:
    """One on-prem GPU. a (1 h) may start within an hour; b (1 h) arrives at 30 min and must
    start by 45 min. Paused, a runs 0-30 min and 90-120 min around b, and nothing is rented;
    run whole, a collides with b wherever it starts, so some of one must rent."""
    a = job("a", runtime=H, sla=H)
    b = job("b", 0.5 * H, H, sla=0.25 * H)
    onprem = (LbPool("V100", 1),)
    assert solve(LbProblem((a, b), onprem, (OD,))).value == pytest.approx(0.0)
    whole = solve(LbProblem((replace(a, whole=True), replace(b, whole=True)), onprem, (OD,)))
    assert whole.status == "optimal"
    assert 0.5 < whole.value <= 3.0  # type: ignore[operator]


def test_a_whole_job_is_not_split_between_on_prem_and_the_cloud() -> None:
    """One on-prem GPU busy for the first hour with a job that may not burst; a 1-GPU job of
    two hours must start at once. Relaxed, it rents its first hour and moves on-prem for the
    second ($3); whole, it rents both ($6)."""
    busy = job("busy", cloud=False)
    a = job("a", runtime=2 * H)
    onprem = (LbPool("V100", 1),)
    assert solve(LbProblem((busy, a), onprem, (OD,))).value == pytest.approx(3.0)
    whole = solve(LbProblem((busy, replace(a, whole=True)), onprem, (OD,)))
    assert whole.value == pytest.approx(6.0)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(1, 12), st.integers(1, 4),
                          st.sampled_from([0.0, 1800.0, 4 * H])), min_size=1, max_size=7),
       st.integers(0, 4), st.sampled_from([900.0, 1800.0, 3600.0]))
def test_the_whole_bound_lies_between_the_relaxed_one_and_a_greedy_schedule(
        raw: list[tuple[int, int, int, float]], onprem: int, slot: float) -> None:
    """The greedy schedule never pauses a job, so it is one the whole program must admit; the
    whole program only adds rows to the relaxed one."""
    jobs = [job(f"j{i}", 900.0 * t, 900.0 * d, g, sla=sla)
            for i, (t, d, g, sla) in enumerate(raw)]
    four = LbOffer("od4", "aws:r", "V100", 4, 3.0, "aws:r:ondemand")
    pools = (LbPool("V100", onprem),)
    relaxed = solve(LbProblem(tuple(jobs), pools, (four, FAR)), slot_s=slot)
    whole = solve(LbProblem(tuple(replace(j, whole=True) for j in jobs), pools, (four, FAR)),
                  slot_s=slot)
    assert whole.status == "optimal"
    assert relaxed.value - 1e-6 <= whole.value <= _greedy(jobs, onprem, 3.0) + 1e-6  # type: ignore[operator]
