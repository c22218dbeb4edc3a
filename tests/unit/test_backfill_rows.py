"""More reservation and backfill rows, through the public entry points only.

Mostly through ``broker.cycle.scheduler.run_cycle`` and its Plan (the reservation, who started, the
reason codes); ``policies.place.backfill.reserve`` and ``release_profile`` directly where the cap or
the profile is the point. ``now`` is 100; running jobs started at 0, so a running job's
expected end is its time limit.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.cycle.plan import Plan, Snapshot
from broker.cycle.scheduler import run_cycle
from broker.model import Allocation, Gpu, Job, Node
from broker.model.state import JobState
from policies.place.backfill import release_profile, reserve
from policies.place.placement import FreeIndex
from policies.registry import PolicySet
from tests.builders import job, node, snapshot

# The default policy set: priority-fifo order, EASY backfill (and class preemption, which no
# row triggers: every job is "normal", a class that may not preempt, and no team has a quota).
EASY = PolicySet()
NOW = 100.0
A100, V100 = ("A100-80GB", None), ("V100-32GB", None)
MIG3 = ("A100-80GB", "3g.40gb")


def mixed(node_id: str, *groups: tuple[str, int], cpus: float = 0) -> Node:
    """A node with several GPU models: ``groups`` of (model, count), GPU ids
    ``GPU-<node>-<i>`` numbered across the groups in order."""
    gpus: list[Gpu] = []
    for model, count in groups:
        mem = float(model.rsplit("-", 1)[-1].removesuffix("GB"))
        for _ in range(count):
            i = len(gpus)
            gpus.append(Gpu(f"GPU-{node_id}-{i}", i, model, mem))
    return Node(node_id, tuple(gpus), cpus=cpus, lease_expires=1e12)


def running(job_id: str, n: int, on: str = "a", *, first: int = 0,
            nodes: tuple[str, ...] | None = None, ids: tuple[str, ...] | None = None,
            **spec: object) -> Job:
    """A job holding GPUs ``first..first+n-1`` on ``on`` (or on each of ``nodes``, a gang),
    or exactly the devices ``ids`` on ``on``; ``n`` = 0 is a CPU-only job."""
    where = nodes or (on,)
    allocs = tuple(Allocation(nid, ids if ids is not None else tuple(
        f"GPU-{nid}-{i}" for i in range(first, first + n)), r) for r, nid in enumerate(where))
    j = job(job_id, n, state=JobState.RUNNING, allocations=allocs, nodes=len(where), **spec)
    return replace(j, started_at=0.0)


def snap(nodes: list[Node], pending: list[Job], active: list[Job]) -> Snapshot:
    return snapshot(nodes, pending, active, now=NOW)


def started(plan: Plan) -> dict[str, tuple[str, ...]]:
    return {s.job_id: tuple(a.node_id for a in s.allocations) for s in plan.starts}


def codes(plan: Plan) -> dict[str, str]:
    return {k: r.code for k, r in plan.pending.items()}


MIG_NODE = node("a", 2, mig={1: ["3g.40gb", "3g.40gb"]})  # GPU-a-0 whole; MIG-a-1-0, MIG-a-1-1

# (nodes, active, pending (the first is the head), reservation (start, nodes, model),
#  started: job -> nodes, reason codes)
ROWS = {
    # -- behind a running multi-node job ------------------------------------------------------
    "a gang frees every node it runs on at its end": (
        [node("a", 4), node("b", 4), node("c", 4)],
        [running("g", 4, nodes=("a", "b"), time_limit=2000),
         running("rc", 4, "c", time_limit=3000)],
        [job("head", 4, nodes=2, submitted=1)],
        (2000.0, ("a", "b"), "A100-80GB"), {}, {"head": "Resources"}),
    "a one-node head behind a gang: the gang's second node counts": (
        [node("b", 4), node("c", 4)],
        [running("g", 4, nodes=("c", "b"), time_limit=2000),
         running("other", 2, "c", first=0, time_limit=3000)],
        [job("head", 4, submitted=1)],
        (2000.0, ("b",), "A100-80GB"), {}, {"head": "Resources"}),
    "behind a gang, a long job keeps off the reserved nodes": (
        [node("a", 4), node("b", 4), node("c", 4)],
        [running("g", 3, nodes=("a", "b"), time_limit=2000),
         running("rc", 2, "c", time_limit=3000)],
        [job("head", 4, nodes=2, submitted=1), job("long", 1, submitted=2, time_limit=9000),
         job("short", 1, submitted=3, time_limit=500)],
        (2000.0, ("a", "b"), "A100-80GB"), {"long": ("c",), "short": ("a",)},
        {"head": "Resources"}),
    # -- a node with MIG devices ----------------------------------------------------------------
    "MIG head: the MIG instance's end, not the whole GPU's": (
        [MIG_NODE],
        [running("whole", 1, ids=("GPU-a-0",), time_limit=1000),
         running("mig", 1, ids=("MIG-a-1-0",), mig_profile="3g.40gb", time_limit=3000)],
        [job("head", 2, mig_profile="3g.40gb", submitted=1)],
        (3000.0, ("a",), "A100-80GB"), {}, {"head": "Resources"}),
    "whole-GPU head: the whole GPU's end, not the MIG instance's": (
        [MIG_NODE],
        [running("whole", 1, ids=("GPU-a-0",), time_limit=3000),
         running("mig", 1, ids=("MIG-a-1-0",), mig_profile="3g.40gb", time_limit=1000)],
        [job("head", 1, submitted=1)],
        (3000.0, ("a",), "A100-80GB"), {}, {"head": "Resources"}),
    "a long MIG job uses a free instance beside a whole-GPU reservation": (
        [MIG_NODE],
        [running("whole", 1, ids=("GPU-a-0",), time_limit=1000)],
        [job("head", 1, submitted=1), job("long", 1, mig_profile="3g.40gb", submitted=2,
                                          time_limit=9000)],
        (1000.0, ("a",), "A100-80GB"), {"long": ("a",)}, {"head": "Resources"}),
    # -- a node with two GPU models -------------------------------------------------------------
    "A100 head: the A100 job's end, not the earlier V100 one": (
        [mixed("a", ("A100-80GB", 4), ("V100-32GB", 4))],
        [running("rA", 4, first=0, time_limit=3000), running("rV", 4, first=4, time_limit=1000)],
        [job("head", 4, gpu_types=["A100"], submitted=1)],
        (3000.0, ("a",), "A100-80GB"), {}, {"head": "Resources"}),
    "any-model head: the model that frees first": (
        [mixed("a", ("A100-80GB", 4), ("V100-32GB", 4))],
        [running("rA", 4, first=0, time_limit=3000), running("rV", 4, first=4, time_limit=1000)],
        [job("head", 4, submitted=1)],
        (1000.0, ("a",), "V100-32GB"), {}, {"head": "Resources"}),
    "a long V100 job starts beside an A100 reservation on the same node": (
        [mixed("a", ("A100-80GB", 4), ("V100-32GB", 4))],
        [running("rA", 4, first=0, time_limit=3000), running("rV", 2, first=4, time_limit=1000)],
        [job("head", 4, gpu_types=["A100"], submitted=1),
         job("long", 2, gpu_types=["V100"], submitted=2, time_limit=9000)],
        (3000.0, ("a",), "A100-80GB"), {"long": ("a",)}, {"head": "Resources"}),
    "a long A100 job may not take the reserved model on that node": (
        [mixed("a", ("A100-80GB", 5), ("V100-32GB", 4))],
        [running("rA", 4, first=0, time_limit=3000), running("rV", 2, first=5, time_limit=1000)],
        [job("head", 5, gpu_types=["A100"], submitted=1),
         job("long", 1, gpu_types=["A100"], submitted=2, time_limit=9000)],
        (3000.0, ("a",), "A100-80GB"), {}, {"head": "Resources", "long": "Reservation"}),
    # -- beside a running CPU-only job ----------------------------------------------------------
    "a CPU-only job with no limit does not hold the reservation back": (
        [node("a", 8, cpus=16)],
        [running("cpu", 0, cpus=4), running("r1", 6, time_limit=1000)],
        [job("head", 8, submitted=1)],
        (1000.0, ("a",), "A100-80GB"), {}, {"head": "Resources"}),
    "beside a CPU-only job, short jobs backfill and long ones wait": (
        [node("a", 8)],
        [running("cpu", 0, time_limit=5000), running("r1", 6, time_limit=1000)],
        [job("head", 8, submitted=1), job("long", 1, submitted=2, time_limit=5000),
         job("short", 1, submitted=3, time_limit=900)],
        (1000.0, ("a",), "A100-80GB"), {"short": ("a",)},
        {"head": "Resources", "long": "Reservation"}),
    # -- the reserved node's cap: max(0, free then - needed) -----------------------------------
    "no GPU to spare on the reserved node: a 1-GPU long job waits": (
        [node("a", 8)], [running("r1", 6, time_limit=1000)],
        [job("head", 8, submitted=1), job("long", 1, submitted=2, time_limit=5000)],
        (1000.0, ("a",), "A100-80GB"), {}, {"head": "Resources", "long": "Reservation"}),
    "no GPU to spare on either reserved gang node: 1-GPU long jobs wait": (
        [node("a", 4), node("b", 4)],
        [running("g", 3, nodes=("a", "b"), time_limit=1000)],
        [job("head", 4, nodes=2, submitted=1), job("l1", 1, submitted=2, time_limit=5000),
         job("l2", 1, submitted=3, time_limit=5000)],
        (1000.0, ("a", "b"), "A100-80GB"), {}, {"head": "Resources", "l1": "Reservation",
                                                 "l2": "Reservation"}),
}


@pytest.mark.parametrize(("nodes", "active", "pending", "want_res", "want_started", "want_codes"),
                         list(ROWS.values()), ids=list(ROWS))
def test_reservation_rows(nodes: list[Node], active: list[Job], pending: list[Job],
                          want_res: tuple[float, tuple[str, ...], str],
                          want_started: dict[str, tuple[str, ...]],
                          want_codes: dict[str, str]) -> None:
    plan = run_cycle(snap(nodes, pending, active), EASY, NOW)
    res = plan.reservation
    assert res is not None
    assert (res.job_id, res.start_at, res.node_ids, res.model) == (pending[0].id, *want_res)
    assert started(plan) == want_started
    assert codes(plan) == want_codes


# A head short of CPUs (or memory) now is ready on a node once running jobs give enough back
# (their expected ends), not never: it gets a reservation and backfill honours it.


def test_a_head_waiting_for_cpus_still_gets_a_reservation() -> None:
    """The head's GPUs are free at 1000, its CPUs at 2000 (a CPU-only job's end)."""
    plan = run_cycle(snap([node("a", 8, cpus=16)], [job("head", 8, cpus=8, submitted=1)],
                          [running("cpu", 0, cpus=12, time_limit=2000),
                           running("r1", 6, cpus=1, time_limit=1000)]), EASY, NOW)
    assert plan.reservation is not None
    assert plan.reservation.start_at == 2000.0


def test_a_head_whose_cpus_never_come_back_gets_no_reservation() -> None:
    plan = run_cycle(snap([node("a", 8, cpus=16)], [job("head", 8, cpus=32, submitted=1)],
                          [running("r1", 6, cpus=1, time_limit=1000)]), EASY, NOW)
    assert plan.reservation is None  # (no node will ever have 32 CPUs)


# -- the pieces directly ------------------------------------------------------------------------

def index_of(nodes: list[Node], active: list[Job]) -> FreeIndex:
    return FreeIndex(nodes, snap(nodes, [], active).allocated)


@pytest.mark.parametrize(("nodes", "active", "head", "cap"), [
    pytest.param([node("a", 8)], [running("r1", 6, time_limit=1000)], job("h", 8), {"a": 0},
                 id="all it frees is needed: 0, not 1"),
    pytest.param([node("a", 8)], [running("r1", 6, time_limit=1000)], job("h", 7), {"a": 1},
                 id="one to spare"),
    pytest.param([node("a", 8)], [running("r1", 4, time_limit=1000),
                                  running("r2", 2, first=4, time_limit=3000)], job("h", 6),
                 {"a": 0}, id="the later job's GPUs are not counted"),
    pytest.param([node("a", 4), node("b", 4)], [running("g", 3, nodes=("a", "b"),
                                                        time_limit=1000)],
                 job("h", 4, nodes=2), {"a": 0, "b": 0}, id="gang: 0 on each node"),
    pytest.param([mixed("a", ("A100-80GB", 4), ("V100-32GB", 4))],
                 [running("rA", 4, time_limit=1000)], job("h", 4, gpu_types=["A100"]),
                 {"a": 0}, id="free GPUs of another model are not counted"),
])
def test_reserve_cap(nodes: list[Node], active: list[Job], head: Job,
                     cap: dict[str, int]) -> None:
    index = index_of(nodes, active)
    profile = release_profile(index, [(j.allocations, float(j.spec.time_limit or "inf"))
                                      for j in active])
    sh = reserve(head, index, profile, NOW)
    assert sh is not None
    assert sh.cap == cap


def test_release_profile_by_kind_on_mixed_nodes() -> None:
    """Per node and per device kind: a gang on both nodes, MIG instances, two models, and a
    CPU-only job (which frees no device)."""
    nodes = [MIG_NODE, mixed("b", ("A100-80GB", 2), ("V100-32GB", 2))]
    active = [
        running("g", 1, nodes=("a", "b"), time_limit=500),  # GPU-a-0 and GPU-b-0
        running("m", 2, ids=("MIG-a-1-0", "MIG-a-1-1"), mig_profile="3g.40gb",
                time_limit=700),
        running("v", 2, "b", first=2, gpu_types=["V100"], time_limit=900),
        running("cpu", 0, "b", time_limit=300),
    ]
    index = index_of(nodes, active)
    profile = release_profile(index, [(j.allocations, float(j.spec.time_limit or "inf"))
                                      for j in active])
    assert profile == {"a": {A100: [(500.0, 1)], MIG3: [(700.0, 2)]},
                       "b": {A100: [(500.0, 1)], V100: [(900.0, 2)]}}
