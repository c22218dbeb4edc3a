"""The vocabulary below the configuration: sites, offers, instances, and the node and instance
state tables, checked edge by edge."""

from __future__ import annotations

import itertools
import subprocess
import sys
from dataclasses import FrozenInstanceError, replace
from enum import Enum
from typing import Any

import pytest

from broker.errors import InvalidTransition
from broker.model import (
    INSTANCE_TERMINAL,
    INSTANCE_TRANSITIONS,
    NODE_TERMINAL,
    NODE_TRANSITIONS,
    Gpu,
    Instance,
    InstanceState,
    Market,
    Node,
    NodeState,
    Offer,
    Site,
    StateChange,
)

IS = InstanceState
NS = NodeState


def _pairs(table: dict[Any, frozenset[Any]], legal: bool) -> list[tuple[Any, Any]]:
    states = list(table)
    return [(a, b) for a, b in itertools.product(states, states) if (b in table[a]) is legal]


def _instance(state: InstanceState) -> Instance:
    return Instance("req-1", "aws:us-east-1:us-east-1a:spot/p4d.24xlarge", state,
                    provider_id="i-0abc", requested_at=1.0)


def _node(state: NodeState) -> Node:
    return Node("gpu01", (Gpu("GPU-0", 0, "A100-80GB", 80.0),), state=state)


# -- the tables themselves ---------------------------------------------------------------------


@pytest.mark.parametrize("table, enum", [(INSTANCE_TRANSITIONS, IS), (NODE_TRANSITIONS, NS)])
def test_every_state_has_a_row_and_no_self_loops(table: Any, enum: type[Enum]) -> None:
    assert set(table) == set(enum)
    assert all(s not in table[s] for s in table)


def test_the_instance_table_has_exactly_these_edges() -> None:
    edges = {(a.name, b.name) for a, b in _pairs(INSTANCE_TRANSITIONS, True)}
    assert edges == {
        ("REQUESTED", "BOOTING"), ("REQUESTED", "FAILED"), ("REQUESTED", "TERMINATED"),
        ("BOOTING", "READY"), ("BOOTING", "FAILED"), ("BOOTING", "TERMINATED"),
        ("READY", "DRAINING"), ("READY", "TERMINATED"), ("READY", "FAILED"),
        ("DRAINING", "READY"), ("DRAINING", "TERMINATED"),
    }
    assert frozenset({IS.TERMINATED, IS.FAILED}) == INSTANCE_TERMINAL


def test_the_node_table_has_exactly_these_edges() -> None:
    edges = {(a.name, b.name) for a, b in _pairs(NODE_TRANSITIONS, True)}
    assert edges == {
        ("READY", "DRAINING"), ("READY", "DOWN"),
        ("DRAINING", "READY"), ("DRAINING", "DOWN"),
        ("DOWN", "READY"), ("DOWN", "DRAINING"),
    }
    assert frozenset() == NODE_TERMINAL  # a DOWN node may come back


def test_one_comment_per_edge_in_the_source() -> None:
    """Convention 8: each edge of each table sits on its own line with its own comment."""
    import inspect

    from broker.model import cloud, node

    for module, table, prefix in ((cloud, INSTANCE_TRANSITIONS, "_I"),
                                  (node, NODE_TRANSITIONS, "_N")):
        lines = inspect.getsource(module).splitlines()
        for src, dst in _pairs(table, True):
            row = lines.index(f"    {prefix}.{src.name}: frozenset(")
            body = itertools.takewhile(lambda line: line.strip() != "}", lines[row + 1:])
            hits = [line for line in body if line.strip().startswith(f"{prefix}.{dst.name},")]
            assert len(hits) == 1 and "  # " in hits[0], (src, dst)


# -- instances ---------------------------------------------------------------------------------


@pytest.mark.parametrize("src, dst", _pairs(INSTANCE_TRANSITIONS, True),
                         ids=lambda s: s.name)
def test_every_legal_instance_move_succeeds_and_is_recorded(src: IS, dst: IS) -> None:
    before = _instance(src)
    after = before.moved(dst, 50.0, "because", node_id="gpu-cloud-1")
    assert after.state is dst
    assert after.history == (StateChange(dst, 50.0, "because"),)
    assert after.node_id == "gpu-cloud-1"
    assert before.state is src and before.history == ()  # replace(), never mutation
    assert after.ended_at == (50.0 if dst in INSTANCE_TERMINAL else None)


@pytest.mark.parametrize("src, dst", _pairs(INSTANCE_TRANSITIONS, False),
                         ids=lambda s: s.name)
