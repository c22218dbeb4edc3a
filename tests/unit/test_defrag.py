"""Defragmentation by checkpoint migration (policies/evict/defrag.py, the cycle's defrag phase).

``now`` is 10 000 s. Running jobs started at 1 000 s (past the 600 s minimum runtime), are
checkpointable, normal class, and have a 24 h limit (so the reservation is hours away) unless
a row says otherwise. The pending job is a normal-class job that cannot preempt.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.cycle.plan import Reservation
from broker.cycle.scheduler import CycleState, run_cycle
from broker.model import HistoryEntry, Job
from broker.model.state import EvictionKind, JobState
from policies.registry import PolicySet
from tests.builders import node
from tests.unit.test_preemption import evicted, pending, running, snap

NOW = 10_000.0
DEFRAG = PolicySet(order="priority-fifo", place="best-fit", reserve="easy",
                   evict=("priority", "move"), estimate="limit", name="defrag-test")


def mover(job_id: str, n: int, on: str = "a", **kw: object) -> Job:
    kw.setdefault("checkpoint_dir", "/ckpt")
    kw.setdefault("time_limit", 86_400)
    return running(job_id, n, on, **kw)  # type: ignore[arg-type]


def wide(job_id: str = "w", n: int = 4, **kw: object) -> Job:
    return pending(job_id, n, priority="normal", **kw)  # type: ignore[arg-type]


# (nodes, active, pending, policy, snapshot overrides, moved jobs)
CASES = {
    "two half-used nodes: the younger small job moves": (
        [node("a", 4), node("b", 4)],
        [mover("s1", 2, "a", started=1000), mover("s2", 2, "b", started=2000)],
        [wide()], DEFRAG, {}, {"s2"}),
    "the node needing the fewest moved GPUs": (
        [node("a", 4), node("b", 4), node("c", 4)],
        [mover("s3", 3, "a"), mover("s1", 1, "b"), mover("s2", 2, "c")],
        [wide()], DEFRAG, {}, {"s1"}),
    "a gang gets whole nodes: a free one plus one made": (
        [node("a", 4), node("b", 4), node("c", 4)],
        [mover("s1", 2, "a", started=1000), mover("s2", 2, "b", started=2000)],
        [wide(nodes=2)], DEFRAG, {}, {"s2"}),
    "only as many moves as needed on a node": (
        [node("a", 4), node("b", 4)],
        [mover("s1", 1, "a"), mover("s2", 1, "a", first=1), mover("s3", 1, "b"),
         mover("s4", 1, "b", first=1)],
        [wide(n=3)], DEFRAG, {}, {"s1"}),
    # -- nothing moves
    "no landing spot for the moved job": (
        [node("a", 4), node("b", 4)],
        [mover("s1", 2, "a"), mover("s2", 4, "b")],
        [wide()], DEFRAG, {}, set()),
    "the landing spot must allow the job's GPU type": (
        [node("a", 4), node("b", 4, "V100-32GB")],
        [mover("s1", 2, "a", gpu_types=["A100"]), mover("s2", 2, "b")],
        [wide(gpu_types=["A100"])], DEFRAG, {}, set()),
    "not checkpointable": (
        [node("a", 4), node("b", 4)],
        [mover("s1", 2, "a", checkpoint_dir=None), mover("s2", 2, "b", checkpoint_dir=None)],
        [wide()], DEFRAG, {}, set()),
    "younger than the minimum runtime": (
        [node("a", 4), node("b", 4)],
        [mover("s1", 2, "a", started=NOW - 300), mover("s2", 2, "b", started=NOW - 300)],
        [wide()], DEFRAG, {}, set()),
    "a class that is not preemptible": (
        [node("a", 4), node("b", 4)],
        [mover("s1", 2, "a", priority="high"), mover("s2", 2, "b", priority="high")],
        [wide()], DEFRAG, {}, set()),
    "a multi-node job is not moved": (
        [node("a", 4), node("b", 4)],
        [mover("g", 2, nodes=("a", "b"))],
        [wide()], DEFRAG, {}, set()),
    "the reservation is near: waiting costs less than a move": (
        [node("a", 4), node("b", 4)],
        [mover("s1", 2, "a", time_limit=9_300), mover("s2", 2, "b")],
        [wide()], DEFRAG, {}, set()),
    "the gain threshold comes from the policy's settings": (
        [node("a", 4), node("b", 4)],
        [mover("s1", 2, "a", time_limit=9_300), mover("s2", 2, "b", started=2000)],
        [wide()], DEFRAG, {"settings": {"move": {"defrag_min_gain_s": 60.0}}},
        {"s2"}),
    "a job about to end anyway is not moved (nor its node freed by moving it)": (
        [node("a", 4), node("b", 4), node("c", 4)],
        [mover("s1", 1, "a", time_limit=9_030), mover("s3", 1, "a", first=1),
         mover("s2", 3, "b"), mover("x", 2, "c", checkpoint_dir=None)],
        [wide()], DEFRAG, {}, set()),
    "... which it would be without that rule": (
        [node("a", 4), node("b", 4), node("c", 4)],
        [mover("s1", 1, "a", time_limit=9_700), mover("s3", 1, "a", first=1),
         mover("s2", 3, "b"), mover("x", 2, "c", checkpoint_dir=None)],
        [wide()], DEFRAG, {"settings": {"move": {"defrag_min_gain_s": 60.0}}},
        {"s1", "s3"}),
    "a move already under way: no second one": (
        [node("a", 4), node("b", 4)],
        [mover("s1", 2, "a"), mover("s2", 2, "b", state=JobState.STOPPING)],
        [wide()], DEFRAG, {}, set()),
    "a policy without defrag moves nothing": (
        [node("a", 4), node("b", 4)],
        [mover("s1", 2, "a"), mover("s2", 2, "b")],
        [wide()], replace(DEFRAG, evict=("priority",)), {}, set()),
}


@pytest.mark.parametrize(("nodes", "active", "queue", "policy", "kw", "moved"),
                         list(CASES.values()), ids=list(CASES))
def test_defrag(nodes, active, queue, policy, kw, moved) -> None:  # type: ignore[no-untyped-def]
    plan = run_cycle(snap(nodes, queue, active, **kw), policy)
    assert evicted(plan) == moved
    assert not plan.starts or not moved
    if moved:
        head = plan.reservation.job_id  # type: ignore[union-attr]
        assert plan.pending[head].code == "Resources"
        assert "moving" in plan.pending[head].message
        for p in plan.preemptions:
            assert p.kind is EvictionKind.MOVE and p.for_job == head
            assert p.reason.startswith(f"moved to make whole nodes for {head}")


def test_moved_job_lands_and_the_wide_job_starts() -> None:
    """Two cycles: after the move the head holds a reservation on the node being freed, the
    moved job restarts in the hole on the other node, then the head starts on a whole node."""
    nodes = [node("a", 4), node("b", 4)]
    s1, s2 = mover("s1", 2, "a", started=1000), mover("s2", 2, "b", started=2000)
    w = wide()
    plan = run_cycle(snap(nodes, [w], [s1, s2]), DEFRAG)
    assert evicted(plan) == {"s2"}
    # s2 checkpointed and was requeued (attempt 2); b is whole
    requeued = replace(s2, state=JobState.PENDING, allocations=(), attempt=2, started_at=None,
                       submitted_at=500.0)
    plan2 = run_cycle(snap(nodes, [w, requeued], [s1], now=NOW + 30), DEFRAG)
    starts = {s.job_id: s.allocations for s in plan2.starts}
    assert set(starts) == {"w", "s2"}
    assert [a.node_id for a in starts["w"]] == ["b"]
    assert [a.node_id for a in starts["s2"]] == ["a"]
    assert not plan2.preemptions


def test_mig_and_cpu_only_jobs_never_move_anything() -> None:
    from policies.evict.defrag import plan_moves
    from policies.evict.preemption import make_victims, victim_key
    from policies.place.placement import FreeIndex

    nodes = [node("a", 4, mig={0: ["3g.40gb", "3g.40gb"]}), node("b", 4)]
    s1 = mover("s1", 2, "b")
    index = FreeIndex(nodes, {"b": {"GPU-b-0": "s1", "GPU-b-1": "s1"}})
    victims = make_victims([s1], index.kinds_by_gpu, lambda j: victim_key(j, 0, NOW, 30.0))
    soon = {"a": {("A100-80GB", "3g.40gb"): 2, ("A100-80GB", None): 3},
            "b": {("A100-80GB", None): 2}}
    for head in (wide(n=1, mig_profile="3g.40gb"), wide(n=0)):
        assert plan_moves(head, index, soon, victims) is None
    assert plan_moves(wide(), index, soon, victims) == victims  # a whole-GPU head would


# -- moves planned before backfill, and their landing GPUs kept -----------------------------

def _moving(j: Job, holder: str = "w") -> Job:
    """``j`` was told to stop so that it moves (defragmentation), and is checkpointing."""
    stop = HistoryEntry(JobState.STOPPING, NOW - 10, f"moved for {holder}: restarts", j.attempt,
                        EvictionKind.MOVE)
    return replace(j, state=JobState.STOPPING, stop_target=JobState.PREEMPTED,
                   history=(*j.history, stop))


def test_moves_are_planned_before_backfill_takes_the_landing_gpus() -> None:
    """A short job behind the head would backfill into the only free GPUs a move can land on
    (and, the phase coming last, nothing would move). The move is planned first: the landing
    GPUs are kept for the moved job and the reservation is on the node being freed, at once."""
    nodes = [node("a", 4), node("b", 4)]
    active = [mover("s1", 2, "a", started=1000), mover("s2", 2, "b", started=2000)]
    short = pending("x", 2, priority="normal", submitted=6000.0, time_limit=3_600)
    plan = run_cycle(snap(nodes, [wide(), short], active), DEFRAG)
    assert evicted(plan) == {"s2"}
    assert plan.starts == ()
    assert plan.reservation is not None
    assert plan.reservation.node_ids == ("b",)
    assert plan.reservation.start_at == NOW + snap(nodes, [], []).grace_s
    assert "moving 1 job(s)" in plan.pending["w"].message


def test_landing_gpus_are_kept_while_the_moved_job_checkpoints() -> None:
    """s2 is stopping to move off b (reserved for w); the free GPUs on a are its landing spot:
    a long job behind does not take them (nor b's, which the reservation keeps)."""
    nodes = [node("a", 4), node("b", 4)]
    active = [mover("s1", 2, "a"), _moving(mover("s2", 2, "b", started=2000))]
    long_job = pending("x", 2, priority="normal", submitted=6000.0, time_limit=86_400)
    reservation = Reservation("w", NOW + 20, ("b",), "A100-80GB")
    plan = run_cycle(snap(nodes, [wide(), long_job], active, reservation=reservation), DEFRAG)
    assert plan.starts == ()
    assert plan.preemptions == ()
    # without the move under way the same job starts on a at once
    plan = run_cycle(snap(nodes, [wide(), long_job],
                          [active[0], replace(active[1], history=())],
                          reservation=reservation), DEFRAG)
    assert [(s.job_id, s.allocations[0].node_id) for s in plan.starts] == [("x", "a")]
    # nor once the moving job has been cancelled (it will not restart)
    plan = run_cycle(snap(nodes, [wide(), long_job],
                          [active[0], replace(active[1], stop_target=JobState.CANCELLED)],
                          reservation=reservation), DEFRAG)
    assert [s.job_id for s in plan.starts] == ["x"]


def test_a_moved_job_restarts_first_under_spillways_order() -> None:
    """Requeued after its move, a job goes right after the reservation holder, ahead of the
    jobs that would otherwise take its landing GPUs; a job preempted for another reason does
    not."""
    from policies.order.orderings import spillway as spillway_order

    moved = replace(_moving(mover("m", 2, "a")), state=JobState.PENDING, allocations=(),
                    attempt=2, started_at=None, submitted_at=9_000.0)
    other = replace(moved, id="p", history=tuple(
        replace(h, reason="preempted by crit", kind=h.kind and EvictionKind.PRIORITY)
        for h in moved.history))
    small = pending("x", 1, priority="normal", submitted=1_000.0, time_limit=600)
    holder = wide()
    s = snap([node("a", 4)], [small, other, moved, holder], [],
             reservation=Reservation("w", NOW + 20, ("a",), "A100-80GB"))
    order = [j.id for j in spillway_order(CycleState(s, PolicySet(), s.now), s.pending)]
    assert order[:2] == ["w", "m"]
    assert order.index("x") < order.index("p")
