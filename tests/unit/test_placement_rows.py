"""More placement rows, through ``run_cycle`` and ``policies.place.placement.FreeIndex``.

Memory (``memory_gb``, per node) is accounted across one cycle like GPUs and CPUs; the
minimum-GPU-memory filter is tested with models whose alphabetical order is the opposite of
their memory order (A10-24GB < V100-32GB by name, T4-16GB > H200-141GB), so that a row cannot
pass by the models' sort order (or by comparing memory sizes as text: "141" < "16").
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.cycle.plan import Plan
from broker.cycle.scheduler import run_cycle
from broker.model import Allocation, Job, Node
from broker.model.state import JobState
from policies.place.placement import FreeIndex
from policies.registry import PolicySet
from tests.builders import job, node, snapshot

DEFAULT = PolicySet()  # priority-fifo, best fit, EASY backfill
SPILLWAY = PolicySet.named("spillway")  # aligned placement: the fastest model first


def placed(plan: Plan) -> dict[str, list[tuple[str, int]]]:
    """job id -> [(node id, number of GPUs)] per rank."""
    return {s.job_id: [(a.node_id, len(a.gpu_ids)) for a in s.allocations] for s in plan.starts}


def codes(plan: Plan) -> dict[str, str]:
    return {k: r.code for k, r in plan.pending.items()}


def running(job_id: str, n: int, on: str = "a", **spec: object) -> Job:
    allocs = (Allocation(on, tuple(f"GPU-{on}-{i}" for i in range(n)), 0),)
    j = job(job_id, n, state=JobState.RUNNING, allocations=allocs, **spec)
    return replace(j, started_at=0.0)


# -- memory, counted across the cycle ------------------------------------------------------------

# (nodes, running, pending, placed, reason codes)
MEMORY = {
    "two jobs that each fit alone, not together: the second waits": (
        [node("a", 8, memory_gb=100)], [],
        [job("j1", 1, memory_gb=60, submitted=1), job("j2", 1, memory_gb=60, submitted=2)],
        {"j1": [("a", 1)]}, {"j2": "Resources"}),
    "two jobs that each fit alone: one per node": (
        [node("a", 8, memory_gb=100), node("b", 8, memory_gb=100)], [],
        [job("j1", 1, memory_gb=60, submitted=1), job("j2", 1, memory_gb=60, submitted=2)],
        None, {}),
    "exactly the node's memory together: both start": (
        [node("a", 8, memory_gb=100)], [],
        [job("j1", 1, memory_gb=50, submitted=1), job("j2", 1, memory_gb=50, submitted=2)],
        {"j1": [("a", 1)], "j2": [("a", 1)]}, {}),
    "three jobs: the third no longer fits": (
        [node("a", 8, memory_gb=100)], [],
        [job("j1", 1, memory_gb=40, submitted=1), job("j2", 1, memory_gb=40, submitted=2),
         job("j3", 1, memory_gb=40, submitted=3)],
        {"j1": [("a", 1)], "j2": [("a", 1)]}, {"j3": "Resources"}),
    "a gang takes memory on each of its nodes": (
        [node("a", 4, memory_gb=100), node("b", 4, memory_gb=100)], [],
        [job("gang", 1, nodes=2, memory_gb=60, submitted=1),
         job("j2", 1, memory_gb=60, submitted=2)],
        {"gang": [("a", 1), ("b", 1)]}, {"j2": "Resources"}),
    "a running job's memory counts": (
        [node("a", 8, memory_gb=100)], [running("r", 1, memory_gb=60)],
        [job("j", 1, memory_gb=60)], {}, {"j": "Resources"}),
    "a running job's memory counts: the other node": (
        [node("a", 8, memory_gb=100), node("b", 8, memory_gb=100)],
        [running("r", 1, memory_gb=60)], [job("j", 1, memory_gb=60)], {"j": [("b", 1)]}, {}),
    "CPU-only jobs take memory too": (
        [node("a", 8, memory_gb=100)], [],
        [job("c1", 0, memory_gb=60, submitted=1), job("c2", 0, memory_gb=60, submitted=2)],
        {"c1": [("a", 0)]}, {"c2": "Resources"}),
}


@pytest.mark.parametrize(("nodes", "active", "pending", "want", "want_codes"),
                         list(MEMORY.values()), ids=list(MEMORY))
def test_memory_within_one_cycle(nodes: list[Node], active: list[Job], pending: list[Job],
                                 want: dict[str, list[tuple[str, int]]] | None,
                                 want_codes: dict[str, str]) -> None:
    plan = run_cycle(snapshot(nodes, pending, active), DEFAULT)
    got = placed(plan)
    if want is None:  # one job per node, whichever
        assert sorted(got) == sorted(j.id for j in pending)
        assert sorted(a[0][0] for a in got.values()) == sorted(n.id for n in nodes)
    else:
        assert got == want
    assert codes(plan) == want_codes
    # whatever started fits the nodes' memory
    for n in nodes:
        used = sum(j.spec.memory_gb for j in active if j.allocations[0].node_id == n.id)
        used += sum(j.spec.memory_gb for j in pending for s in plan.starts if s.job_id == j.id
                    for a in s.allocations if a.node_id == n.id)
        assert used <= n.memory_gb


def test_free_index_take_counts_memory() -> None:
    index = FreeIndex([node("a", 8, memory_gb=100)])
    j1, j2 = job("j1", 1, memory_gb=60), job("j2", 1, memory_gb=40)
    allocs = index.find(j1.res, j1.spec.sites)
    assert allocs is not None
    index.take(allocs, j1.res)
    assert index.find(j1.res, j1.spec.sites) is None  # 40 GB left
    assert index.find(j2.res, j2.spec.sites) is not None  # exactly 40 GB


# -- minimum GPU memory ---------------------------------------------------------------------------

# (nodes, min_gpu_memory_gb, GPUs, placed on, or None: no feasible node)
MIN_MEMORY = {
    "32 GB: V100-32GB, not A10-24GB (first by name)": (
        [node("a", 8, "A10-24GB"), node("b", 8, "V100-32GB")], 32, 1, "b"),
    "25 GB: V100-32GB, not A10-24GB": (
        [node("a", 8, "A10-24GB"), node("b", 8, "V100-32GB")], 25, 1, "b"),
    "32 GB: the bigger model though the smaller is the tighter fit": (
        [node("a", 8, "V100-32GB"), node("b", 2, "A10-24GB")], 32, 2, "a"),
    "24 GB is enough for A10-24GB (at least, not more than)": (
        [node("a", 8, "A10-24GB"), node("b", 8, "T4-16GB")], 24, 1, "a"),
    "100 GB: H200-141GB, not T4-16GB (\"141\" < \"16\" as text)": (
        [node("a", 8, "H200-141GB"), node("b", 2, "T4-16GB")], 100, 1, "a"),
    "20 GB: T4-16GB is excluded, though it is the tighter fit": (
        [node("a", 8, "L4-24GB"), node("b", 1, "T4-16GB")], 20, 1, "a"),
    "more than any model has: no feasible node": (
        [node("a", 8, "A10-24GB"), node("b", 8, "V100-32GB")], 33, 1, None),
}


@pytest.mark.parametrize("policy", [DEFAULT, SPILLWAY], ids=["best-fit", "spillway"])
@pytest.mark.parametrize(("nodes", "min_mem", "gpus", "where"), list(MIN_MEMORY.values()),
                         ids=list(MIN_MEMORY))
def test_min_gpu_memory(nodes: list[Node], min_mem: float, gpus: int, where: str | None,
                        policy: PolicySet) -> None:
    j = job("j", gpus, min_gpu_memory_gb=min_mem, time_limit=3600)
    plan = run_cycle(snapshot(nodes, [j]), policy)
    if where is None:
        assert placed(plan) == {}
        assert codes(plan) == {"j": "NoFeasibleNode"}
    else:
        assert placed(plan) == {"j": [(where, gpus)]}
        assert codes(plan) == {}
    index = FreeIndex(nodes)
    assert index.feasible_ever(j.res) is (where is not None)
    found = index.find(j.res, j.spec.sites)
    assert (None if found is None else found[0].node_id) == where