def test_every_illegal_instance_move_raises(src: IS, dst: IS) -> None:
    with pytest.raises(InvalidTransition) as e:
        _instance(src).moved(dst, 50.0, "no")
    assert (e.value.job_id, e.value.src, e.value.dst, e.value.what) == \
        ("i-0abc", src.value, dst.value, "instance")
    assert str(e.value) == f"instance i-0abc: illegal state change {src.value} -> {dst.value}"


@pytest.mark.parametrize("src", sorted(INSTANCE_TERMINAL), ids=lambda s: s.name)
def test_an_ended_instance_has_no_way_out(src: IS) -> None:
    inst = _instance(src)
    assert inst.ended
    for dst in IS:
        with pytest.raises(InvalidTransition):
            inst.moved(dst, 9.0, "too late")


def test_an_instance_life_records_its_times_and_round_trips() -> None:
    inst = Instance("req-7", "gcp:us-central1:us-central1-a:ondemand/a2-highgpu-1g",
                    requested_at=10.0)
    assert inst.id == "req-7" and inst.state is IS.REQUESTED
    inst = inst.moved(IS.BOOTING, 20.0, "listed", provider_id="vm-9")
    inst = inst.moved(IS.READY, 80.0, "agent registered", node_id="vm-9")
    inst = inst.moved(IS.DRAINING, 900.0, "idle")
    inst = inst.moved(IS.READY, 950.0, "new demand")  # ready_at keeps the first time
    inst = inst.moved(IS.DRAINING, 2000.0, "idle")
    inst = inst.moved(IS.TERMINATED, 2100.0, "released")
    assert (inst.id, inst.ready_at, inst.ended_at) == ("vm-9", 80.0, 2100.0)
    assert [h.state for h in inst.history] == [IS.BOOTING, IS.READY, IS.DRAINING, IS.READY,
                                               IS.DRAINING, IS.TERMINATED]
    assert Instance.from_dict(inst.to_dict()) == inst


def test_an_instance_is_frozen() -> None:
    inst = _instance(IS.READY)
    with pytest.raises(FrozenInstanceError):
        inst.state = IS.FAILED  # type: ignore[misc]
    assert replace(inst, node_id="n").node_id == "n"


# -- nodes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("src, dst", _pairs(NODE_TRANSITIONS, True), ids=lambda s: s.name)
def test_every_legal_node_move_succeeds_and_is_recorded(src: NS, dst: NS) -> None:
    before = _node(src)
    after = before.moved(dst, 5.0, "operator", lease_expires=7.0)
    assert (after.state, after.lease_expires) == (dst, 7.0)
    assert after.history == (StateChange(dst, 5.0, "operator"),)
    assert before.state is src and before.history == ()
    assert Node.from_dict(after.to_dict()) == after


@pytest.mark.parametrize("src, dst", _pairs(NODE_TRANSITIONS, False), ids=lambda s: s.name)
def test_every_illegal_node_move_raises(src: NS, dst: NS) -> None:
    with pytest.raises(InvalidTransition, match=f"node gpu01: illegal state change {src.value}"):
        _node(src).moved(dst, 5.0, "no")


def test_a_node_that_never_moved_keeps_its_stored_record() -> None:
    assert "history" not in _node(NS.READY).to_dict()
    assert Node.from_dict(_node(NS.DOWN).to_dict()).history == ()


def test_job_transition_errors_read_as_before() -> None:
    assert str(InvalidTransition("j1", "PENDING", "RUNNING")) == \
        "job j1: illegal state change PENDING -> RUNNING"


# -- sites -------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, site", [
    ("onprem", Site()),
    ("aws:us-east-1:us-east-1a:spot", Site("aws", "us-east-1", "us-east-1a", Market.SPOT)),
    ("gcp:us-central1:ondemand", Site("gcp", "us-central1", "", Market.ONDEMAND)),
    ("azure:eastus:1:spot", Site("azure", "eastus", "1", Market.SPOT)),
])
def test_site_ids_parse_and_print(text: str, site: Site) -> None:
    assert Site.parse(text) == site
    assert str(site) == site.id == text
    assert Site.parse(str(site)) == site


def test_site_parsing_is_forgiving_about_case_and_spelling() -> None:
    assert Site.parse(" AWS:us-east-1:On-Demand ") == Site("aws", "us-east-1", "", "ondemand")  # type: ignore[arg-type]
    assert Site("aws", "us-east-1", "", "spot").market is Market.SPOT  # type: ignore[arg-type]


