"""Every shipped policy bundle completes its cycle on any valid request (issue 36).

Random valid specs (0-64 GPUs per node, 0 CPUs, odd memory, MIG, gangs, every priority class
and site constraint the model allows, deadlines, price caps) on a small mixed cluster with
running jobs, cloud offers, a booting machine, budgets and a carbon forecast, through every
bundle that ships (policies/registry.py's built-in ones and those the shipped cluster files
build): every cycle completes, sets no job aside (a shipped policy does not fail on a valid
request), gives every job it leaves pending a reason, and gives no GPU twice.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import broker.sim.carbon_metrics  # noqa: F401  (declares the cluster files' sim_deadlines)
from broker.bench import carbon_sim
from broker.config.core import DEFAULT_CLASSES
from broker.cycle.plan import Plan, Snapshot
from broker.cycle.scheduler import run_cycle
from broker.model import Allocation, Instance, InstanceState, Job, JobSpec, Node, Offer, Site
from broker.model.cloud import Market
from broker.model.spec import SITES
from broker.model.state import JobState
from broker.sim.cluster import load_cluster, shipped_clusters
from policies.registry import BUNDLES, PolicySet
from tests.builders import node

NOW = 100_000.0
H = 3600.0
ZONE = "US-CAL-CISO"
CLASSES = (*DEFAULT_CLASSES[:3], replace(DEFAULT_CLASSES[3], flexible=True))
TEAMS = ("vision", "nlp", "infra")
TYPES = ("A100", "A100-80GB", "V100", "H100", "T4")


def shipped_bundles() -> dict[str, tuple[PolicySet, dict[str, Any]]]:
    """Bundle name -> (bundle, the settings its cluster file gives): the built-in bundles,
    those built in the shipped cluster files, and the carbon bench's."""
    out: dict[str, tuple[PolicySet, dict[str, Any]]] = {
        name: (ps, {}) for name, ps in BUNDLES.items()}
    out[carbon_sim.POLICY.name] = (carbon_sim.POLICY, {})
    for name in shipped_clusters():
        cluster = load_cluster(name)
        for bname, ps in cluster.policies.items():
            out.setdefault(bname, (ps, dict(cluster.settings)))
    return out


BUNDLE_SETS = shipped_bundles()


def _nodes() -> list[Node]:
    return [node("a", 8, "A100-80GB", cpus=64, memory_gb=512),
            node("b", 4, "V100-16GB", cpus=0, memory_gb=0),
            node("m", 2, "A100-40GB", cpus=32, memory_gb=255.5, mig={0: ["1g.5gb"] * 7}),
            replace(node("c", 8, "H100-80GB", cpus=96, memory_gb=1024,
                         site="aws:us-east-1:ondemand"), instance_id="i-1")]


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    """The keyword arguments of a valid JobSpec."""
    gpus = draw(st.integers(0, 64) | st.sampled_from([0, 1, 2, 4, 8]))
    mig = draw(st.none() | st.just("1g.5gb")) if 1 <= gpus <= 7 else None
    nodes = 1 if mig else draw(st.sampled_from([1, 1, 1, 2, 3]))
    sites = draw(st.lists(st.sampled_from(SITES), min_size=1, max_size=3, unique=True))
    return {
        "gpus": gpus, "nodes": nodes, "mig_profile": mig,
        "gpu_types": () if mig else tuple(draw(st.lists(st.sampled_from(TYPES), max_size=2,
                                                        unique=True))),
        "min_gpu_memory_gb": draw(st.sampled_from([0.0, 0.0, 16.0, 79.5])),
        "cpus": draw(st.sampled_from([0.0, 0.0, 0.5, 1.0, 7.25, 200.0])),
        "memory_gb": draw(st.sampled_from([0.0, 0.001, 3.3, 511.9, 4096.0])),
        "priority": draw(st.sampled_from([c.name for c in CLASSES])),
        "team": draw(st.sampled_from(TEAMS)),
        "time_limit": draw(st.none() | st.sampled_from([1.0, 59.0, 3600.0, 86400.0 * 3])),
        "deadline": draw(st.none() | st.sampled_from([NOW - 10.0, NOW + 600.0, NOW + 2 * H,
                                                      NOW + 48 * H])),
        "sites": tuple(sites),
        "max_price_per_hour": draw(st.none() | st.sampled_from([0.01, 2.0, 100.0])),
        "checkpoint_dir": draw(st.none() | st.just("/ckpt")),
    }


