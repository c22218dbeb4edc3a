"""Queue orders (policies/order/orderings.py): fifo, priority-fifo, multifactor (slurm-like),
spillway."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.config.core import Team
from broker.cycle.plan import Reservation, Snapshot
from broker.cycle.scheduler import CycleState, run_cycle  # also registers the built-in policies
from broker.model import Job
from policies.order.orderings import SLURM_DEFAULTS
from policies.registry import PolicySet, lookup
from tests.builders import job, node, snapshot

DAY = 86400.0
NOW = 30 * DAY


def mk(job_id: str, priority: str = "normal", *, ago: float = 0.0, limit: float | None = None,
       team: str = "t", gpus: int = 1) -> Job:
    """A pending job submitted ``ago`` seconds before NOW."""
    j = job(job_id, gpus, priority=priority, submitted=NOW - ago, time_limit=limit)
    return replace(j, spec=j.spec.model_copy(update={"team": team}))


class StubPredictor:
    def __init__(self, estimates: dict[str, float]) -> None:
        self.estimates = estimates

    def estimate(self, j: Job, quantile: float | None = None) -> float:
        del quantile
        return self.estimates.get(j.id, j.spec.time_limit or float("inf"))


def snap(jobs: list[Job], **kw: object) -> Snapshot:
    return replace(snapshot([node("a", 8)], jobs, now=NOW), **kw)  # type: ignore[arg-type]


def ordered(name: str, jobs: list[Job], **kw: object) -> list[str]:
    cycle = CycleState(snap(jobs, **kw), PolicySet(), NOW)
    return [j.id for j in lookup("order", name)(cycle, jobs)]


# -- class rank first (except fifo; spillway: the urgent classes) ----------------------------------

CLASSES = [mk("lo", "low", ago=2 * DAY, limit=60), mk("nrm", "normal", ago=DAY),
           mk("hi", "high", ago=3600, limit=86400), mk("crit", "critical", ago=1.0, limit=86400)]


@pytest.mark.parametrize(("order", "want"), [
    pytest.param("priority-fifo", ["crit", "hi", "nrm", "lo"], id="priority-fifo"),
    pytest.param("multifactor", ["crit", "hi", "nrm", "lo"], id="multifactor"),
    pytest.param("fifo", ["lo", "nrm", "hi", "crit"], id="fifo ignores classes"),
])
@pytest.mark.parametrize("shuffle", [False, True], ids=["given", "reversed"])
def test_class_rank_first(order: str, want: list[str], shuffle: bool) -> None:
    jobs = list(reversed(CLASSES)) if shuffle else list(CLASSES)
    heavy = {"usage": {"t": 1e9}, "teams": (Team("t"), Team("idle"))}  # fair share cannot help
    assert ordered(order, jobs, **heavy) == want


@pytest.mark.parametrize("shuffle", [False, True], ids=["given", "reversed"])
def test_spillway_urgent_classes_first_by_rank(shuffle: bool) -> None:
    """The classes that may preempt (critical, high) come first, by rank, ahead of even a
    starving job; normal and low share the tier after them."""
    starving = mk("starving", "normal", ago=4 * DAY)
    jobs = [*CLASSES, starving]
    jobs = list(reversed(jobs)) if shuffle else jobs
    got = ordered("spillway", jobs, settings={"spillway": {"starve_after_s": 3 * DAY}})
    assert got[:3] == ["crit", "hi", "starving"]
    assert sorted(got[3:]) == ["lo", "nrm"]


def test_bundles_use_the_documented_orders() -> None:
    assert [PolicySet.named(n).order for n in ("fcfs", "slurm-like", "spillway")] == [
        "fifo", "multifactor", "spillway"]


@pytest.mark.parametrize("order", ["fifo", "priority-fifo"])
def test_fifo_orders_by_submission_then_id(order: str) -> None:
    jobs = [mk("b", ago=10), mk("c", ago=20), mk("a", ago=10)]
    assert ordered(order, jobs) == ["c", "a", "b"]


# -- multifactor (slurm-like) ---------------------------------------------------------------------

TEAMS = (Team("A"), Team("B"))

# (jobs, snapshot overrides, expected order)
MULTIFACTOR = {
    "fair share dominates age with the default weights": (
        [mk("heavy_old", team="A", ago=13 * DAY), mk("light_new", team="B", ago=60)],
        {"usage": {"A": 1000.0}, "teams": TEAMS}, ["light_new", "heavy_old"]),
    "without fair share weight, age decides": (
        [mk("heavy_old", team="A", ago=13 * DAY), mk("light_new", team="B", ago=60)],
        {"usage": {"A": 1000.0}, "teams": TEAMS,
         "settings": {"multifactor": {"weight_fairshare": 0.0}}}, ["heavy_old", "light_new"]),
    "equal shares: the older first": (
        [mk("new", team="A", ago=60), mk("old", team="B", ago=DAY)],
        {"teams": TEAMS}, ["old", "new"]),
    "large jobs favoured over a day's age": (
        [mk("small", ago=DAY), mk("big", gpus=8, ago=60)], {}, ["big", "small"]),
    "a fortnight's age outweighs size": (
        [mk("small", ago=14 * DAY), mk("big", gpus=8, ago=60)], {}, ["small", "big"]),
    "age stops growing at max_age_s: then the larger job": (
        [mk("small", ago=20 * DAY), mk("big", gpus=8, ago=14 * DAY)],
        {}, ["big", "small"]),
    "the class still comes first": (
        [mk("light", team="B", priority="low"), mk("heavy", team="A", priority="high")],
        {"usage": {"A": 1e6}, "teams": TEAMS}, ["heavy", "light"]),
}


@pytest.mark.parametrize(("jobs", "kw", "want"), list(MULTIFACTOR.values()),
                         ids=list(MULTIFACTOR))
def test_multifactor(jobs: list[Job], kw: dict[str, object], want: list[str]) -> None:
    assert ordered("multifactor", jobs, **kw) == want


def test_slurm_defaults_are_the_documented_weights() -> None:
    assert SLURM_DEFAULTS == {"weight_age": 1000.0, "max_age_s": 14 * DAY,
                              "weight_fairshare": 10000.0, "weight_jobsize": 1000.0}


# -- spillway ------------------------------------------------------------------------------------

HELD = Reservation("long", NOW + 3600, ("a",), "A100-80GB")
STARVE = 3 * 86400.0
STARVING = {"settings": {"spillway": {"starve_after_s": STARVE}}}
# a heavy team's short job and a light team's long one (the tier rows)
OWED = [mk("heavy_short", team="A", ago=3600, limit=600),
        mk("light_long", team="B", ago=60, limit=86400)]
# the long-tier rows: B (factor 0.76, under fairshare_tier) against A (0.33)
LONG = {"usage": {"A": 1000.0, "B": 250.0}, "teams": TEAMS}
LONG_ON = {**LONG, "settings": {"spillway": {"long_tier": 0.6, "long_tier_s": 14400.0}}}
LONG_JOBS = [mk("a_short", team="A", ago=3600, limit=600),
             mk("b_long", team="B", ago=60, limit=86400)]
MID_JOBS = [mk("a_short", team="A", ago=3600, limit=600),
            mk("b_mid", team="B", ago=60, limit=7200)]

# (jobs, snapshot overrides, expected order)
SPILLWAY = {
    "short waiting jobs rise above long ones": (
        [mk("long", ago=3600, limit=86400), mk("short", ago=3600, limit=600)],
        {}, ["short", "long"]),
    "a held reservation keeps its job first within its class": (
        [mk("long", ago=3600, limit=86400), mk("short", ago=3600, limit=600)],
        {"reservation": HELD}, ["long", "short"]),
    "a held reservation does not jump the urgent tier": (
        [mk("long", "low", ago=3600, limit=86400), mk("crit", "critical", limit=86400),
         mk("hi", "high", limit=86400)],
        {"reservation": HELD}, ["crit", "hi", "long"]),
    "a held reservation of a low job goes ahead of normal jobs (one tier)": (
        [mk("long", "low", ago=3600, limit=86400), mk("short", ago=3600, limit=600)],
        {"reservation": HELD}, ["long", "short"]),
    "normal and low share a tier: a long wait lifts a low job": (
        [mk("nrm", ago=60, limit=600), mk("lo", "low", ago=DAY, limit=600)], {}, ["lo", "nrm"]),
    "equal jobs: the heavier class weight first (normal 2, low 1)": (
        [mk("lo", "low", ago=3600, limit=3600), mk("nrm", ago=3600, limit=3600)],
        {"settings": {"spillway": {"class_weight": {"normal": 2.0, "low": 1.0}}}},
        ["nrm", "lo"]),
    "no class weight by default: then submit time": (
        [mk("lo", "low", ago=3700, limit=3600), mk("nrm", ago=3600, limit=3600)],
        {}, ["lo", "nrm"]),
    "class_weight is a setting": (
        [mk("lo", "low", ago=3600, limit=3600), mk("nrm", ago=3600, limit=3600)],
        {"settings": {"spillway": {"class_weight": {"normal": 1.0, "low": 3.0}}}},
        ["lo", "nrm"]),
    "a long wait lifts a long job above a fresh short one": (
        [mk("short", ago=60, limit=600), mk("long", ago=DAY, limit=3600)],
        {}, ["long", "short"]),
    "starving jobs go oldest first": (
        [mk("young_short", ago=STARVE + DAY / 2, limit=600),
         mk("old_long", ago=STARVE + DAY, limit=86400)], STARVING, ["old_long", "young_short"]),
    "starving jobs go oldest first, whatever their class weight": (
        [mk("young_nrm", ago=STARVE + DAY / 2, limit=600),
         mk("old_low", "low", ago=STARVE + DAY, limit=86400)], STARVING,
        ["old_low", "young_nrm"]),
    "a starving job passes every non-starving one": (
        [mk("fresh_short", ago=3600, limit=60), mk("starving", ago=STARVE + 1, limit=7 * DAY)],
        STARVING, ["starving", "fresh_short"]),
    "no starvation guard by default: the score alone": (
        [mk("fresh_short", ago=3600, limit=60), mk("old", ago=STARVE + 1, limit=7 * DAY)],
        {}, ["fresh_short", "old"]),
    "starve_after_s is a setting": (
        [mk("young_short", ago=DAY, limit=600), mk("old_long", ago=2 * DAY, limit=86400)],
        {"settings": {"spillway": {"starve_after_s": 1.5 * DAY}}}, ["old_long", "young_short"]),
    "not yet starving: by score": (
        [mk("young_short", ago=DAY, limit=600), mk("old_long", ago=2 * DAY, limit=86400)],
        {"settings": {"spillway": {"starve_after_s": 4 * DAY}}}, ["young_short", "old_long"]),
    "fair share scales the score": (
        [mk("heavy", team="A", ago=3600, limit=3600), mk("light", team="B", ago=3600,
                                                          limit=3600)],
        {"usage": {"A": 1000.0}, "teams": TEAMS}, ["light", "heavy"]),
    "a team owed service (factor >= 0.85) goes ahead of a heavy team's shorter job": (
        OWED,
        {"usage": {"A": 1000.0}, "teams": TEAMS}, ["light_long", "heavy_short"]),
    "fairshare_tier and long_tier are settings (0: off, the score alone)": (
        OWED,
        {"usage": {"A": 1000.0}, "teams": TEAMS,
         "settings": {"spillway": {"fairshare_tier": 0.0, "long_tier": 0.0}}},
        ["heavy_short", "light_long"]),
    "both teams owed service (a third used the most): the score decides between them": (
        [mk("a_long", team="A", ago=60, limit=86400),
         mk("b_short", team="B", ago=3600, limit=600),
         mk("c_short", team="C", ago=3600, limit=600)],
        {"usage": {"A": 1.0, "B": 10.0, "C": 1000.0}, "teams": TEAMS},
        ["b_short", "a_long", "c_short"]),
    "long_tier (0.6) by default: a team at or above it goes first with its long jobs": (
        LONG_JOBS, LONG, ["b_long", "a_short"]),
    "long_tier: 0 turns it off: the score alone": (
        LONG_JOBS, {**LONG, "settings": {"spillway": {"long_tier": 0.0}}}, ["a_short", "b_long"]),
    "long_tier is a setting": (
        LONG_JOBS, {**LONG, "settings": {"spillway": {"long_tier": 0.7}}}, ["b_long", "a_short"]),
    "long_tier: a team under it is not lifted": (
        LONG_JOBS, {**LONG, "settings": {"spillway": {"long_tier": 0.8}}},
        ["a_short", "b_long"]),
    "long_tier: the team's jobs shorter than long_tier_s are not lifted": (
        MID_JOBS, LONG_ON, ["a_short", "b_mid"]),
    "long_tier_s is a setting": (
        MID_JOBS, {**LONG, "settings": {"spillway": {"long_tier": 0.6, "long_tier_s": 3600.0}}},
        ["b_mid", "a_short"]),
    "long_tier reads the predicted median, not the limit": (
        LONG_JOBS, {**LONG_ON, "predictor": StubPredictor({"b_long": 7200.0})},
        ["a_short", "b_long"]),
    "predicted runtimes, not limits": (
        [mk("q", ago=3600, limit=3600), mk("p", ago=3600, limit=86400)],
        {"predictor": StubPredictor({"p": 700.0})}, ["p", "q"]),
    "limits without a predictor": (
        [mk("q", ago=3600, limit=3600), mk("p", ago=3600, limit=86400)],
        {}, ["q", "p"]),
    "estimates below min_estimate_s count as it (then submit time, id)": (
        [mk("b", ago=1000, limit=10), mk("a", ago=1000, limit=50)], {}, ["a", "b"]),
    "more GPUs: a larger effective estimate": (
        [mk("wide", gpus=4, ago=3600, limit=3600), mk("narrow", ago=3600, limit=3600)],
        {}, ["narrow", "wide"]),
}


@pytest.mark.parametrize(("jobs", "kw", "want"), list(SPILLWAY.values()), ids=list(SPILLWAY))
def test_spillway(jobs: list[Job], kw: dict[str, object], want: list[str]) -> None:
    assert ordered("spillway", jobs, **kw) == want
    assert ordered("spillway", list(reversed(jobs)), **kw) == want


def test_spillway_holder_keeps_the_reservation_through_a_cycle() -> None:
    """The scheduler reserves for the job the order puts first; spillway keeps it there."""
    from broker.model import Allocation
    from broker.model.state import JobState

    r1 = replace(job("r1", 8, state=JobState.RUNNING, time_limit=3600,
                     allocations=(Allocation("a", tuple(f"GPU-a-{i}" for i in range(8))),)),
                 started_at=NOW - 600)
    queue = [mk("long", ago=3600, limit=86400, gpus=8), mk("short", ago=3600, limit=600, gpus=8)]
    base = snapshot([node("a", 8)], queue, [r1], now=NOW)
    policy = PolicySet.named("spillway")
    first = run_cycle(base, policy)
    assert first.order == ("short", "long")
    assert first.reservation is not None and first.reservation.job_id == "short"
    held = run_cycle(replace(base, reservation=replace(first.reservation, job_id="long")), policy)
    assert held.order == ("long", "short")
    assert held.reservation is not None and held.reservation.job_id == "long"


# -- CPU-only jobs (issue 36: a --gpus 0 job stopped every cycle) ----------------------------------


@pytest.mark.parametrize("name", ["fifo", "priority-fifo", "multifactor", "spillway"])
def test_a_cpu_only_job_is_ordered_like_a_one_gpu_job(name: str) -> None:
    """Spillway's expected slowdown counts a CPU-only job as one GPU (it divided by zero);
    the other orders never divided by its GPUs."""
    cpu, one = mk("cpu", ago=DAY, limit=3600, gpus=0), mk("one", ago=DAY, limit=3600)
    jobs = [cpu, one, mk("big", ago=DAY, limit=3600, gpus=8)]
    order = ordered(name, jobs)
    assert sorted(order) == ["big", "cpu", "one"]
    if name == "spillway":  # same score as the 1-GPU job: then submit time, then id
        assert order.index("cpu") < order.index("big")