def test_site_kinds_match_the_jobspec_site_words() -> None:
    assert [Site.parse(t).kind for t in ("onprem", "aws:r:spot", "aws:r:ondemand")] == \
        ["onprem", "spot", "cloud"]
    assert Site().is_onprem and not Site.parse("aws:r:spot").is_onprem


@pytest.mark.parametrize("text, says", [
    ("", "got 1 part"),
    ("aws", "got 1 part"),
    ("aws:us-east-1", "got 2 part"),
    ("aws:us-east-1:a:b:spot", "got 5 part"),
    ("aws:us-east-1:cheap", "market 'cheap' is not one of spot, ondemand"),
    ("aws:us-east-1:us-east-1a:reserved", "market 'reserved' is not one of spot, ondemand"),
    ("aws::spot", "region '' is not a name"),
    (":us-east-1:spot", "provider '' is not a name"),
    ("aws:us-east-1::spot", "zone '' is not a name"),
    ("aws:us east 1:spot", "region 'us east 1' is not a name"),
    ("onprem:us-east-1:spot", "on-prem has no region, zone or market"),
])
def test_a_bad_site_id_says_what_was_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=f"site {text!r}: .*{says}"):
        Site.parse(text)


def test_a_bad_site_built_directly_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a market"):
        Site("aws", "us-east-1")
    with pytest.raises(ValueError, match="on-prem has no region"):
        Site(region="us-east-1")


def test_sites_are_frozen_and_hashable_and_carbon_zone_is_not_identity() -> None:
    a = Site.parse("aws:us-east-1:spot", carbon_zone="US-MIDA-PJM")
    b = Site.parse("aws:us-east-1:spot")
    assert a == b and hash(a) == hash(b) and len({a, b, Site()}) == 2
    assert a.carbon_zone == "US-MIDA-PJM"
    with pytest.raises(FrozenInstanceError):
        a.region = "eu-west-1"  # type: ignore[misc]


# -- offers ------------------------------------------------------------------------------------


def _offer(**changes: Any) -> Offer:
    base: dict[str, Any] = dict(
        provider="aws", region="us-east-1", zone="us-east-1a", instance_type="p4d.24xlarge",
        gpu_model="A100-40GB", gpu_count=8, gpu_memory_gb=40.0, market=Market.SPOT,
        price_per_hour=9.83, carbon_zone="US-MIDA-PJM", extra={"ebs_optimized": True},
    )
    return Offer(**{**base, **changes})


def test_offers_are_frozen_hashable_and_know_their_site() -> None:
    a, b = _offer(), _offer(extra={"other": [1, 2]})
    assert a == b and hash(a) == hash(b)  # extra is not part of identity
    assert a != _offer(price_per_hour=12.0)
    assert len({a, b, _offer(market="ondemand")}) == 2
    assert a.id == "aws:us-east-1:us-east-1a:spot/p4d.24xlarge"
    assert a.site == Site.parse("aws:us-east-1:us-east-1a:spot")
    assert a.site.carbon_zone == "US-MIDA-PJM"
    assert a.price_per_gpu_hour == pytest.approx(9.83 / 8)
    with pytest.raises(FrozenInstanceError):
        a.price_per_hour = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        a.extra["x"] = 1  # type: ignore[index]
    assert replace(a, price_per_hour=3.0).price_per_hour == 3.0


@pytest.mark.parametrize("changes, says", [
    ({"market": "reserved"}, "market 'reserved'"),
    ({"region": ""}, "region ''"),
    ({"instance_type": " "}, "instance_type must not be empty"),
    ({"gpu_count": 0}, "gpu_count 0 must be a whole number >= 1"),
    ({"price_per_hour": -1.0}, "price_per_hour -1.0 must be a number >= 0"),
    ({"gpu_memory_gb": float("nan")}, "gpu_memory_gb nan"),
])
def test_a_bad_offer_is_refused(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        _offer(**changes)


# -- layering ----------------------------------------------------------------------------------


def test_the_model_imports_neither_configuration_nor_policies() -> None:
    code = (
        "import sys\n"
        "import broker.model, broker.model.spec, broker.model.job, broker.model.node\n"
        "import broker.model.classes, broker.model.cloud, broker.model.machine\n"
        "bad = sorted(m for m in sys.modules if m == 'broker.config.core' or m == 'policies'"
        " or m.startswith('policies.'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""


def test_config_reexports_the_model_classes() -> None:
    import broker.config.core as config
    import broker.model as model

    assert config.PriorityClass is model.PriorityClass
    assert config.Team is model.Team