def _pending(i: int, kw: dict[str, Any], waited: float) -> Job:
    spec = JobSpec(command="true", **kw)
    return Job(f"p{i}", spec, JobState.PENDING, NOW - waited)


# running jobs: whole GPUs on a and b, a MIG instance on m, one on the rented machine
def _active() -> list[Job]:
    def run(jid: str, gpus: int, allocs: tuple[Allocation, ...], **kw: Any) -> Job:
        spec = JobSpec(command="true", gpus=gpus, team=kw.pop("team", "nlp"),
                       priority=kw.pop("priority", "normal"), nodes=len(allocs), **kw)
        return Job(jid, spec, JobState.RUNNING, NOW - 5 * H, allocations=allocs,
                   started_at=NOW - 4 * H, attempt=1)
    return [
        run("r1", 4, (Allocation("a", tuple(f"GPU-a-{i}" for i in range(4))),),
            time_limit=8 * H, checkpoint_dir="/c"),
        run("r2", 2, (Allocation("b", ("GPU-b-0", "GPU-b-1")),), priority="low",
            team="vision"),
        run("r3", 1, (Allocation("m", ("MIG-m-0-0",)),), mig_profile="1g.5gb",
            priority="high", cpus=2.0, memory_gb=10.0),
        run("r4", 2, (Allocation("c", ("GPU-c-0", "GPU-c-1")),), time_limit=2 * H),
    ]


def _offers() -> tuple[Offer, ...]:
    out = []
    for market, price in ((Market.SPOT, 0.9), (Market.ONDEMAND, 3.06)):
        for gpus, model, typ in ((1, "V100-16GB", "p3.2xlarge"), (8, "A100-80GB", "p4d"),
                                 (8, "H100-80GB", "p5")):
            out.append(Offer("aws", "us-east-1", "us-east-1a" if market is Market.SPOT else "",
                             typ, model, gpus, 80.0, market, price * gpus, carbon_zone=ZONE,
                             extra={"boot_s": 120.0, "interruption_rate_per_hour": 0.05}))
    return tuple(out)


def _snapshot(pending: list[Job], cluster_settings: dict[str, Any]) -> Snapshot:
    nodes, active = _nodes(), _active()
    allocated: dict[str, dict[str, str]] = {n.id: {} for n in nodes}
    for j in active:
        for a in j.allocations:
            for g in a.gpu_ids:
                allocated[a.node_id][g] = f"{j.id}:{j.attempt}"
    offers = _offers()
    instances = (  # one machine booting for the first job, one up (node c) for the last
        Instance("req-1", offers[4].id, InstanceState.BOOTING, requested_at=NOW - 60,
                 price_per_hour=offers[4].price_per_hour, for_jobs=(pending[0].id,)),
        Instance("req-2", offers[5].id, InstanceState.READY, "i-1", "c",
                 requested_at=NOW - 5 * H, ready_at=NOW - 5 * H + 120,
                 price_per_hour=offers[5].price_per_hour, for_jobs=(pending[-1].id, "r4")))
    forecast = tuple((NOW + i * 1800.0, 200.0 + 150.0 * ((i * 7) % 5)) for i in range(96))
    return Snapshot(
        NOW, tuple(pending), tuple(active), tuple(nodes), allocated, CLASSES,
        teams=(), usage={"nlp": 3.6e6, "vision": 1.0e5}, settings=cluster_settings,
        sites=(Site(carbon_zone=ZONE), Site("aws", "us-east-1", "", Market.ONDEMAND, ZONE),
               Site("aws", "us-east-1", "us-east-1a", Market.SPOT, ZONE)),
        offers=offers, instances=instances, budgets={"vision": 50.0, "infra": 0.0},
        spend={"vision": 49.0}, soft_budgets=frozenset({"nlp"}),
        carbon={ZONE: 250.0}, carbon_forecast={ZONE: forecast})


