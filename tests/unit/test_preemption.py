"""Preemption in the scheduling cycle (broker/cycle/scheduler.py, policies/evict/preemption.py).

``now`` is 10 000 s; running jobs started at 1 000 s (9 000 s ago, well past the default
``min_runtime_s`` of 600 s) unless a row says otherwise.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from broker.config.core import DEFAULT_CLASSES, PriorityClass, Team
from broker.cycle.plan import Plan, Snapshot
from broker.cycle.scheduler import run_cycle
from broker.model import Allocation, Job
from broker.model.state import JobState
from policies.evict.preemption import make_victims, victim_key
from tests.builders import job, node, snapshot

NOW = 10_000.0
POLICY = None  # run_cycle's default PolicySet: priority-fifo, EASY backfill, priority preemption


def running(job_id: str, n: int, on: str = "a", *, first: int = 0, started: float = 1000.0,
            team: str = "t", priority: str = "normal", nodes: tuple[str, ...] | None = None,
            state: JobState = JobState.RUNNING, **spec: object) -> Job:
    """A job of ``team`` holding GPUs ``first..first+n-1`` on ``on`` (or on each of ``nodes``)."""
    where = nodes or (on,)
    allocs = tuple(Allocation(nid, tuple(f"GPU-{nid}-{i}" for i in range(first, first + n)), r)
                   for r, nid in enumerate(where))
    j = job(job_id, n, priority=priority, state=state, allocations=allocs, nodes=len(where),
            **spec)
    stop = JobState.PREEMPTED if state is JobState.STOPPING else None
    return replace(j, spec=j.spec.model_copy(update={"team": team}), started_at=started,
                   stop_target=stop)


def pending(job_id: str, n: int, *, team: str = "t", priority: str = "critical",
            submitted: float = 5000.0, **spec: object) -> Job:
    j = job(job_id, n, priority=priority, submitted=submitted, **spec)
    return replace(j, spec=j.spec.model_copy(update={"team": team}))


def snap(nodes, queue, active, now=NOW, **kw) -> Snapshot:  # type: ignore[no-untyped-def]
    return replace(snapshot(list(nodes), list(queue), list(active), now=now), **kw)


def evicted(plan: Plan) -> set[str]:
    return {p.job_id for p in plan.preemptions}


URGENT = (*DEFAULT_CLASSES,
          PriorityClass("urgent", 250, 600, may_preempt=True, preemptible=True))

# (nodes, active, pending, snapshot overrides, victims, reason codes of the pending jobs)
CASES = {
    "critical evicts a lower-ranked preemptible job": (
        [node("a", 4)], [running("v", 4)], [pending("crit", 4)], {},
        {"v"}, {"crit": "Preempting"}),
    "high evicts low": (
        [node("a", 4)], [running("v", 4, priority="low")], [pending("hi", 4, priority="high")],
        {}, {"v"}, {"hi": "Preempting"}),
    "only as many victims as needed": (
        [node("a", 4)], [running("v1", 2), running("v2", 2, first=2)], [pending("crit", 2)], {},
        {"v1"}, {"crit": "Preempting"}),
    "the node needing the fewest victims": (
        [node("a", 4), node("b", 4)],
        [running("big", 4, "a"), running("s1", 2, "b"), running("s2", 2, "b", first=2)],
        [pending("crit", 4)], {}, {"big"}, {"crit": "Preempting"}),
    "victims not needed after all are spared": (
        [node("a", 8)],
        [running("s1", 1), running("s2", 1, first=1), running("s3", 1, first=2),
         running("big", 5, first=3, started=5000)],
        [pending("crit", 5)], {}, {"big"}, {"crit": "Preempting"}),
    "lower class first when the loss is equal": (
        [node("a", 4)], [running("nrm", 2), running("lo", 2, first=2, priority="low")],
        [pending("crit", 2)], {}, {"lo"}, {"crit": "Preempting"}),
    "checkpointable first, though it ran longer": (
        [node("a", 4)],
        [running("ck", 2, started=1, checkpoint_dir="/ckpt"),
         running("nock", 2, first=2, started=9300)],
        [pending("crit", 2)], {}, {"ck"}, {"crit": "Preempting"}),
    "a job younger than min_runtime_s is never a victim": (
        [node("a", 4)], [running("young", 4, started=NOW - 599)], [pending("crit", 4)], {},
        set(), {"crit": "Resources"}),
    "a job exactly min_runtime_s old is a victim": (
        [node("a", 4)], [running("v", 4, started=NOW - 600)], [pending("crit", 4)], {},
        {"v"}, {"crit": "Preempting"}),
    "min_runtime_s comes from the snapshot": (
        [node("a", 4)], [running("v", 4, started=NOW - 100)], [pending("crit", 4)],
        {"min_runtime_s": 60.0}, {"v"}, {"crit": "Preempting"}),
    "the old job is taken, not the young one": (
        [node("a", 4)], [running("young", 2, started=NOW - 100), running("old", 2, first=2)],
        [pending("crit", 2)], {}, {"old"}, {"crit": "Preempting"}),
    "high is never a victim": (
        [node("a", 4)], [running("v", 4, priority="high")], [pending("crit", 4)], {},
        set(), {"crit": "Resources"}),
    "critical is never a victim": (
        [node("a", 4)], [running("v", 4, priority="critical", submitted=0)],
        [pending("crit", 4)], {}, set(), {"crit": "Resources"}),
    "no partial room: lower-ranked jobs alone are not enough": (
        [node("a", 4)], [running("hi", 2, priority="high"), running("lo", 2, first=2)],
        [pending("crit", 4)], {}, set(), {"crit": "Resources"}),
    "normal may not preempt": (
        [node("a", 4)], [running("v", 4, priority="low")], [pending("n", 4, priority="normal")],
        {}, set(), {"n": "Resources"}),
    "equal rank is never evicted (a preemptible class that may preempt)": (
        [node("a", 4)], [running("v", 4, priority="urgent")], [pending("u", 4, priority="urgent")],
        {"classes": URGENT}, set(), {"u": "Resources"}),
    "the same class evicts lower ranks": (
        [node("a", 4)], [running("v", 4, priority="normal")], [pending("u", 4, priority="urgent")],
        {"classes": URGENT}, {"v"}, {"u": "Preempting"}),
    "two preemptors never share a victim": (
        [node("a", 4)], [running("v1", 2), running("v2", 2, first=2)],
        [pending("c1", 2, submitted=1), pending("c2", 2, submitted=2)], {},
        {"v1", "v2"}, {"c1": "Preempting", "c2": "Preempting"}),
    "evicting a gang frees each of its nodes": (
        [node("a", 4), node("b", 4)], [running("g", 4, nodes=("a", "b"))],
        [pending("c1", 4, submitted=1), pending("c2", 4, submitted=2)], {},
        {"g"}, {"c1": "Preempting", "c2": "Preempting"}),
    "gang preemptor gets victims on N nodes (least work lost)": (
        [node("a", 4), node("b", 4), node("c", 4)],
        [running("va", 4, "a", started=1000), running("vb", 4, "b", started=5000),
         running("vc", 4, "c", started=3000)],
        [pending("gang", 4, nodes=2)], {}, {"vb", "vc"}, {"gang": "Preempting"}),
    # -- a second cycle, with the victims already stopping
    "victims stopping: no further eviction": (
        [node("a", 4), node("b", 4)],
        [running("v", 4, "a", state=JobState.STOPPING), running("other", 4, "b")],
        [pending("crit", 4)], {}, set(), {"crit": "Preempting"}),
    "victims stopping for one preemptor; the next one evicts anew": (
        [node("a", 4), node("b", 4)],
        [running("v", 4, "a", state=JobState.STOPPING), running("other", 4, "b")],
        [pending("c1", 4, submitted=1), pending("c2", 4, submitted=2)], {},
        {"other"}, {"c1": "Preempting", "c2": "Preempting"}),
    # -- room the job may not use is no room being made (its ``sites``)
    "free GPUs on a spot node the job may not use: it evicts on-prem": (
        [node("a", 4), node("s", 4, site="aws:us-east-1:spot")], [running("v", 4)],
        [pending("crit", 4, sites=("onprem", "cloud"))], {}, {"v"}, {"crit": "Preempting"}),
    "GPUs stopping on a spot node the job may not use: it evicts on-prem": (
        [node("a", 4), node("s", 4, site="aws:us-east-1:spot")],
        [running("v", 4), running("gone", 4, "s", state=JobState.STOPPING)],
        [pending("crit", 4, sites=("onprem", "cloud"))], {}, {"v"}, {"crit": "Preempting"}),
    "GPUs stopping on a node it may use: it waits for them": (
        [node("a", 4), node("s", 4, site="aws:us-east-1:spot")],
        [running("v", 4), running("gone", 4, "s", state=JobState.STOPPING)],
        [pending("crit", 4, sites=("onprem", "cloud", "spot"))], {}, set(),
        {"crit": "Preempting"}),
}


@pytest.mark.parametrize(("nodes", "active", "queue", "kw", "victims", "want_codes"),
                         list(CASES.values()), ids=list(CASES))
def test_preemption(nodes, active, queue, kw, victims, want_codes) -> None:  # type: ignore[no-untyped-def]
    plan = run_cycle(snap(nodes, queue, active, **kw), POLICY)
    assert evicted(plan) == victims
    assert {k: r.code for k, r in plan.pending.items()} == want_codes
    assert not plan.starts
    assert len(plan.preemptions) == len(victims)  # each victim once


# -- quota reclaim ------------------------------------------------------------------------------

TEAMS = (Team("A", quota_gpus=4), Team("B", quota_gpus=4))

# (nodes, active, pending, teams, victims, reason codes)
QUOTA = {
    "reclaims from a team without a quota (equal class)": (
        [node("a", 4), node("b", 4)],
        [running("b1", 4, "a", team="B"), running("c1", 4, "b", team="C")],
        [pending("a1", 4, team="A", priority="normal")], TEAMS,
        {"c1"}, {"a1": "Quota"}),
    "reclaims from a team above its quota": (
        [node("a", 4), node("b", 4)],
        [running("b1", 4, "a", team="B", started=1000), running("b2", 4, "b", team="B",
                                                                started=6000)],
        [pending("a1", 4, team="A", priority="normal")], TEAMS,
        {"b2"}, {"a1": "Quota"}),
    "reclaims even from a higher-ranked preemptible borrower": (
        [node("a", 4)], [running("c1", 4, team="C", priority="normal")],
        [pending("a1", 4, team="A", priority="low")], TEAMS, {"c1"}, {"a1": "Quota"}),
    "never from a team within its quota": (
        [node("a", 4), node("b", 4)],
        [running("b1", 4, "a", team="B"), running("c1", 4, "b", team="C", priority="high")],
        [pending("a1", 4, team="A", priority="normal")], TEAMS,
        set(), {"a1": "Resources"}),
    "never a non-preemptible borrower": (
        [node("a", 4)], [running("c1", 4, team="C", priority="high")],
        [pending("a1", 4, team="A", priority="normal")], TEAMS, set(), {"a1": "Resources"}),
    "not beyond the team's own quota": (
        [node("a", 4), node("b", 4)],
        [running("a0", 4, "a", team="A"), running("c1", 4, "b", team="C")],
        [pending("a1", 4, team="A", priority="normal")], TEAMS,
        set(), {"a1": "Resources"}),
    "a team without a quota reclaims nothing": (
        [node("a", 4)], [running("c1", 4, team="C")],
        [pending("d1", 4, team="D", priority="normal")], TEAMS, set(), {"d1": "Resources"}),
}


@pytest.mark.parametrize(("nodes", "active", "queue", "teams", "victims", "want_codes"),
                         list(QUOTA.values()), ids=list(QUOTA))
def test_quota_reclaim(nodes, active, queue, teams, victims, want_codes) -> None:  # type: ignore[no-untyped-def]
    plan = run_cycle(snap(nodes, queue, active, teams=teams), POLICY)
    assert evicted(plan) == victims
    assert {k: r.code for k, r in plan.pending.items()} == want_codes


@pytest.mark.parametrize("evict", [(), ("priority",)])
def test_no_evictors_never_evict(evict: tuple[str, ...]) -> None:
    from policies.registry import PolicySet

    plan = run_cycle(snap([node("a", 4)], [pending("crit", 4)], [running("v", 4)]),
                     PolicySet(evict=evict))
    assert evicted(plan) == ({"v"} if evict else set())


def test_preemptions_carry_grace_and_attempt() -> None:
    v1 = replace(running("v1", 2), attempt=3)
    plan = run_cycle(snap([node("a", 4)], [pending("crit", 4)], [v1, running("v2", 2, first=2)],
                          grace_s=7.5), POLICY)
    assert sorted((p.job_id, p.attempt, p.grace_s) for p in plan.preemptions) == [
        ("v1", 3, 7.5), ("v2", 1, 7.5)]
    assert all("crit" in p.reason and p.for_job == "crit" for p in plan.preemptions)
    assert "v1" in plan.pending["crit"].message and "v2" in plan.pending["crit"].message


# -- the victim order ---------------------------------------------------------------------------

RANK = {c.name: c.rank for c in DEFAULT_CLASSES}


def key(j: Job) -> tuple[bool, float, int, float, str]:
    return victim_key(j, RANK[j.priority], NOW, 30.0)


ZERO_START_BUG = ("policies/evict/preemption.py victim_key uses `job.started_at or now`, so a job "
                  "that "
                  "started at t=0.0 (the simulator's clock starts at 0) counts as started now: "
                  "no work lost and the youngest; should test `started_at is not None`")

# (first, second): ``first`` is tried before ``second``
ORDER = {
    "checkpointable before not, whatever the loss": (
        running("ck", 8, started=1, checkpoint_dir="/c"), running("nock", 1, started=NOW - 10)),
    "less work lost: the younger": (
        running("young", 1, started=5000), running("old", 1, started=1000)),
    "less work lost: fewer GPUs": (running("one", 1), running("two", 2)),
    "checkpointing jobs lose only the grace period": (
        running("ck1", 1, started=1, checkpoint_dir="/c"),
        running("ck2", 2, started=NOW - 40, checkpoint_dir="/c")),
    "equal loss: lower class rank": (running("lo", 2, priority="low"), running("nrm", 2)),
    "equal loss and rank: the youngest (checkpointing)": (
        running("y", 1, started=5000, checkpoint_dir="/c"),
        running("o", 1, started=1000, checkpoint_dir="/c")),
    "equal loss and rank: the youngest (GPUs x time)": (
        running("y", 2, started=6000), running("o", 1, started=2000)),
    "equal in everything: by id": (running("j1", 1), running("j2", 1)),
    "a job started at t=0 lost the most work": pytest.param(
        running("later", 1, started=1), running("zero", 1, started=0)),
    "a job started at t=0 is the oldest": pytest.param(
        running("later", 1, started=1, checkpoint_dir="/c"),
        running("zero", 1, started=0, checkpoint_dir="/c")),
}


@pytest.mark.parametrize(("first", "second"),
                         list(ORDER.values()),
                         ids=list(ORDER))
def test_victim_order(first: Job, second: Job) -> None:
    assert key(first) < key(second)
    kinds = {"a": {f"GPU-a-{i}": ("A100-80GB", None) for i in range(8)}}
    order = [v.job.id for v in make_victims([second, first], kinds, key)]
    assert order == [first.id, second.id]


@pytest.mark.parametrize(("j", "lost"), [
    pytest.param(running("v", 2, started=1000), 2 * 9000.0, id="gpus x elapsed"),
    pytest.param(running("v", 2, started=1000, checkpoint_dir="/c"), 2 * 30.0,
                 id="checkpointing: gpus x grace"),
    pytest.param(running("v", 2, started=NOW - 10, checkpoint_dir="/c"), 2 * 10.0,
                 id="checkpointing, younger than the grace"),
])
def test_work_lost(j: Job, lost: float) -> None:
    kinds = {"a": {f"GPU-a-{i}": ("A100-80GB", None) for i in range(8)}}
    (v,) = make_victims([j], kinds, key)
    assert v.lost == pytest.approx(lost)
    assert v.devices == {"a": {("A100-80GB", None): 2}}


def test_victim_order_is_a_total_order() -> None:
    jobs = [running(f"j{i}", 1 + i % 3, started=1.0 + 1000.0 * (i % 4),
                    priority=("low", "normal")[i % 2],
                    **({"checkpoint_dir": "/c"} if i % 5 == 0 else {}))
            for i in range(20)]
    kinds = {"a": {f"GPU-a-{i}": ("A100-80GB", None) for i in range(8)}}
    want = [v.job.id for v in make_victims(jobs, kinds, key)]
    rng = random.Random(7)
    for _ in range(5):
        rng.shuffle(jobs)
        assert [v.job.id for v in make_victims(jobs, kinds, key)] == want


def test_cycle_spares_the_job_that_started_at_time_zero() -> None:
    """Both ran about as long; the one started at t=0 has the more work to lose."""
    plan = run_cycle(snap([node("a", 4)], [pending("crit", 2)],
                          [running("zero", 2, started=0.0),
                           running("later", 2, first=2, started=100.0)]), POLICY)
    assert evicted(plan) == {"later"}


TIE_BUG = ("policies/evict/preemption.py choose(): nodes of equal cost (victims, work lost) are "
           "ranked by node id (`per_node.sort(key=lambda t: (t[0], t[1]))`), so across nodes "
           "the documented victim order (lower class rank, then youngest, then id) is ignored; "
           "tie-break on the chosen victims' keys before the node id")


@pytest.mark.parametrize(("active", "victims"), [
    pytest.param([running("nrm", 4, "a"), running("lo", 4, "b", priority="low")], {"lo"},
                 id="the lower class, on the later node id"),
    pytest.param([running("lo", 4, "a", priority="low"), running("nrm", 4, "b")], {"lo"},
                 id="the lower class, on the earlier node id"),
    pytest.param([running("old", 4, "a", checkpoint_dir="/c"),
                  running("young", 4, "b", started=5000, checkpoint_dir="/c")], {"young"},
                 id="the youngest, on the later node id"),
    pytest.param([running("young", 4, "a", started=5000, checkpoint_dir="/c"),
                  running("old", 4, "b", checkpoint_dir="/c")], {"young"},
                 id="the youngest, on the earlier node id"),
])
def test_equal_cost_nodes_follow_the_victim_order(active: list[Job], victims: set[str]) -> None:
    """One victim on either node, losing as much work: the victim order decides, not the node."""
    plan = run_cycle(snap([node("a", 4), node("b", 4)], [pending("crit", 4)], active), POLICY)
    assert evicted(plan) == victims
