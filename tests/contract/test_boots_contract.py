"""Boot estimates per offer (broker/store/boots.py): the rule as a table, and the store's side
(learned when a record becomes READY, worn by the published offers) on both backends."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker.config.core import Config
from broker.config.providers import parse_providers
from broker.model import Instance, InstanceState, Market, Offer
from broker.store import BaseStore
from broker.store.boots import ALPHA, CLOUD_BOOT_S, BootEstimate, default_for, dressed, first

S = InstanceState
LOCAL = Offer("local", "home", "home-a", "t1", "A100-80GB", 2, 80.0, Market.ONDEMAND, 4.0)
LOCAL_SPOT = Offer("local", "home", "home-a", "t1", "A100-80GB", 2, 80.0, Market.SPOT, 1.5)
AWS = Offer("aws", "us-east-1", "", "p3.2xlarge", "V100-16GB", 1, 16.0, Market.ONDEMAND, 3.06)
DECLARED = Offer("aws", "us-east-1", "", "p3.8xlarge", "V100-16GB", 4, 16.0, Market.ONDEMAND,
                 12.24, extra={"boot_s": 180.0})


# (boots seen in order, the estimate after them)
UPDATES: dict[str, tuple[list[float], float]] = {
    "the first machine replaces the seed": ([4.0], 4.0),
    "a later one moves it by ALPHA of the difference": ([4.0, 14.0], 4.0 + ALPHA * 10.0),
    "a steady boot stays put": ([60.0, 60.0, 60.0], 60.0),
    "an outlier fades": ([60.0, 600.0, *[60.0] * 20],
                         60.0 + ALPHA * 540.0 * (1 - ALPHA) ** 20),
}


@pytest.mark.parametrize("seen,expected", UPDATES.values(), ids=UPDATES.keys())
def test_the_estimate_is_an_average_of_the_boots_seen(seen: list[float], expected: float
                                                      ) -> None:
    est = first(seen[0], 1.0)
    for i, s in enumerate(seen[1:], start=2):
        est = est.observed(s, float(i))
    assert est.seconds == pytest.approx(expected, abs=0.01)
    assert est.samples == len(seen) and est.at == float(len(seen))
    assert BootEstimate.from_json(est.to_json()) == est


# (offer, estimates by offer id, provider seeds, boot_s, boot_samples)
SEEDS: dict[str, tuple[Offer, dict[str, BootEstimate], dict[str, float], float, int]] = {
    "local's default: seconds": (LOCAL, {}, {}, 5.0, 0),
    "a cloud's default": (AWS, {}, {}, CLOUD_BOOT_S, 0),
    "the provider's boot_s setting": (AWS, {}, {"aws": 90.0}, 90.0, 0),
    "the offer's own boot_s beats its provider's": (DECLARED, {}, {"aws": 90.0}, 180.0, 0),
    "what its machines took beats every seed": (
        DECLARED, {DECLARED.id: BootEstimate(75.0, 3, 1.0)}, {"aws": 90.0}, 75.0, 3),
    "per offer: another offer's machines do not count": (
        LOCAL_SPOT, {LOCAL.id: BootEstimate(2.0, 1, 1.0)}, {}, 5.0, 0),
}


@pytest.mark.parametrize("offer,estimates,seeds,boot,samples", SEEDS.values(), ids=SEEDS.keys())
def test_an_offer_wears_its_estimate_or_its_seed(
        offer: Offer, estimates: dict[str, BootEstimate], seeds: dict[str, float], boot: float,
        samples: int) -> None:
    def seed(provider: str) -> float:
        return seeds.get(provider, default_for(provider))

    (out,) = dressed([offer], estimates, seed)
    assert out == offer and out.extra["boot_s"] == boot and out.extra["boot_samples"] == samples


def test_every_kind_has_a_default() -> None:
    from providers.base import KINDS

    assert default_for("local") == 5.0
    assert all(default_for(k) > 0 for k in KINDS)
    assert default_for("some-new-kind") == CLOUD_BOOT_S


def booted(store: BaseStore, rid: str, offer: Offer, requested: float, ready: float) -> None:
    store.record_instances([Instance(rid, offer.id, requested_at=requested)])
    store.move_instance(rid, S.BOOTING, requested + 1.0, "launched", provider_id=f"i-{rid}")
    store.move_instance(rid, S.READY, ready, "agent registered", node_id=f"i-{rid}")


def test_a_machine_that_registers_teaches_its_offer(store: BaseStore) -> None:
    assert store.boot_estimates() == {}
    booted(store, "r-1", LOCAL, 100.0, 104.0)
    assert store.boot_estimates() == {LOCAL.id: BootEstimate(4.0, 1, 104.0)}
    # the same record moved again (a repeated pass): nothing more is learned
    store.move_instance("r-1", S.READY, 110.0, "agent registered")
    assert store.boot_estimates()[LOCAL.id].samples == 1
    booted(store, "r-2", LOCAL, 200.0, 214.0)
    est = store.boot_estimates()[LOCAL.id]
    assert est.samples == 2 and est.seconds == pytest.approx(4.0 + ALPHA * 10.0)
    # a machine that never registered teaches nothing
    store.record_instances([Instance("r-3", LOCAL_SPOT.id, requested_at=300.0)])
    store.move_instance("r-3", S.FAILED, 900.0, "boot timeout")
    assert set(store.boot_estimates()) == {LOCAL.id}


def test_the_published_offers_wear_their_estimates(
        store_factory: Callable[..., BaseStore]) -> None:
    store = store_factory(Config(providers=parse_providers(
        {"local": {}, "aws": {"boot_s": 120}})))
    store.publish_offers([LOCAL, LOCAL_SPOT, AWS], 100.0)
    assert [o.extra["boot_s"] for o in store.offers(100.0)] == [5.0, 5.0, 120.0]
    booted(store, "r-1", LOCAL, 100.0, 103.5)
    snap = store.snapshot(110.0)
    assert [o.extra["boot_s"] for o in snap.offers] == [3.5, 5.0, 120.0]
    assert [o.extra["boot_samples"] for o in snap.offers] == [1, 0, 0]
