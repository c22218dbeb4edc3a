"""EASY backfill in the scheduling cycle (broker/cycle/scheduler.py, policies/place/backfill.py).

Times: ``now`` is 100 unless a row says otherwise; running jobs' estimates are their time
limits (``estimate="limit"``) unless a row uses a stub predictor.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.cycle.plan import Plan, Snapshot
from broker.cycle.scheduler import run_cycle
from broker.model import Allocation, Job
from broker.model.state import JobState
from policies.place.backfill import Shadow, release_profile, reserve
from policies.place.placement import FreeIndex
from policies.registry import PolicySet
from tests.builders import job, node, snapshot

EASY = PolicySet(order="priority-fifo", reserve="easy", evict=(), name="easy")
FCFS = PolicySet.named("fcfs")
PREDICTED = replace(EASY, estimate="predictor")


def running(job_id: str, n: int, on: str = "a", *, first: int = 0, started: float = 0.0,
            nodes: tuple[str, ...] | None = None, state: JobState = JobState.RUNNING,
            **spec: object) -> Job:
    """A job holding GPUs ``first..first+n-1`` on ``on`` (or on each of ``nodes``, a gang)."""
    where = nodes or (on,)
    allocs = tuple(Allocation(nid, tuple(f"GPU-{nid}-{i}" for i in range(first, first + n)), r)
                   for r, nid in enumerate(where))
    j = job(job_id, n, state=state, allocations=allocs, nodes=len(where), **spec)
    stop = JobState.PREEMPTED if state is JobState.STOPPING else None
    return replace(j, started_at=started, stop_target=stop)


class StubPredictor:
    """An Estimator answering fixed estimates by job id (the time limit otherwise)."""

    def __init__(self, estimates: dict[str, float]) -> None:
        self.estimates = estimates

    def estimate(self, j: Job) -> float:
        return self.estimates.get(j.id, j.spec.time_limit or float("inf"))


def snap(nodes, pending, active=(), now=100.0, **kw) -> Snapshot:  # type: ignore[no-untyped-def]
    return replace(snapshot(list(nodes), list(pending), list(active), now=now), **kw)


def started(plan: Plan) -> dict[str, tuple[str, ...]]:
    return {s.job_id: tuple(a.node_id for a in s.allocations) for s in plan.starts}


def codes(plan: Plan) -> dict[str, str]:
    return {k: r.code for k, r in plan.pending.items()}


# -- who backfills, and why the others wait ----------------------------------------------------

# (nodes, active, pending, policy, started: job -> nodes, reasons: job -> code)
WHO_STARTS = {
    "short job ending before the reservation backfills": (
        [node("a", 8)], [running("r1", 6, time_limit=1000)],
        [job("head", 8, submitted=1, time_limit=1000),
         job("short", 2, submitted=2, time_limit=500)],
        EASY, {"short": ("a",)}, {"head": "Resources"}),
    "short job ending exactly at the reservation backfills": (
        [node("a", 8)], [running("r1", 6, time_limit=1000)],
        [job("head", 8, submitted=1, time_limit=1000),
         job("short", 2, submitted=2, time_limit=900)],
        EASY, {"short": ("a",)}, {"head": "Resources"}),
    "long job that would delay the reservation waits (Reservation)": (
        [node("a", 8)], [running("r1", 6, time_limit=1000)],
        [job("head", 8, submitted=1, time_limit=1000),
         job("long", 2, submitted=2, time_limit=5000)],
        EASY, {}, {"head": "Resources", "long": "Reservation"}),
    "job with no limit counts as long (Reservation)": (
        [node("a", 8)], [running("r1", 6, time_limit=1000)],
        [job("head", 8, submitted=1, time_limit=1000), job("nolimit", 2, submitted=2)],
        EASY, {}, {"head": "Resources", "nolimit": "Reservation"}),
    "short backfills, long behind it still waits": (
        [node("a", 8)], [running("r1", 4, time_limit=1000)],
        [job("head", 8, submitted=1, time_limit=1000),
         job("long", 2, submitted=2, time_limit=5000),
         job("short", 2, submitted=3, time_limit=300)],
        EASY, {"short": ("a",)}, {"head": "Resources", "long": "Reservation"}),
    "long job in the reserved node's extra GPUs starts": (
        [node("a", 8)], [running("r1", 6, time_limit=1000)],
        [job("head", 6, submitted=1, time_limit=1000),
         job("long", 2, submitted=2, time_limit=5000)],
        EASY, {"long": ("a",)}, {"head": "Resources"}),
    "the one extra GPU goes to one long job only": (
        [node("a", 8)], [running("r1", 4, time_limit=1000)],
        [job("head", 7, submitted=1, time_limit=1000),
         job("long1", 1, submitted=2, time_limit=5000),
         job("long2", 1, submitted=3, time_limit=5000)],
        EASY, {"long1": ("a",)}, {"head": "Resources", "long2": "Reservation"}),
    "long job on a node the reservation does not need starts": (
        [node("a", 8), node("b", 8)],
        [running("r1", 8, "a", time_limit=1000), running("r2", 6, "b", time_limit=5000)],
        [job("head", 8, submitted=1, time_limit=1000),
         job("long", 2, submitted=2, time_limit=9000)],
        EASY, {"long": ("b",)}, {"head": "Resources"}),
    "fcfs: a blocked head blocks every later job (Priority)": (
        [node("a", 8)], [running("r1", 6, time_limit=1000)],
        [job("head", 4, submitted=1, time_limit=1000),
         job("short", 1, submitted=2, time_limit=10),
         job("tiny", 1, submitted=3, time_limit=10)],
        FCFS, {}, {"head": "Resources", "short": "Priority", "tiny": "Priority"}),
    "fcfs: jobs ahead of the blocked head still start": (
        [node("a", 8)], [running("r1", 4, time_limit=1000)],
        [job("first", 2, submitted=1, time_limit=1000),
         job("head", 4, submitted=2, time_limit=1000),
         job("short", 1, submitted=3, time_limit=10)],
        FCFS, {"first": ("a",)}, {"head": "Resources", "short": "Priority"}),
    "fcfs ignores classes: a critical job behind the head waits (Priority)": (
        [node("a", 8)], [running("r1", 6, time_limit=1000)],
        [job("head", 4, submitted=1, priority="low"),
         job("crit", 1, submitted=2, priority="critical")],
        FCFS, {}, {"head": "Resources", "crit": "Priority"}),
}


@pytest.mark.parametrize(("nodes", "active", "pending", "policy", "want_started", "want_codes"),
                         list(WHO_STARTS.values()), ids=list(WHO_STARTS))
def test_who_backfills(nodes, active, pending, policy, want_started, want_codes) -> None:  # type: ignore[no-untyped-def]
    plan = run_cycle(snap(nodes, pending, active), policy)
    assert started(plan) == want_started
    assert codes(plan) == want_codes
    assert set(plan.pending) | set(want_started) == {j.id for j in pending}


def test_reservation_reason_names_the_holder() -> None:
    plan = run_cycle(snap([node("a", 8)],
                          [job("head", 8, submitted=1), job("long", 2, submitted=2,
                                                              time_limit=5000)],
                          [running("r1", 6, time_limit=1000)]), EASY)
    why = plan.pending["long"]
    assert why.code == "Reservation"
    assert "head" in why.message


# -- when and where the reservation is ---------------------------------------------------------

# (nodes, active, pending, policy, now, start_at, reserved node ids)
WHEN = {
    "the running job's expected end": (
        [node("a", 8)], [running("r1", 6, time_limit=1000)],
        [job("head", 8)], EASY, 100.0, 1000.0, ("a",)),
    "a later start shifts the end": (
        [node("a", 8)], [running("r1", 6, started=50, time_limit=1000)],
        [job("head", 8)], EASY, 100.0, 1050.0, ("a",)),
    "needs only the earlier of two jobs": (
        [node("a", 8)],
        [running("r1", 4, time_limit=1000), running("r2", 4, first=4, time_limit=3000)],
        [job("head", 4)], EASY, 100.0, 1000.0, ("a",)),
    "needs both running jobs: the later end": (
        [node("a", 8)],
        [running("r1", 4, time_limit=1000), running("r2", 4, first=4, time_limit=3000)],
        [job("head", 8)], EASY, 100.0, 3000.0, ("a",)),
    "the node that frees first": (
        [node("a", 8), node("b", 8)],
        [running("r1", 8, "a", time_limit=4000), running("r2", 8, "b", time_limit=2000)],
        [job("head", 8)], EASY, 100.0, 2000.0, ("b",)),
    "a job started in this cycle counts": (
        [node("a", 8)], [],
        [job("first", 4, submitted=1, time_limit=2000), job("head", 8, submitted=2)],
        EASY, 100.0, 2100.0, ("a",)),
    "gang head reserves on N nodes": (
        [node("a", 4), node("b", 4), node("c", 4)],
        [running("ra", 4, "a", time_limit=2000), running("rb", 4, "b", time_limit=3000),
         running("rc", 4, "c", time_limit=1000)],
        [job("gang", 4, nodes=2)], EASY, 100.0, 2000.0, ("c", "a")),
    "predicted runtime instead of the limit": (
        [node("a", 8)], [running("r1", 6, time_limit=10_000)],
        [job("head", 8)], PREDICTED, 100.0, 400.0, ("a",)),
    "overran its prediction: later, not in the past": (
        [node("a", 8)], [running("r1", 6, time_limit=10_000)],
        [job("head", 8)], PREDICTED, 1000.0, 1500.0, ("a",)),
    "overran its prediction by a little: at least a minute more": (
        [node("a", 8)], [running("quick", 6, started=300, time_limit=10_000)],
        [job("head", 8)], PREDICTED, 400.0, 460.0, ("a",)),
    "overran its prediction near its limit: capped at the limit": (
        [node("a", 8)], [running("r1", 6, time_limit=1200)],
        [job("head", 8)], PREDICTED, 1000.0, 1200.0, ("a",)),
    "overran its limit: now, not in the past": (
        [node("a", 8)], [running("r1", 6, time_limit=1000)],
        [job("head", 8)], EASY, 1500.0, 1500.0, ("a",)),
    "a stopping job frees its GPUs after the grace period": (
        [node("a", 8)], [running("r1", 6, time_limit=1000, state=JobState.STOPPING)],
        [job("head", 8)], EASY, 100.0, 130.0, ("a",)),
}


@pytest.mark.parametrize(("nodes", "active", "pending", "policy", "now", "start_at", "node_ids"),
                         list(WHEN.values()), ids=list(WHEN))
def test_reservation_start_and_nodes(nodes, active, pending, policy, now, start_at,  # type: ignore[no-untyped-def]
                                     node_ids) -> None:
    pred = StubPredictor({"r1": 400.0, "quick": 50.0})
    plan = run_cycle(snap(nodes, pending, active, now=now, predictor=pred), policy)
    res = plan.reservation
    assert res is not None
    assert res.job_id == pending[-1].id
    assert res.start_at == pytest.approx(start_at)
    assert res.start_at >= now
    assert res.node_ids == node_ids
    assert res.model == "A100-80GB"


def test_overrun_pushes_the_reservation_later_cycle_after_cycle() -> None:
    """The same blocked head, seen by successive cycles while r1 outruns its prediction."""
    pred = StubPredictor({"r1": 400.0})
    seen = []
    for now in (100.0, 399.0, 500.0, 1000.0, 4000.0):
        plan = run_cycle(snap([node("a", 8)], [job("head", 8)],
                              [running("r1", 6, time_limit=10_000)], now=now, predictor=pred),
                         PREDICTED)
        assert plan.reservation is not None
        assert plan.reservation.start_at > now
        seen.append(plan.reservation.start_at)
    assert seen == sorted(seen)
    assert seen[-1] <= 10_000.0  # never beyond the job's limit


def test_plan_carries_the_reservation_and_the_order() -> None:
    pending = [job("c", 1, submitted=3, time_limit=50), job("head", 8, submitted=1),
               job("b", 2, submitted=2, time_limit=9000)]
    plan = run_cycle(snap([node("a", 8)], pending, [running("r1", 6, time_limit=1000)]), EASY)
    assert plan.order == ("head", "b", "c")  # the ranked queue, for explain
    assert plan.reservation is not None and plan.reservation.job_id == "head"
    assert started(plan) == {"c": ("a",)}
    assert codes(plan) == {"head": "Resources", "b": "Reservation"}


@pytest.mark.parametrize(("policy", "pending", "active"), [
    pytest.param(EASY, [job("x", 2)], [], id="nothing blocked"),
    pytest.param(FCFS, [job("head", 8)], [running("r1", 6, time_limit=1000)],
                 id="fcfs never reserves"),
    pytest.param(EASY, [job("head", 8)], [running("r1", 6)],
                 id="a running job with no limit: no reservation can be computed"),
])
def test_no_reservation(policy, pending, active) -> None:  # type: ignore[no-untyped-def]
    plan = run_cycle(snap([node("a", 8)], pending, active), policy)
    assert plan.reservation is None
    assert plan.order == tuple(j.id for j in pending)


def test_full_cluster_still_reserves_for_the_head() -> None:
    """With no GPU free the head still gets its reservation, so it holds between cycles."""
    plan = run_cycle(snap([node("a", 8)], [job("head", 4, submitted=1), job("x", 1, submitted=2)],
                          [running("r1", 8, time_limit=1000)]), EASY)
    assert plan.reservation is not None
    assert (plan.reservation.job_id, plan.reservation.start_at) == ("head", 1000.0)
    assert codes(plan) == {"head": "Resources", "x": "Resources"}


# -- the backfill module's pieces directly -------------------------------------------------------

@pytest.mark.parametrize(("now", "estimate", "allowed"), [
    pytest.param(100.0, 899.0, True, id="ends before"),
    pytest.param(100.0, 900.0, True, id="ends exactly at"),
    pytest.param(100.0, 901.0, False, id="ends after"),
    pytest.param(100.0, float("inf"), False, id="unbounded"),
])
def test_shadow_allows(now: float, estimate: float, allowed: bool) -> None:
    from broker.cycle.plan import Reservation

    sh = Shadow(Reservation("h", 1000.0, ("a",), "A100-80GB"), ("A100-80GB", None), {"a": 2})
    assert sh.allows(now, estimate) is allowed


def test_release_profile_and_reserve_cap() -> None:
    nodes = [node("a", 8)]
    r1, r2 = running("r1", 4, time_limit=1000), running("r2", 2, first=4, time_limit=3000)
    index = FreeIndex(nodes, {"a": {g: "x" for j in (r1, r2) for a in j.allocations
                                    for g in a.gpu_ids}})
    kind = ("A100-80GB", None)
    profile = release_profile(index, [(r1.allocations, 1000.0), (r2.allocations, 3000.0)])
    assert profile == {"a": {kind: [(1000.0, 4), (3000.0, 2)]}}
    sh = reserve(job("h", 5), index, profile, 100.0)
    assert sh is not None
    assert (sh.reservation.start_at, sh.reservation.node_ids, sh.cap) == (1000.0, ("a",),
                                                                        {"a": 1})
    sh.charge((Allocation("a", ("GPU-a-6",)),))
    assert sh.cap == {"a": 0}


# -- relaxed backfill (settings["easy"]["backfill_relax"]) ------------------------------

@pytest.mark.parametrize(("relax", "limit", "starts"), [
    pytest.param(None, 900.0, True, id="no knob: ends at the reservation"),
    pytest.param(None, 901.0, False, id="no knob: one second late"),
    pytest.param(0.0, 901.0, False, id="relax 0 is plain EASY"),
    pytest.param(0.5, 1900.0, True, id="relax 0.5 of a 2000 s wait: 1000 s of slack"),
    pytest.param(0.5, 1901.0, False, id="relax 0.5: beyond the slack"),
])
def test_backfill_relax(relax: float | None, limit: float, starts: bool) -> None:
    """A backfilled job may delay the reservation by ``relax`` x the head's wait so far."""
    settings = {} if relax is None else {"easy": {"backfill_relax": relax}}
    plan = run_cycle(snap([node("a", 8)],
                          [job("head", 8, submitted=0.0), job("x", 2, submitted=1.0,
                                                               time_limit=limit)],
                          [running("r1", 6, started=1900.0, time_limit=1000)], now=2000.0,
                          settings=settings), EASY)
    assert plan.reservation is not None and plan.reservation.start_at == 2900.0
    assert ("x" in started(plan)) is starts
    assert codes(plan).get("x") == (None if starts else "Reservation")