def _parents(snap: Snapshot) -> dict[tuple[str, str], str]:
    """(node, device id) -> the physical GPU it is part of ("" for a whole GPU)."""
    return {(n.id, g.id): g.parent or "" for n in snap.nodes for g in n.gpus}


def _clashes(taken: dict[tuple[str, str], str], parents: dict[tuple[str, str], str],
             node_id: str, dev: str) -> str | None:
    """Who already holds ``dev`` on ``node_id``, or a whole GPU it is part of, or a MIG
    instance of it (one physical GPU is given once: whole, or as its instances)."""
    parent = parents[(node_id, dev)]
    for key in ((node_id, dev), (node_id, parent)):
        if key in taken:
            return taken[key]
    if not parent:
        for (nid, other), who in taken.items():
            if nid == node_id and parents.get((nid, other)) == dev:
                return who
    return None


def check_plan(snap: Snapshot, plan: Plan) -> None:
    started = {s.job_id for s in plan.starts}
    waiting = {j.id for j in snap.pending} - started
    assert not plan.set_aside, {k: a.error for k, a in plan.set_aside.items()}
    missing = waiting - set(plan.pending)
    assert not missing, f"pending without a reason: {sorted(missing)}"
    assert len(started) == len(plan.starts), "a job started twice"
    parents = _parents(snap)
    taken = {(nid, dev): owner.split(":")[0] for nid, devs in snap.allocated.items()
             for dev, owner in devs.items()}
    for s in plan.starts:
        for a in s.allocations:
            for dev in a.gpu_ids:
                assert (a.node_id, dev) in parents, f"{s.job_id}: no {dev} on {a.node_id}"
                who = _clashes(taken, parents, a.node_id, dev)
                assert who is None, f"{s.job_id} given {dev} on {a.node_id}, held by {who}"
                taken[(a.node_id, dev)] = s.job_id
    _check_hosts(snap, plan)


def _check_hosts(snap: Snapshot, plan: Plan) -> None:
    """No node that accounts CPUs or memory is given more than it has (a CPU-only job is
    placed on CPUs and memory)."""
    jobs = {j.id: j for j in (*snap.pending, *snap.active)}
    used: dict[str, list[float]] = {n.id: [0.0, 0.0] for n in snap.nodes}
    for job_id, allocs in [(j.id, j.allocations) for j in snap.active] + \
            [(s.job_id, s.allocations) for s in plan.starts]:
        for a in allocs:
            used[a.node_id][0] += jobs[job_id].spec.cpus
            used[a.node_id][1] += jobs[job_id].spec.memory_gb
    for n in snap.nodes:
        cpus, mem = used[n.id]
        assert not n.cpus or cpus <= n.cpus + 1e-9, f"{n.id}: {cpus} CPUs of {n.cpus} given"
        assert not n.memory_gb or mem <= n.memory_gb + 1e-9, \
            f"{n.id}: {mem} GB of {n.memory_gb} given"


@pytest.mark.parametrize("name", sorted(BUNDLE_SETS))
@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(jobs=st.lists(st.tuples(specs(), st.sampled_from([0.0, 30.0, 2 * H, 30 * H])),
                     min_size=1, max_size=12))
def test_every_bundle_completes_every_cycle(name: str,
                                            jobs: list[tuple[dict[str, Any], float]]) -> None:
    policies, cluster_settings = BUNDLE_SETS[name]
    pending = [_pending(i, kw, waited) for i, (kw, waited) in enumerate(jobs)]
    snap = _snapshot(pending, cluster_settings)
    check_plan(snap, run_cycle(snap, policies, NOW))
