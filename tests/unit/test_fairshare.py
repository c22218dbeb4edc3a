"""Fair share (policies/order/fairshare.py): Slurm's classic ``F = 2 ** (-U / S)``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.config.core import Team
from broker.cycle.plan import Snapshot
from broker.model import Allocation, Job
from broker.model.state import JobState
from policies.order.fairshare import fairshare_factors, gpus_in_use, team_usage
from tests.builders import job, node, snapshot

NOW = 1000.0


def of_team(j: Job, team: str) -> Job:
    return replace(j, spec=j.spec.model_copy(update={"team": team}))


def running(job_id: str, team: str, gpus: int, started: float | None) -> Job:
    j = job(job_id, gpus, state=JobState.RUNNING,
            allocations=(Allocation("a", tuple(f"GPU-a-{i}" for i in range(gpus))),))
    return replace(of_team(j, team), started_at=started)


def snap(teams=(), usage=None, active=(), pending=()) -> Snapshot:  # type: ignore[no-untyped-def]
    s = snapshot([node("a", 8)], list(pending), list(active), now=NOW)
    return replace(s, teams=tuple(teams), usage=dict(usage or {}))


AB = (Team("A"), Team("B"))

# (teams, usage, active, pending, factors)
CASES = {
    "no usage at all: 1.0 for every team": (AB, {}, (), (), {"A": 1.0, "B": 1.0}),
    "used exactly its share: 0.5": (AB, {"A": 50.0, "B": 50.0}, (), (), {"A": 0.5, "B": 0.5}),
    "one team used everything": (AB, {"A": 100.0}, (), (), {"A": 0.25, "B": 1.0}),
    "heavier use, lower factor": (AB, {"A": 75.0, "B": 25.0}, (), (),
                                  {"A": 2 ** -1.5, "B": 2 ** -0.5}),
    "weights: a team weighted 3 may use 3/4": (
        (Team("A", weight=3), Team("B")), {"A": 75.0, "B": 25.0}, (), (),
        {"A": 0.5, "B": 0.5}),
    "weights: same usage, the heavier weight fares better": (
        (Team("A", weight=3), Team("B")), {"A": 50.0, "B": 50.0}, (), (),
        {"A": 2 ** (-0.5 / 0.75), "B": 2 ** (-0.5 / 0.25)}),
    "running jobs count (GPUs x seconds so far)": (
        AB, {}, (running("r", "A", 2, NOW - 50),), (), {"A": 0.25, "B": 1.0}),
    "running jobs add to the decayed usage": (
        AB, {"B": 100.0}, (running("r", "A", 2, NOW - 50),), (), {"A": 0.5, "B": 0.5}),
    "a job not yet running adds nothing": (
        AB, {"B": 100.0}, (running("r", "A", 2, None),), (), {"A": 1.0, "B": 0.25}),
    "teams from the queue count with weight 1": (
        (Team("A"),), {"A": 100.0}, (), (of_team(job("p"), "Q"),), {"A": 0.25, "Q": 1.0}),
    "teams seen only in the usage count with weight 1": (
        (), {"A": 30.0, "B": 10.0, "C": 0.0}, (), (),
        {"A": 2 ** -(0.75 * 3), "B": 2 ** -(0.25 * 3), "C": 1.0}),
}


@pytest.mark.parametrize(("teams", "usage", "active", "pending", "want"),
                         list(CASES.values()), ids=list(CASES))
def test_fairshare_factors(teams, usage, active, pending, want) -> None:  # type: ignore[no-untyped-def]
    got = fairshare_factors(snap(teams, usage, active, pending))
    assert got == pytest.approx(want)
    assert all(0.0 < f <= 1.0 for f in got.values())


@pytest.mark.parametrize("heavier", [10.0, 100.0, 1000.0, 1e6])
def test_more_use_never_raises_the_factor(heavier: float) -> None:
    light = fairshare_factors(snap(AB, {"A": 10.0, "B": 10.0}))["A"]
    heavy = fairshare_factors(snap(AB, {"A": 10.0 + heavier, "B": 10.0}))["A"]
    assert heavy < light


def test_team_usage_and_gpus_in_use() -> None:
    s = snap(AB, {"A": 5.0}, (running("r1", "A", 2, NOW - 10), running("r2", "B", 4, NOW - 1),
                              running("r3", "B", 1, None)))
    assert team_usage(s) == {"A": 25.0, "B": 4.0}
    assert gpus_in_use(s) == {"A": 2, "B": 5}
