"""Submit-time feasibility without ghosts, and refusals that name the cloud offer that could
run the job: a node dead for ``node_forget_after_s`` no longer counts; a cloud offer counts
only where the job's class may burst and its sites allow the offer's market, and a refusal
says which offer could and what would let it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.config.core import DEFAULT_CLASSES, Config, load_config
from broker.cycle.feasible import counted, problems
from broker.errors import ConfigError
from broker.model import Gpu, JobSpec, Market, Node, NodeState, Offer

NOW = 1_000_000.0
DAY = 86400.0


def node(node_id: str, lease_expires: float, count: int = 8,
         state: NodeState = NodeState.READY) -> Node:
    gpus = tuple(Gpu(f"GPU-{node_id}-{i}", i, "A100-80GB", 80.0) for i in range(count))
    return Node(node_id, gpus, hostname=node_id, cpus=64, memory_gb=512, state=state,
                lease_expires=lease_expires, incarnation="i1")


def spec(**fields: object) -> JobSpec:
    return JobSpec.parse({"command": "true", **fields}, Config())


def offer(gpus: int = 16, market: Market = Market.ONDEMAND, price: float = 55.7) -> Offer:
    return Offer(provider="gcp", region="us-central1", zone="us-central1-a",
                 instance_type="a2-megagpu-16g", gpu_model="A100-40GB", gpu_count=gpus,
                 gpu_memory_gb=40.0, market=market, price_per_hour=price)


ALIVE = NOW + 3  # a lease that runs 3 s more
DOWN = NodeState.DOWN


# (dead for, in seconds before NOW, with node_forget_after_s = a day: counted?)
@pytest.mark.parametrize(("lease_expires", "state", "kept"), [
    (ALIVE, NodeState.READY, True),  # alive
    (NOW - 10, DOWN, True),  # dead 10 s: may come back
    (NOW - DAY + 1, DOWN, True),  # just under a day
    (NOW - DAY, DOWN, False),  # a day: a ghost
    (NOW - 30 * DAY, DOWN, False),
    (NOW - 2 * DAY, NodeState.READY, False),  # lease lapsed, never marked DOWN: dead too
    (0.0, DOWN, False),  # never had a lease
])
def test_a_dead_node_counts_until_node_forget_after_s(lease_expires: float, state: NodeState,
                                                      kept: bool) -> None:
    n = node("n1", lease_expires, state=state)
    live, ghosts = counted([n], NOW, DAY)
    assert (live, ghosts) == (([n], []) if kept else ([], [n]))


# a 2-node job on a cluster of one live node and one long-dead one
@pytest.mark.parametrize(("dead_since", "forget_after_s", "refused"), [
    (NOW - 3600, DAY, False),  # down an hour: it may come back, the job waits for it
    (NOW - 2 * DAY, DAY, True),  # down two days: a ghost, the job could never run
    (NOW - 2 * DAY, 7 * DAY, False),  # a week's patience
    (NOW - 2 * DAY, None, False),  # no expiry asked (the old rule): counted for ever
])
def test_a_gang_that_needs_a_ghost_is_refused(dead_since: float, forget_after_s: float | None,
                                              refused: bool) -> None:
    nodes = [node("n1", ALIVE), node("ghost", dead_since, state=DOWN)]
    found = problems(spec(gpus=8, nodes=2), nodes, now=NOW, forget_after_s=forget_after_s)
    assert bool(found) is refused
    if refused:
        assert [p.field for p in found] == ["nodes"]
        words = " ".join(found[0].problem.split())
        assert "asks 2 nodes; 1 registered node(s) could hold a part" in words
        assert "not counted: 1 node(s) dead for more than 86400s (node_forget_after_s): " \
               "ghost; `spillway nodes --forget NODE` removes one" in words


def test_only_ghosts_left_says_no_node_is_alive() -> None:
    found = problems(spec(gpus=1), [node("ghost", NOW - 2 * DAY, state=DOWN)], now=NOW,
                     forget_after_s=DAY)
    assert [p.field for p in found] == ["nodes"]
    assert found[0].problem.startswith("no node is alive, nor was one in the last 86400s")
    assert "--hold-if-infeasible" in found[0].problem and "ghost" in found[0].problem


ONPREM = "asks 16 GPUs per node; the most a registered node has of A100-80GB is 8"
OFFER = ("no registered node can, but cloud offer `gcp a2-megagpu-16g` (16 x A100-40GB, "
         "{market}) can, ")
MAY = "critical, high, normal"  # the shipped classes that may burst


# (class, sites, the offer's market: the refusal's words after the offer, or None: accepted)
@pytest.mark.parametrize(("priority", "sites", "market", "then"), [
    ("normal", "onprem,cloud,spot", Market.ONDEMAND, None),  # it bursts: accepted
    ("high", "cloud", Market.ONDEMAND, None),
    ("normal", "spot", Market.SPOT, None),
    ("low", "onprem,cloud,spot", Market.ONDEMAND,
     f"if your class may burst: class 'low' may not (classes that may: {MAY})"),
    ("normal", "onprem", Market.ONDEMAND,
     "if the job may run in the cloud: add cloud to its sites"),
    ("normal", "onprem,cloud", Market.SPOT,
     "if the job may run on spot machines: add spot to its sites"),
    ("critical", "onprem,cloud,spot", Market.SPOT,
     "if your class may use spot: class 'critical' may not"),
])
def test_a_refusal_names_the_cloud_offer_that_could_and_what_would_let_it(
        priority: str, sites: str, market: Market, then: str | None) -> None:
    found = problems(spec(gpus=16, priority=priority, sites=sites), [node("n1", ALIVE)],
                     [offer(market=market)], classes=DEFAULT_CLASSES, now=NOW,
                     forget_after_s=DAY)
    if then is None:
        assert found == []
        return
    assert [p.field for p in found] == ["gpus"]
    text = " ".join(found[0].problem.split())
    assert text.startswith(ONPREM), text
    assert text.endswith("; " + OFFER.format(market=market.value) + then), text


def test_no_offer_that_could_hold_it_leaves_the_refusal_as_it_was() -> None:
    found = problems(spec(gpus=32, priority="low"), [node("n1", ALIVE)], [offer()],
                     classes=DEFAULT_CLASSES, now=NOW, forget_after_s=DAY)
    assert [p.field for p in found] == ["gpus"]
    assert "cloud offer" not in found[0].problem


def test_the_cheapest_offer_that_could_hold_it_is_named() -> None:
    dear, cheap = offer(price=90.0), offer(price=40.0)
    cheap = replace(cheap, instance_type="a2-cheap-16g")
    found = problems(spec(gpus=16, priority="low"), [node("n1", ALIVE)], [dear, cheap],
                     classes=DEFAULT_CLASSES)
    assert "cloud offer `gcp a2-cheap-16g`" in found[0].problem


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_node_forget_after_s_is_checked_in_one_line(value: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(env={"SPILLWAY_NODE_FORGET_AFTER_S": value})
    assert str(e.value).startswith("SPILLWAY_NODE_FORGET_AFTER_S: ")
    assert str(e.value).endswith("use seconds > 0, e.g. 86400 (a day)")
    assert "\n" not in str(e.value)


def test_node_forget_after_s_defaults_to_a_day() -> None:
    assert Config().node_forget_after_s == DAY
    assert load_config(env={"SPILLWAY_NODE_FORGET_AFTER_S": "3600"}).node_forget_after_s == 3600
