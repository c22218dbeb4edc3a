"""The store's cloud instances and zone blocks: one contract, both backends."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from broker.errors import Fenced
from broker.model import Instance, InstanceState
from broker.store import BaseStore
from broker.store.instances import block_key, block_key_of, request_ids

S = InstanceState
OFFER = "local:home:home-a:ondemand/local-2xa100"


def requested(rid: str, at: float = 100.0, price: float = 3.5) -> Instance:
    return Instance(rid, OFFER, requested_at=at, price_per_hour=price, for_jobs=("j-1",))


def test_request_ids_of_a_launch() -> None:
    assert request_ids("r-a", 1) == ["r-a"]
    assert request_ids("r-a", 3) == ["r-a-1", "r-a-2", "r-a-3"]


def test_block_key_of_an_offer_id() -> None:
    assert block_key_of(OFFER) == block_key("local", "home", "home-a", "local-2xa100")
    assert block_key_of("aws:us-east-1:spot/p4d.24xlarge") == "aws:us-east-1::p4d.24xlarge"


def test_record_is_idempotent_by_request_id(store: BaseStore) -> None:
    first = store.record_instances([requested("r-1"), requested("r-2", at=101.0)])
    assert [i.request_id for i in first] == ["r-1", "r-2"]
    again = store.record_instances([requested("r-1", price=9.0), requested("r-3", at=99.0)])
    assert [i.request_id for i in again] == ["r-3"]
    got = store.instance("r-1")
    assert got is not None and got.price_per_hour == 3.5 and got.for_jobs == ("j-1",)
    assert [i.request_id for i in store.instances()] == ["r-3", "r-1", "r-2"]  # by request time
    assert store.instance("nope") is None


def test_moves_follow_the_table_and_every_record_is_kept(store: BaseStore) -> None:
    store.record_instances([requested("r-1"), requested("r-2")])
    booted = store.move_instance("r-1", S.BOOTING, 110.0, "launched", provider_id="i-1")
    assert booted is not None and booted.state is S.BOOTING and booted.provider_id == "i-1"
    ready = store.move_instance("r-1", S.READY, 120.0, "agent registered", node_id="i-1")
    assert ready is not None and ready.ready_at == 120.0 and ready.node_id == "i-1"
    # a move the table does not have leaves the record as it is
    same = store.move_instance("r-1", S.BOOTING, 121.0, "late")
    assert same is not None and same.state is S.READY
    store.move_instance("r-2", S.FAILED, 115.0, "no capacity")
    ended = store.move_instance("r-1", S.TERMINATED, 130.0, "idle")
    assert ended is not None and ended.ended_at == 130.0 and ended.reason == "idle"
    assert [h.state for h in ended.history] == [S.BOOTING, S.READY, S.TERMINATED]
    assert store.instances(live_only=True) == []
    ledger = {i.request_id: i for i in store.instances()}
    assert ledger["r-2"].state is S.FAILED and ledger["r-2"].reason == "no capacity"
    assert ledger["r-1"].state is S.TERMINATED
    assert store.move_instance("missing", S.BOOTING, 1.0, "x") is None


def test_a_record_already_in_the_state_takes_only_the_changes(store: BaseStore) -> None:
    store.record_instances([requested("r-1")])
    store.move_instance("r-1", S.BOOTING, 110.0, "launched")
    got = store.move_instance("r-1", S.BOOTING, 111.0, "found", provider_id="i-9")
    assert got is not None and got.provider_id == "i-9" and len(got.history) == 1


def test_concurrent_moves_land_once(store: BaseStore) -> None:
    store.record_instances([requested("r-1")])
    results: list[Instance | None] = []

    def boot(n: int) -> None:
        results.append(store.move_instance("r-1", S.BOOTING, 110.0 + n, f"by {n}",
                                           provider_id=f"i-{n}"))

    threads = [threading.Thread(target=boot, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = store.instance("r-1")
    assert final is not None and final.state is S.BOOTING
    assert len(final.history) == 1  # one writer moved it; the others found it moved


def test_instance_writes_are_fenced(store: BaseStore) -> None:
    token = store.acquire_leadership("a", 10.0, 1.0)
    assert token is not None
    with store.fenced(token):
        assert store.record_instances([requested("r-1")])
    store.release_leadership(token)
    other = store.acquire_leadership("b", 10.0, 2.0)
    assert other is not None
    with store.fenced(token), pytest.raises(Fenced):
        store.record_instances([requested("r-2")])
    assert store.instance("r-2") is None


def test_the_snapshot_carries_live_instances(store: BaseStore) -> None:
    store.record_instances([requested("r-1"), requested("r-2")])
    store.move_instance("r-2", S.FAILED, 105.0, "stockout")
    snap = store.snapshot(200.0)
    assert [i.request_id for i in snap.instances] == ["r-1"]
    store.move_instance("r-1", S.FAILED, 210.0, "boot timeout")  # each snapshot reads anew
    assert store.snapshot(220.0).instances == ()
    store.record_instances([requested("r-3")])
    assert [i.request_id for i in store.snapshot(230.0).instances] == ["r-3"]


def test_blocks_expire(store: BaseStore) -> None:
    key = block_key_of(OFFER)
    store.block(key, 500.0, "capacity: no A100 left")
    assert store.blocks(400.0)[key].reason == "capacity: no A100 left"
    store.block(key, 600.0, "boot timeout")
    assert store.blocks(550.0)[key].until == 600.0
    assert store.blocks(600.0) == {}


def test_published_offers_less_blocked_zones(store: BaseStore) -> None:
    from broker.model import Market, Offer

    a = Offer("local", "home", "home-a", "t1", "A100-80GB", 2, 80.0, Market.ONDEMAND, 4.0,
              extra={"gpus": "2xA100-80GB"})
    b = Offer("local", "home", "home-b", "t1", "A100-80GB", 2, 80.0, Market.SPOT, 1.5)
    store.publish_offers([a, b], 100.0)
    assert store.offers(100.0) == [a, b]
    assert store.offers(100.0)[0].extra["gpus"] == "2xA100-80GB"
    store.block(block_key_of(a.id), 200.0, "stockout")
    assert store.offers(150.0) == [b]
    assert store.offers(150.0, include_blocked=True) == [a, b]
    assert store.offers(200.0) == [a, b]


def test_with_providers_configured_the_snapshot_has_sites_and_offers(
        store_factory: Callable[..., BaseStore]) -> None:
    from broker.config.core import Config
    from broker.config.providers import parse_providers
    from broker.model import Market, Offer, Site

    store = store_factory(Config(providers=parse_providers({"local": {}})))
    a = Offer("local", "home", "home-a", "t1", "A100-80GB", 2, 80.0, Market.ONDEMAND, 4.0)
    b = Offer("local", "home", "home-b", "t1", "A100-80GB", 2, 80.0, Market.SPOT, 1.5)
    store.publish_offers([a, b], 100.0)
    store.block(block_key_of(b.id), 200.0, "spot notice")
    snap = store.snapshot(150.0)
    assert snap.offers == (a,) and snap.sites == (Site(), a.site)


def test_forget_node_drops_only_a_down_node(store: BaseStore) -> None:
    from broker.model import Gpu, Node

    n = Node("m1", (Gpu("g0", 0, "A100-80GB", 80.0),), site="local:home:home-a:ondemand",
             incarnation="i1", instance_id="m1")
    store.heartbeat(n, 10.0, 100.0)
    assert store.forget_node("m1") is False  # live: kept
    store.expire(200.0)
    assert [x.state.value for x in store.nodes()] == ["DOWN"]
    assert store.forget_node("m1") is True
    assert store.nodes() == [] and store.allocations() == {}
    assert store.forget_node("m1") is False
    store.heartbeat(n, 10.0, 300.0)  # an agent that comes back is a node again
    assert [x.id for x in store.nodes()] == ["m1"]