# -- a full cluster --------------------------------------------------------------------------------

CPU_ONLY_BUG = ("broker/cycle/scheduler.py _Cycle.run: `if self.index.free_devices == 0: "
                "self._rest_full(...)` parks the rest of the queue when no GPU is free, so a "
                "CPU-only job (gpus=0; feasible_ever and FreeIndex.find support it) never starts "
                "while every GPU is busy; under EASY it even 'holds the reservation ... expected "
                "free now'. _rest_full should still place gpus=0 jobs")


@pytest.mark.parametrize("policy", [EASY, FCFS], ids=["easy", "fcfs"])
def test_a_cpu_only_job_starts_while_every_gpu_is_busy(policy: PolicySet) -> None:
    plan = run_cycle(snap([node("a", 8)], [job("cpu", 0, time_limit=100)],
                          [running("r1", 8, time_limit=1000)]), policy)
    assert started(plan) == {"cpu": ("a",)}


@pytest.mark.parametrize("policy", [EASY, FCFS], ids=["easy", "fcfs"])
def test_a_cpu_only_job_starts_while_a_gpu_is_free(policy: PolicySet) -> None:
    plan = run_cycle(snap([node("a", 8)], [job("cpu", 0, time_limit=100)],
                          [running("r1", 7, time_limit=1000)]), policy)
    assert started(plan) == {"cpu": ("a",)}


