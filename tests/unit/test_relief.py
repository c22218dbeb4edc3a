"""Relief (policies/evict/relief.py, the cycle's last preemption step): a short job starved far past
its runtime evicts long checkpointable jobs when it gains many times what they lose.

``now`` is 10 000 s. Unless a row says otherwise: node ``a`` has 4 A100s, held by two
checkpointable normal-class jobs of 2 GPUs that started at 1 000 s with a 24 h limit (so they
are expected to end at 87 400 s: the reservation is 21.5 h away); the pending job ``w`` wants 4
GPUs for at most 10 minutes (the policy estimates by the limit): the relief gain is
``(77 400 - 30) / 600 = 129`` against a cost of ``2 x 630 / 86 400 = 0.015``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.cycle.scheduler import CycleState, run_cycle
from broker.model import HistoryEntry, Job
from broker.model.state import EvictionKind, JobState
from policies.evict.relief import cost, gain, resumes_first, worth_it
from policies.order.orderings import spillway
from policies.registry import PolicySet
from tests.builders import node
from tests.unit.test_preemption import evicted, pending, running, snap

NOW = 10_000.0
RELIEF = PolicySet(order="priority-fifo", place="best-fit", reserve="easy",
                   evict=("priority", "relief"), estimate="limit", name="relief-test")
ON = {"settings": {"relief": {"relief_slowdown": 20.0, "relief_ratio": 10.0}}}


def long_job(job_id: str, n: int = 2, on: str = "a", **kw: object) -> Job:
    kw.setdefault("checkpoint_dir", "/ckpt")
    kw.setdefault("time_limit", 86_400)
    kw.setdefault("first", 0 if job_id.endswith("1") else 2)
    return running(job_id, n, on, **kw)  # type: ignore[arg-type]


def short_wide(job_id: str = "w", n: int = 4, **kw: object) -> Job:
    kw.setdefault("priority", "normal")
    kw.setdefault("time_limit", 600)
    return pending(job_id, n, **kw)  # type: ignore[arg-type]


def with_settings(**s: float) -> dict[str, object]:
    return {"settings": {"relief": {"relief_slowdown": 20.0, "relief_ratio": 10.0, **s}}}


BOTH = [long_job("l1"), long_job("l2")]

# (active, pending, policy, snapshot overrides, evicted jobs)
CASES = {
    "a short wide job evicts the long jobs in its way": (BOTH, [short_wide()], RELIEF, ON,
                                                        {"l1", "l2"}),
    "only as many as it needs (victim order: same age, then id)": (
        BOTH, [short_wide(n=2)], RELIEF, ON, {"l1"}),
    "class rank among preemptible classes does not matter: low evicts normal": (
        BOTH, [short_wide(priority="low")], RELIEF, ON, {"l1", "l2"}),
    # -- nothing is evicted
    "on by default (relief_slowdown 20, relief_ratio 10)": (BOTH, [short_wide()], RELIEF, {},
                                                            {"l1", "l2"}),
    "relief_slowdown 0 turns it off": (BOTH, [short_wide()], RELIEF,
                                       with_settings(relief_slowdown=0.0), set()),
    "a policy without relief": (BOTH, [short_wide()], replace(RELIEF, evict=("priority",)), ON,
                                set()),
    "a long head is spared too little slowdown": (
        BOTH, [short_wide(time_limit=20_000)], RELIEF, ON, set()),
    "the victims' cost, times the ratio, outweighs the gain": (
        BOTH, [short_wide()], RELIEF, with_settings(relief_ratio=10_000.0), set()),
    "the slowdown threshold comes from the settings": (
        BOTH, [short_wide()], RELIEF, with_settings(relief_slowdown=200.0), set()),
    "a victim that does not checkpoint": (
        [long_job("l1"), long_job("l2", checkpoint_dir=None)], [short_wide()], RELIEF, ON,
        set()),
    "a class that is not preemptible": (
        [long_job("l1"), long_job("l2", priority="high")], [short_wide()], RELIEF, ON, set()),
    "a victim younger than the minimum runtime": (
        [long_job("l1"), long_job("l2", started=NOW - 300)], [short_wide()], RELIEF, ON, set()),
    "the reservation is near: a job ending within defrag_min_gain_s is waited for": (
        [long_job("l1", time_limit=9_300), long_job("l2")], [short_wide(n=2)], RELIEF, ON,
        set()),
    "an eviction already under way makes room: no second one": (
        [long_job("l1"), long_job("l2", state=JobState.STOPPING)], [short_wide(n=2)], RELIEF,
        ON, set()),
}


@pytest.mark.parametrize(("active", "queue", "policy", "kw", "victims"),
                         list(CASES.values()), ids=list(CASES))
def test_relief(active, queue, policy, kw, victims) -> None:  # type: ignore[no-untyped-def]
    plan = run_cycle(snap([node("a", 4)], queue, active, **kw), policy)
    assert evicted(plan) == victims
    assert plan.starts == ()
    if victims:
        reason = plan.pending["w"]
        assert reason.code == "Resources"
        assert f"evicting {len(victims)} long checkpointable job(s)" in reason.message
        for p in plan.preemptions:
            assert p.kind is EvictionKind.RELIEF and p.for_job == "w"
            assert p.reason.startswith("yielded to w,")
            assert p.grace_s == snap([], [], []).grace_s


def test_class_preemption_goes_first_and_relief_waits_its_turn() -> None:
    """A critical job evicts l1 by the class rule; relief plans nothing in the same cycle."""
    queue = [pending("crit", 2, submitted=4000.0), short_wide()]
    plan = run_cycle(snap([node("a", 4)], queue, BOTH, **ON), RELIEF)
    assert evicted(plan) == {"l1"}
    assert all(p.kind is EvictionKind.PRIORITY for p in plan.preemptions)


@pytest.mark.parametrize(("start_at", "grace", "estimate", "expected"), [
    (10_000.0, 30.0, 100.0, 99.7),
    (0.0, 30.0, 100.0, 0.0),  # a reservation already due spares nothing
])
def test_gain(start_at: float, grace: float, estimate: float, expected: float) -> None:
    assert gain(start_at, 0.0, grace, estimate) == pytest.approx(expected)


@pytest.mark.parametrize(("holder", "victims", "expected"), [
    (600.0, [86_400.0, 86_400.0], 2 * 630 / 86_400),
    (600.0, [], 0.0),
    (3_600.0, [3_630.0], 1.0),
])
def test_cost(holder: float, victims: list[float], expected: float) -> None:
    assert cost(holder, 30.0, victims) == pytest.approx(expected)


@pytest.mark.parametrize(("g", "c", "min_sd", "ratio", "ok"), [
    (129.0, 0.015, 20.0, 10.0, True),
    (19.0, 0.0, 20.0, 10.0, False),  # below the slowdown threshold
    (50.0, 6.0, 20.0, 10.0, False),  # 10 x the cost is more than the gain
    (50.0, 5.0, 20.0, 10.0, True),  # exactly 10 x
])
def test_worth_it(g: float, c: float, min_sd: float, ratio: float, ok: bool) -> None:
    assert worth_it(g, c, min_sd, ratio) is ok


def _requeued(j: Job, kind: EvictionKind, attempt: int = 2) -> Job:
    stop = HistoryEntry(JobState.STOPPING, NOW - 100, "evicted", attempt - 1, kind)
    return replace(j, attempt=attempt, history=(*j.history, stop))


@pytest.mark.parametrize(("kind", "attempt", "first"), [
    (EvictionKind.RELIEF, 2, True),
    (EvictionKind.MOVE, 2, True),
    (EvictionKind.PRIORITY, 2, False),
    (EvictionKind.QUOTA, 2, False),
    (EvictionKind.SCAVENGE, 2, False),
    (EvictionKind.RELIEF, 1, False),  # a first attempt was never requeued
])
def test_resumes_first(kind: EvictionKind, attempt: int, first: bool) -> None:
    assert resumes_first(_requeued(pending("v", 1, priority="normal"), kind, attempt)) is first


def test_a_victim_of_relief_goes_back_to_the_front_of_spillways_queue() -> None:
    """Requeued after yielding to w, the long job l1 goes ahead of an older short job."""
    victim = _requeued(pending("l1", 2, priority="normal", submitted=1000.0,
                               time_limit=86_400), EvictionKind.RELIEF)
    older = pending("s", 1, priority="normal", submitted=500.0, time_limit=60)
    s = snap([node("a", 4)], [older, victim], [])
    order = spillway(CycleState(s, PolicySet(), s.now), [older, victim])
    assert [j.id for j in order] == ["l1", "s"]
