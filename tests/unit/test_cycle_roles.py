"""The cycle as a recipe of registered roles: what registers, what a PolicySet may name, the
room left for sites and offers, and the simulator refusing what it cannot carry out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from broker.cycle.plan import Launch
from broker.cycle.scheduler import run_cycle
from broker.errors import ConfigError
from broker.model import Offer
from broker.model.cloud import Market
from broker.sim.cluster import cluster_from_data
from broker.sim.engine import Simulation
from policies.cycle import Cycle
from policies.registry import BUNDLES, ROLES, PolicySet, register, registered
from tests.builders import node
from tests.unit.test_preemption import pending, snap
from tests.unit.test_sim_engine import tj, trace

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("role", "names"), [
    ("order", {"fifo", "priority-fifo", "multifactor", "spillway"}),
    ("admit", {"admit-all"}),
    ("place", {"best-fit", "aligned"}),
    ("reserve", {"easy", "strict"}),
    ("evict", {"scavenge", "priority", "move", "relief"}),
    ("burst", {"none"}),
    ("defer", {"none"}),
    ("estimate", {"limit", "predictor"}),
])
def test_every_role_has_its_built_in_policies(role: str, names: set[str]) -> None:
    assert names <= set(registered(role))


def test_the_bundles_name_only_registered_policies() -> None:
    for bundle in BUNDLES.values():
        assert bundle.check() is bundle
        assert set(ROLES) == {r for r in ROLES if bundle.names(r) or r == "evict"}


@pytest.mark.parametrize(("raw", "error"), [
    ({"order": "fifo", "reserve": "strict", "evict": []}, None),
    ({"evict": ["priority", "relief"], "place": "aligned"}, None),
    ({"order": "lifo"}, "no order policy named 'lifo'; registered: fifo, multifactor, "),
    ({"evict": "priority"}, "evict must be a list of names"),
    ({"preempt": "priority"}, "'preempt' is not a role; allowed: order, admit, place"),
    ({"evict": ["defrag"]}, "no evict policy named 'defrag'; registered: move, priority, "),
])
def test_a_bundle_built_from_a_mapping(raw: dict[str, object], error: str | None) -> None:
    if error is None:
        assert PolicySet.from_mapping("mine", raw).name == "mine"
    else:
        with pytest.raises(ValueError, match=error.replace("(", r"\(")):
            PolicySet.from_mapping("mine", raw)


NAME_BRANCHES = ("policies.order", "policies.place", "policies.reserve", "policies.evict.base",
                 "policy.order", "policy.place", "policy.reserve", "policy.evict",
                 "policies.name", "policy.name")


@pytest.mark.parametrize("path", ["broker/cycle/scheduler.py", "broker/sim/engine.py",
                                  "policies/place/queue.py"])
def test_no_policy_name_is_compared_in_the_cycle_or_the_simulator(path: str) -> None:
    tree = ast.parse((ROOT / path).read_text())
    for n in ast.walk(tree):
        if isinstance(n, ast.Compare):
            text = ast.unparse(n)
            assert not any(b in text for b in NAME_BRANCHES), f"{path}: {text}"


def test_the_simulator_imports_nothing_from_policies_but_the_registry() -> None:
    """(and the settings check, for a cluster file's ``settings``)"""
    allowed = {"policies.registry", "policies.settings"}
    for path in (ROOT / "broker" / "sim").glob("*.py"):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("policies"):
                assert n.module in allowed, f"{path.name}: {n.module}"


def h100_offer(count: int = 8) -> Offer:
    return Offer(provider="aws", region="us-east-1", zone="us-east-1a",
                 instance_type="p5.48xlarge", gpu_model="H100-80GB", gpu_count=count,
                 gpu_memory_gb=80, market=Market.SPOT, price_per_hour=40.0)


@pytest.mark.parametrize(("offers", "sites", "code"), [
    ((), ("onprem", "cloud"), "NoFeasibleNode"),  # no node and no offer could hold it
    ((h100_offer(),), ("onprem", "cloud"), "Resources"),  # an offer could: it waits
    ((h100_offer(),), ("onprem",), "NoFeasibleNode"),  # but it may not leave on-prem
    ((h100_offer(4),), ("onprem", "cloud"), "NoFeasibleNode"),  # an offer too small
])
def test_feasibility_counts_offers(offers: tuple[Offer, ...], sites: tuple[str, ...],
                                   code: str) -> None:
    job = pending("big", 8, gpu_types=("H100",), sites=sites)
    plan = run_cycle(snap([node("a", 4)], [job], [], offers=offers), PolicySet())
    assert plan.pending["big"].code == code
    assert plan.starts == () and plan.launches == ()


def test_the_snapshot_has_room_for_sites_and_money_empty_on_prem() -> None:
    s = snap([node("a", 4)], [], [])
    assert (s.sites, s.offers, s.instances) == ((), (), ())
    assert (dict(s.budgets), dict(s.spend), dict(s.prices), dict(s.carbon)) == ({}, {}, {}, {})


@register("burst", "test-launch-everything")
def _launch_everything(cycle: Cycle) -> None:
    cycle.launches.extend(Launch("aws:x", 1, f"r-{j.id}", (j.id,)) for j in cycle.blocked)


def test_the_simulator_refuses_a_plan_it_cannot_carry_out() -> None:
    cluster = cluster_from_data({"name": "tiny", "nodes": [{"prefix": "n", "gpus": "4xL4"}]},
                                "tiny.yaml")
    policy = PolicySet(burst="test-launch-everything", name="launcher")
    jobs = trace(tj("a", 0.0, 600.0, 2), tj("b", 1.0, 600.0, 4))  # b waits: a launch
    with pytest.raises(ConfigError, match=r"planned 1 launch\(es\) and 0 termination\(s\), "
                                          r"but this simulation has no cloud provisioner"):
        Simulation(cluster, jobs, policy).run()


def test_a_cluster_file_builds_a_bundle_the_simulator_runs(tmp_path: Path) -> None:
    from broker.sim.run import SimRequest, simulate

    path = tmp_path / "c.yaml"
    path.write_text("name: c\nnodes: [{prefix: n, count: 2, gpus: 4xL4}]\n"
                    "policies:\n  mine: {order: fifo, reserve: easy, evict: []}\n")
    csv = tmp_path / "t.csv"
    csv.write_text("id,submit_time,duration_s,num_gpus\n"
                   + "".join(f"j{i},{i * 10},{600 + i},{1 + i % 4}\n" for i in range(20)))
    mine, fcfs = simulate(SimRequest(trace=str(csv), cluster=str(path),
                                     policies=("mine", "fcfs")), workers=1)
    assert mine.policy == "mine" and mine.metrics["finished"] == 20
    assert mine.metrics["wait_mean_s"] <= fcfs.metrics["wait_mean_s"]  # EASY backfills


@pytest.mark.parametrize(("raw", "error"), [
    ({"fcfs": {"order": "fifo"}}, "c: policies.fcfs: a built-in bundle's name"),
    ({"mine": {"evict": ["nope"]}}, "c: policies.mine: no evict policy named 'nope'"),
    ({"mine": "fifo"}, "c: policies.mine: must be a mapping of role to policy name"),
    ([1], "c: policies: must be a mapping of a bundle's name"),
])
def test_a_bad_bundle_in_a_cluster_file_says_what(raw: object, error: str) -> None:
    with pytest.raises(ConfigError, match=error.replace("(", r"\(")):
        cluster_from_data({"nodes": [{"prefix": "n", "gpus": "4xL4"}], "policies": raw}, "c")


def test_the_configuration_selects_a_bundle_it_builds(tmp_path: Path) -> None:
    from broker.config.core import load_config
    from policies.settings import check_config

    path = tmp_path / "spillway.yaml"
    path.write_text("policy: mine\npolicies:\n  mine: {order: spillway, evict: [priority]}\n")
    cfg = check_config(load_config(path, env={}))
    assert cfg.policy == "mine"
    path.write_text("policy: theirs\npolicies:\n  mine: {order: spillway}\n")
    with pytest.raises(ConfigError, match=r"config policy: 'theirs' is not one of \["):
        check_config(load_config(path, env={}))