def test_fcfs_full_cluster_reasons_match_the_partly_free_ones() -> None:
    pending = [job("head", 4, submitted=1), job("x", 1, submitted=2), job("y", 2, submitted=3)]
    full = run_cycle(snap([node("a", 8)], pending, [running("r1", 8, time_limit=1000)]), FCFS)
    assert codes(full) == {"head": "Resources", "x": "Priority", "y": "Priority"}


@pytest.mark.parametrize("policy", [EASY, FCFS], ids=["easy", "fcfs"])
def test_cpu_only_and_infeasible_jobs_deep_in_a_full_queue(policy: PolicySet) -> None:
    """Behind a blocked head on a full cluster: a CPU-only job still starts (except under
    strict order), an impossible job says so, the others wait."""
    pending = [job("head", 8, submitted=1), job("gpu", 2, submitted=2),
               job("cpu", 0, submitted=3, time_limit=100), job("huge", 64, submitted=4)]
    plan = run_cycle(snap([node("a", 8)], pending, [running("r1", 8, time_limit=1000)]), policy)
    assert ("cpu" in started(plan)) is (policy is EASY)
    assert codes(plan)["huge"] == "NoFeasibleNode"
    assert codes(plan)["gpu"] == ("Resources" if policy is EASY else "Priority")


@pytest.mark.parametrize(("policy", "until_event"), [
    (FCFS, True),  # strict order, arrivals last, nothing evicts: only an end can change it
    (EASY, False),  # a backfilled arrival could start
    (PolicySet(order="priority-fifo", reserve="strict", evict=()), False),  # it may jump ahead
    (PolicySet(order="fifo", reserve="strict", evict=("priority",)), False),  # it may evict
])
def test_a_plan_says_when_only_an_event_can_change_it(policy: PolicySet,
                                                       until_event: bool) -> None:
    pending = [job("head", 8, submitted=1), job("b", 1, submitted=2)]
    plan = run_cycle(snap([node("a", 8)], pending, [running("r1", 6, time_limit=1000)]), policy)
    assert plan.until_event is until_event
    nothing_waits = run_cycle(snap([node("a", 8)], [job("x", 1)], []), policy)
    assert nothing_waits.until_event is False
