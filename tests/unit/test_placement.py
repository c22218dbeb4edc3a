"""Table-driven tests of placement and the scheduling cycle."""

from __future__ import annotations

import pytest

from broker.cycle.scheduler import run_cycle
from broker.model import Allocation, NodeState
from broker.model.state import JobState
from tests.builders import job, node, snapshot


def placed(plan) -> dict[str, list[tuple[str, int]]]:  # type: ignore[no-untyped-def]
    """job id -> [(node id, number of GPUs)] per rank."""
    return {s.job_id: [(a.node_id, len(a.gpu_ids)) for a in s.allocations] for s in plan.starts}


CASES = {
    "fits on one node": (
        [node("a", 8)], [job("j1", 4)], {"j1": [("a", 4)]}, {}),
    "best fit picks the fuller node": (
        [node("a", 8), node("b", 2)], [job("j1", 2)], {"j1": [("b", 2)]}, {}),
    "never split a single-node job": (
        [node("a", 2), node("b", 2)], [job("j1", 4)], {}, {"j1": "NoFeasibleNode"}),
    "gang takes all nodes or none": (
        [node("a", 4), node("b", 4)], [job("j1", 4, nodes=2)], {"j1": [("a", 4), ("b", 4)]}, {}),
    "gang that cannot fit starts nowhere": (
        [node("a", 4), node("b", 2)], [job("j1", 4, nodes=2)], {}, {"j1": "NoFeasibleNode"}),
    "gpu type pinned": (
        [node("a", 8, "V100-32GB"), node("b", 8, "H100-80GB")], [job("j1", 1, gpu_types=["H100"])],
        {"j1": [("b", 1)]}, {}),
    "unknown to the cluster type": (
        [node("a", 8, "V100-32GB")], [job("j1", 1, gpu_types=["H100"])], {},
        {"j1": "NoFeasibleNode"}),
    "min memory excludes small GPUs": (
        [node("a", 8, "V100-16GB"), node("b", 8, "A100-40GB")],
        [job("j1", 1, min_gpu_memory_gb=32)],
        {"j1": [("b", 1)]}, {}),
    "priority order wins scarce GPUs": (
        [node("a", 4)],
        [job("low", 4, priority="low", submitted=1), job("crit", 4, priority="critical",
                                                         submitted=2)],
        {"crit": [("a", 4)]}, {"low": "Resources"}),
    "a job behind a blocked higher-priority job waits for Priority": (
        [node("a", 4)],
        [job("big", 8, priority="high", nodes=1, submitted=0), job("x", 2, submitted=1),
         job("y", 4, submitted=2), job("z", 4, submitted=3)],
        {"x": [("a", 2)]}, {"big": "NoFeasibleNode", "y": "Resources", "z": "Priority"}),
    "fifo within a class": (
        [node("a", 4)], [job("late", 4, submitted=2), job("early", 4, submitted=1)],
        {"early": [("a", 4)]}, {"late": "Resources"}),
    "resources when nothing ahead": (
        [node("a", 4)], [job("big", 4, submitted=1)], {}, {}),
    "mig job takes a matching instance": (
        [node("a", 2, mig={0: ["1g.10gb", "1g.10gb", "3g.40gb"]})],
        [job("m", 1, mig_profile="3g.40gb")],
        {"m": [("a", 1)]}, {}),
    "whole GPU job never lands on a split GPU": (
        [node("a", 1, mig={0: ["3g.40gb", "3g.40gb"]})], [job("w", 1)], {},
        {"w": "NoFeasibleNode"}),
    "cpu accounting": (
        [node("a", 8, cpus=4)], [job("c1", 1, cpus=3), job("c2", 1, cpus=3, submitted=1)],
        {"c1": [("a", 1)]}, {"c2": "Resources"}),
    "draining node takes nothing": (
        [node("a", 8, state=NodeState.DRAINING)], [job("j", 1)],
        {}, {"j": "Resources"}),
    "a spot node takes a spot job, not a cloud-only one": (
        [node("s", 1, site="gcp:us-central1:us-central1-a:spot"),
         node("o", 1, site="gcp:us-central1:us-central1-a:ondemand")],
        [job("sj", 1, sites=["spot"]), job("cj", 1, sites=["cloud"], submitted=1),
         job("cj2", 1, sites=["cloud"], submitted=2)],
        {"sj": [("s", 1)], "cj": [("o", 1)]}, {"cj2": "Resources"}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_placement(name: str) -> None:
    nodes, pending, want_placed, want_reasons = CASES[name]
    if name == "resources when nothing ahead":
        busy = job("run", 2, state=JobState.RUNNING,
                   allocations=(Allocation("a", ("GPU-a-0", "GPU-a-1")),))
        plan = run_cycle(snapshot(nodes, pending, [busy]))
        assert placed(plan) == {}
        assert plan.pending["big"].code == "Resources"
        return
    plan = run_cycle(snapshot(nodes, pending))
    assert placed(plan) == want_placed
    for job_id, code in want_reasons.items():
        assert plan.pending[job_id].code == code, plan.pending[job_id]
    assert set(plan.pending) | set(want_placed) == {j.id for j in pending}


def test_no_gpu_given_twice_in_one_cycle() -> None:
    nodes = [node(f"n{i}", 8) for i in range(4)]
    pending = [job(f"j{i}", 1 + i % 4, submitted=i) for i in range(40)]
    plan = run_cycle(snapshot(nodes, pending))
    seen: set[tuple[str, str]] = set()
    for s in plan.starts:
        for a in s.allocations:
            for g in a.gpu_ids:
                assert (a.node_id, g) not in seen
                seen.add((a.node_id, g))
    assert len(seen) == 32  # the cluster is packed full


def test_allocated_gpus_are_not_reused() -> None:
    busy = job("run", 6, state=JobState.RUNNING,
               allocations=(Allocation("a", tuple(f"GPU-a-{i}" for i in range(6))),))
    plan = run_cycle(snapshot([node("a", 8)], [job("j", 2)], [busy]))
    assert plan.starts[0].allocations[0].gpu_ids == ("GPU-a-6", "GPU-a-7")


def test_every_pending_job_has_a_reason() -> None:
    nodes = [node("a", 4)]
    pending = [job(f"j{i}", 3, submitted=i) for i in range(5)]
    plan = run_cycle(snapshot(nodes, pending))
    assert len(plan.starts) == 1
    assert set(plan.pending) == {f"j{i}" for i in range(1, 5)}
    assert all(r.message for r in plan.pending.values())


def test_deterministic() -> None:
    nodes = [node(f"n{i}", 8, "A100-80GB" if i % 2 else "V100-32GB") for i in range(6)]
    pending = [job(f"j{i}", 1 + i % 8, submitted=i % 7) for i in range(60)]
    assert run_cycle(snapshot(nodes, pending)) == run_cycle(snapshot(nodes, pending))
