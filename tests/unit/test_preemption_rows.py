"""More preemption rows, through the public entry points only.

The cycle (``broker.cycle.scheduler.run_cycle``) is asserted through its Plan: which jobs are
evicted
and the reason code of each pending job (never the message, never ``Preempt.reason``).
``policies.evict.preemption.take_until_fits`` is tested directly as well.

``now`` is 10 000 s; running jobs started at 1 000 s (9 000 s ago, well past the default
``min_runtime_s`` of 600 s) unless a row says otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from broker.cycle.plan import Plan, Snapshot
from broker.cycle.scheduler import run_cycle
from broker.model import Allocation, Gpu, Job, Node, NodeState
from broker.model.state import JobState
from policies.evict.preemption import Victim, take_until_fits
from policies.place.placement import FreeIndex
from policies.registry import PolicySet
from tests.builders import job, node, snapshot

NOW = 10_000.0
# The default policy set: priority-fifo order, EASY backfill, class preemption and quota
# reclaim (built without naming its fields, which are being renamed).
PRIORITY = PolicySet()


def mixed(node_id: str, *groups: tuple[str, int], site: str = "onprem", cpus: float = 0,
          memory_gb: float = 0) -> Node:
    """A node with several GPU models: ``groups`` of (model, count), GPU ids
    ``GPU-<node>-<i>`` numbered across the groups in order."""
    gpus: list[Gpu] = []
    for model, count in groups:
        mem = float(model.rsplit("-", 1)[-1].removesuffix("GB"))
        for _ in range(count):
            i = len(gpus)
            gpus.append(Gpu(f"GPU-{node_id}-{i}", i, model, mem))
    return Node(node_id, tuple(gpus), site=site, cpus=cpus, memory_gb=memory_gb,
                lease_expires=1e12)


def running(job_id: str, n: int, on: str = "a", *, first: int = 0, started: float = 1000.0,
            priority: str = "normal", nodes: tuple[str, ...] | None = None,
            state: JobState = JobState.RUNNING, **spec: object) -> Job:
    """A job holding GPUs ``first..first+n-1`` on ``on`` (or on each of ``nodes``)."""
    where = nodes or (on,)
    allocs = tuple(Allocation(nid, tuple(f"GPU-{nid}-{i}" for i in range(first, first + n)), r)
                   for r, nid in enumerate(where))
    j = job(job_id, n, priority=priority, state=state, allocations=allocs, nodes=len(where),
            **spec)
    stop = JobState.PREEMPTED if state is JobState.STOPPING else None
    return replace(j, started_at=started, stop_target=stop)


def pending(job_id: str, n: int, *, priority: str = "critical", submitted: float = 5000.0,
            **spec: object) -> Job:
    return job(job_id, n, priority=priority, submitted=submitted, **spec)


def snap(nodes: list[Node], queue: list[Job], active: list[Job], **kw: object) -> Snapshot:
    return replace(snapshot(nodes, queue, active, now=NOW), **kw)


def evicted(plan: Plan) -> set[str]:
    return {p.job_id for p in plan.preemptions}


def fits_without(s: Snapshot, want: Job, gone: set[str]) -> bool:
    """Would ``want`` fit on the snapshot's nodes once the jobs in ``gone`` freed their GPUs
    (and their CPUs and memory)?"""
    allocated: dict[str, dict[str, str]] = {n.id: {} for n in s.nodes}
    used: dict[str, tuple[float, float]] = {}
    for j in s.active:
        if j.id in gone:
            continue
        for a in j.allocations:
            for g in a.gpu_ids:
                allocated[a.node_id][g] = j.id
            c, m = used.get(a.node_id, (0.0, 0.0))
            used[a.node_id] = (c + j.spec.cpus, m + j.spec.memory_gb)
    index = FreeIndex(s.nodes, allocated, used)
    return index.find(want.res, want.spec.sites) is not None


# (nodes, active, the one pending job, victims, its reason code)
CASES: dict[str, tuple[list[Node], list[Job], Job, set[str], str]] = {
    # -- two GPU models: only victims on the wanted model count -----------------------------
    "A100 wanted: the A100 job is evicted, not the cheaper V100 job (two nodes)": (
        [node("a", 4, "A100-80GB"), node("b", 4, "V100-32GB")],
        [running("va", 4, "a", started=1000), running("vb", 4, "b", started=9000)],
        pending("crit", 4, gpu_types=["A100"]), {"va"}, "Preempting"),
    "V100 wanted: the V100 job is evicted, not the cheaper A100 job (two nodes)": (
        [node("a", 4, "A100-80GB"), node("b", 4, "V100-32GB")],
        [running("va", 4, "a", started=9000), running("vb", 4, "b", started=1000)],
        pending("crit", 4, gpu_types=["V100"]), {"vb"}, "Preempting"),
    "A100 wanted on a node with both models: only the A100 job": (
        [mixed("a", ("A100-80GB", 4), ("V100-32GB", 4))],
        [running("onA", 4, first=0, started=1000), running("onV", 4, first=4, started=9000)],
        pending("crit", 4, gpu_types=["A100"]), {"onA"}, "Preempting"),
    "V100 wanted on a node with both models: only the V100 job": (
        [mixed("a", ("A100-80GB", 4), ("V100-32GB", 4))],
        [running("onA", 4, first=0, started=9000), running("onV", 4, first=4, started=1000)],
        pending("crit", 4, gpu_types=["V100"]), {"onV"}, "Preempting"),
    "a free V100 does not count toward an A100 job's room": (
        [mixed("a", ("A100-80GB", 4), ("V100-32GB", 4))],
        [running("a1", 2, first=0, started=9000), running("a2", 2, first=2, started=8000),
         running("onV", 2, first=4)],
        pending("crit", 4, gpu_types=["A100"]), {"a1", "a2"}, "Preempting"),
    "the only A100 victim may not be evicted: nothing is": (
        [node("a", 4, "A100-80GB"), node("b", 4, "V100-32GB")],
        [running("hi", 4, "a", priority="high"), running("vb", 4, "b")],
        pending("crit", 4, gpu_types=["A100"]), set(), "Resources"),
    # -- GPUs already free on the node: evict only the shortfall ------------------------------
    "2 of 4 free: one 2-GPU victim, not two": (
        [node("a", 8)],
        [running("v1", 2, first=2, started=9000), running("v2", 2, first=4, started=8000),
         running("v3", 2, first=6, started=7000)],
        pending("crit", 4), {"v1"}, "Preempting"),
    "3 of 4 free: the 1-GPU victim suffices": (
        [node("a", 8)],
        [running("small", 1, first=3, started=9000), running("big", 4, first=4, started=8000)],
        pending("crit", 4), {"small"}, "Preempting"),
    "the node with free GPUs needs fewer victims, though they lose more": (
        [node("a", 4), node("b", 4)],
        [running("v", 2, "a", first=2, started=1000),
         running("w1", 2, "b", started=8000), running("w2", 2, "b", first=2, started=8000)],
        pending("crit", 4), {"v"}, "Preempting"),
    # -- taking victims until it fits, then sparing those not needed -------------------------
    "the last victim alone suffices: the first is spared (have - got == need)": (
        [node("a", 5)],
        [running("ck", 1, checkpoint_dir="/c"), running("big", 4, first=1, started=8000)],
        pending("crit", 4), {"big"}, "Preempting"),
    "spared latest first: the middle one goes back, not the first": (
        # order ck(2, checkpointing) < young(1) < old(3); taken all three (6 >= 4), then
        # old is needed (6-3 < 4), young is spared (6-1 >= 4), then ck is needed (5-2 < 4)
        [node("a", 6)],
        [running("ck", 2, checkpoint_dir="/c"), running("young", 1, first=2, started=NOW - 600),
         running("old", 3, first=3, started=1000)],
        pending("crit", 4), {"ck", "old"}, "Preempting"),
    "every victim taken is needed: none spared": (
        [node("a", 4)],
        [running("v1", 1, started=9000), running("v2", 1, first=1, started=8000),
         running("v3", 2, first=2, started=1000)],
        pending("crit", 4), {"v1", "v2", "v3"}, "Preempting"),
    "too few lower-ranked GPUs on any node: no victim at all": (
        [node("a", 4), node("b", 4)],
        [running("lo", 2, "a"), running("hi", 2, "a", first=2, priority="high"),
         running("lo2", 3, "b"), running("hi2", 1, "b", first=3, priority="high")],
        pending("crit", 4), set(), "Resources"),
    # -- nodes that fail the site or CPU/memory check are not used for victims ---------------
    "a cloud-only job takes victims on a cloud node, not on-prem": (
        [node("a", 4), node("b", 4, site="aws")],
        [running("onprem", 4, "a", started=9000), running("cloud", 4, "b", started=1000)],
        pending("crit", 4, sites=["cloud"]), {"cloud"}, "Preempting"),
    "an on-prem-only job takes victims on-prem, not in the cloud": (
        [node("a", 4), node("b", 4, site="aws")],
        [running("onprem", 4, "a", started=1000), running("cloud", 4, "b", started=9000)],
        pending("crit", 4, sites=["onprem"]), {"onprem"}, "Preempting"),
    "the only victim is on a node of the wrong site: nothing is evicted": (
        [node("a", 4, site="aws")], [running("cloud", 4)],
        pending("crit", 4, sites=["onprem"]), set(), "Resources"),
    "a node with too few CPUs is not used for victims": (
        [node("a", 4, cpus=8), node("b", 4, cpus=64)],
        [running("small", 4, "a", started=9000), running("roomy", 4, "b", started=1000)],
        pending("crit", 4, cpus=16), {"roomy"}, "Preempting"),
    "a node with too little memory is not used for victims": (
        [node("a", 4, memory_gb=64), node("b", 4, memory_gb=512)],
        [running("small", 4, "a", started=9000), running("roomy", 4, "b", started=1000)],
        pending("crit", 4, memory_gb=128), {"roomy"}, "Preempting"),
    "a draining node is not used for victims": (
        [node("a", 4, state=NodeState.DRAINING), node("b", 4)],
        [running("draining", 4, "a", started=9000), running("ready", 4, "b", started=1000)],
        pending("crit", 4), {"ready"}, "Preempting"),
}


@pytest.mark.parametrize(("nodes", "active", "want", "victims", "code"), list(CASES.values()),
                         ids=list(CASES))
def test_preemption_rows(nodes: list[Node], active: list[Job], want: Job, victims: set[str],
                         code: str) -> None:
    s = snap(nodes, [want], active)
    plan = run_cycle(s, PRIORITY, NOW)
    assert evicted(plan) == victims
    assert len(plan.preemptions) == len(victims)  # each victim once
    assert {k: r.code for k, r in plan.pending.items()} == {want.id: code}
    assert not plan.starts
    if victims:
        # enough: the job fits once they are gone; no more than enough: each one is needed
        assert fits_without(s, want, victims)
        for v in victims:
            assert not fits_without(s, want, victims - {v}), f"{v} was not needed"


# Victims free their CPUs and memory as well as their GPUs (on the node, their per-node
# request): a job whose CPUs or memory are held by lower-ranked jobs may evict them.
# (node, queue, running, evicted)
HOST = {
    "the victim's CPUs make room": (
        node("a", 4, cpus=32), [pending("crit", 4, cpus=16)], [running("v", 4, cpus=30)],
        {"v"}),
    "its memory too": (
        node("a", 4, cpus=8, memory_gb=64), [pending("crit", 2, memory_gb=40)],
        [running("v", 2, first=0, memory_gb=60)], {"v"}),
    "GPUs free, CPUs held: a GPU-less part of the fit": (
        node("a", 4, cpus=32), [pending("crit", 2, cpus=16)],
        [running("v1", 1, first=0, cpus=10), running("v2", 1, first=1, cpus=10)], {"v1"}),
    "two victims' CPUs together": (
        node("a", 4, cpus=32), [pending("crit", 2, cpus=24)],
        [running("v1", 1, first=0, cpus=14), running("v2", 1, first=1, cpus=14)],
        {"v1", "v2"}),
    "never enough CPUs on the node: no eviction": (
        node("a", 4, cpus=32), [pending("crit", 1, cpus=64)], [running("v", 4, cpus=30)],
        set()),
}


@pytest.mark.parametrize(("n", "queue", "active", "want"), list(HOST.values()), ids=list(HOST))
def test_victims_free_their_cpus_and_memory(n: Node, queue: list[Job], active: list[Job],
                                            want: set[str]) -> None:
    plan = run_cycle(snap([n], queue, active), PRIORITY, NOW)
    assert evicted(plan) == want
    if want:
        assert plan.pending["crit"].code == "Preempting"


# -- take_until_fits on one node, directly ------------------------------------------------------

def _victim(job_id: str) -> Victim:
    return Victim(job(job_id, 1), (False, 0.0, 0, 0.0, job_id), 0.0, {})


# (free devices, devices needed, [(victim, devices it frees)] in victim order, chosen or None)
TAKE = {
    "already fits: nobody": (4, 4, [("a", 2)], []),
    "exactly enough with the first": (2, 4, [("a", 2), ("b", 2)], ["a"]),
    "one short: the next one too": (1, 4, [("a", 2), ("b", 2)], ["a", "b"]),
    "the first is spared when the last alone suffices": (0, 4, [("a", 1), ("b", 4)], ["b"]),
    "spared latest first": (0, 4, [("a", 2), ("b", 1), ("c", 3)], ["a", "c"]),
    "free devices count: a small victim is enough": (3, 4, [("a", 1), ("b", 4)], ["a"]),
    "never enough: None": (0, 5, [("a", 2), ("b", 2)], None),
    "nothing to take and not enough: None": (1, 2, [], None),
}


@pytest.mark.parametrize(("have", "need", "offers", "want"), list(TAKE.values()), ids=list(TAKE))
def test_take_until_fits(have: int, need: int, offers: list[tuple[str, int]],
                         want: list[str] | None) -> None:
    got = take_until_fits(have, need, [(_victim(i), n) for i, n in offers])
    assert (None if got is None else [v.job.id for v in got]) == want
    if got is not None:
        freed = sum(n for i, n in offers if i in set(want or ()))
        assert have + freed >= need


def test_take_until_fits_stops_looking_at_the_fit() -> None:
    def offers() -> Iterator[tuple[Victim, int]]:
        yield _victim("a"), 2
        yield _victim("b"), 2
        raise AssertionError("looked past the fit")

    got = take_until_fits(0, 4, offers())
    assert got is not None and [v.job.id for v in got] == ["a", "b"]
