"""providers/libcloud/provider.py against libcloud's own dummy driver
(libcloud.compute.drivers.dummy.DummyNodeDriver), and against tests/fakes/libcloud_driver.py
(the dummy with shared state, names, metadata and user data) where a test needs those.

Quirks of the dummy driver these tests live with: its nodes live in the driver object (one
process, one provider object); ``DummyNodeDriver(creds)`` makes ``int(creds)`` nodes named
``dummy-0``... (two, ``dummy-1`` and ``dummy-2``, for 0 or a non-number; ``None`` raises
TypeError), none of them ours; ``create_node(name, size, image)`` ignores the name and takes no
tags or user data, so the provider keeps its ledger; and a new node's id is ``len(nodes) + 1``,
which can repeat a live node's id after a destroy, so no test here creates after it destroys
with the plain dummy.
"""

from __future__ import annotations

import pytest

from broker.model.cloud import InstanceState, Market, Offer
from providers.base import (
    CLUSTER_TAG,
    REQUEST_TAG,
    FailOver,
    MissingExtra,
    ProviderConfigError,
    Resources,
    Retry,
    Stop,
    make_provider,
)
from providers.libcloud.errors import classify
from providers.libcloud.provider import LibcloudProvider
from providers.offer_source import OfferList

SIZE_OFFER = Offer("dummy", "default", "", "1", "A100-80GB", 1, 80.0, Market.ONDEMAND, 4.0)
FILE_DRIVER = "tests.fakes.libcloud_driver:FileDummyNodeDriver"


def dummy(tmp_path, cluster: str = "c1", **kw) -> LibcloudProvider:
    kw.setdefault("sizes", {"1": {"gpus": "1xA100-80GB", "price_per_hour": 4.0}})
    return LibcloudProvider("dummy", cluster, driver="dummy", key=0,
                            state_dir=str(tmp_path / "state"), **kw)


def test_dummy_launch_is_idempotent_and_lists_only_this_clusters_nodes(tmp_path) -> None:
    p = dummy(tmp_path)
    drv = p.driver()
    assert len(drv.list_nodes()) == 2  # dummy-1 and dummy-2: not ours
    first = p.launch(SIZE_OFFER, 2, "req-1", "")
    again = p.launch(SIZE_OFFER, 2, "req-1", "")
    assert [m.provider_id for m in first] == [m.provider_id for m in again]
    assert len(drv.list_nodes()) == 4
    assert {m.request_id for m in first} == {"req-1"}
    assert all(m.state is InstanceState.BOOTING and m.native_state == "running"
               for m in first)
    assert sorted(p.instances()) == sorted(m.provider_id for m in first)
    # a grown request adds only the missing machine
    assert len(p.launch(SIZE_OFFER, 3, "req-1", "")) == 3 and len(drv.list_nodes()) == 5
    # another cluster on the same account (same driver object) sees none of them
    other = dummy(tmp_path, "c2")
    other._driver = drv
    assert other.instances() == {}


def test_dummy_terminate_and_a_missing_node_is_not_an_error(tmp_path) -> None:
    p = dummy(tmp_path)
    a, b = p.launch(SIZE_OFFER, 2, "req-2", "")
    p.terminate([a.provider_id, "no-such-node"])
    assert set(p.instances()) == {b.provider_id}
    p.terminate([a.provider_id])  # again: fine
    p.terminate(["1"])  # dummy-1 is not ours: left alone
    assert "dummy-1" in [n.name for n in p.driver().list_nodes()]
    p.terminate([b.provider_id])
    assert p.instances() == {}


def test_dummy_refuses_user_data_it_cannot_pass(tmp_path) -> None:
    with pytest.raises(Stop, match="takes no user data") as e:
        dummy(tmp_path).launch(SIZE_OFFER, 1, "req-3", "#!/bin/sh\nspillway worker\n")
    assert e.value.code == "no-user-data"


def test_dummy_offers_from_configured_sizes(tmp_path) -> None:
    p = dummy(tmp_path, sizes={"3": {"gpus": "4xA100-80GB", "price_per_hour": 12.0,
                                     "cpus": 32},
                               "9": {"gpus": "1xT4"}})  # size 9 is not listed: no offer
    [o] = p.offers(Resources(gpu_count=2, gpu_model="A100"))
    assert (o.id, o.gpu_count, o.gpu_memory_gb, o.price_per_hour, o.extra["cpus"]) == \
        ("dummy:default:ondemand/3", 4, 80.0, 12.0, 32)
    assert p.offers(Resources(gpu_model="H100")) == []
    assert p.offers(Resources(regions=("elsewhere",))) == []


def test_offers_from_the_catalog_for_a_cloud_it_knows(tmp_path) -> None:
    az = Offer("azure", "eastus", "", "Standard_NC24ads_A100_v4", "A100-80GB", 1, 80.0,
               Market.SPOT, 1.5)
    west = Offer("azure", "westeurope", "", "Standard_NC24ads_A100_v4", "A100-80GB", 1, 80.0,
                 Market.SPOT, 1.7)
    p = LibcloudProvider("azure", "c1", driver="azure_arm", region="eastus",
                         catalog=OfferList([az, west]))
    assert p.catalog_provider == "azure"
    assert [o.id for o in p.offers(Resources())] == [
        "azure:eastus:spot/Standard_NC24ads_A100_v4"]


def test_file_driver_tags_names_user_data_and_a_fresh_process(tmp_path) -> None:
    cloud = str(tmp_path / "cloud.json")
    p = LibcloudProvider("os", "c1", driver=FILE_DRIVER, key=cloud,
                         state_dir=str(tmp_path / "s"))
    offer = Offer("os", "default", "", "gpu-a100", "A100-80GB", 1, 80.0, Market.ONDEMAND, 3.0)
    [m] = p.launch(offer, 1, "req-4", "#!/bin/sh\necho hi\n")
    node = next(n for n in p.driver().list_nodes() if n.name == m.provider_id)
    assert node.extra["metadata"][CLUSTER_TAG] == "c1"
    assert node.extra["metadata"][REQUEST_TAG] == "req-4"
    # the boot script learns the node's name, its provider id, as its instance id
    assert node.extra["userdata"] == \
        f"#!/bin/sh\nexport SPILLWAY_INSTANCE_ID={m.provider_id}\necho hi\n"
    assert m.provider_id.startswith("req-4-") and m.extra["node_id"] == node.id
    assert not (tmp_path / "s").exists()  # no ledger: the driver kept the name and tags
    fresh = LibcloudProvider("os", "c1", driver=FILE_DRIVER, key=cloud,
                             state_dir=str(tmp_path / "s"))
    assert [x.provider_id for x in fresh.launch(offer, 1, "req-4", "x")] == [m.provider_id]
    assert LibcloudProvider("os", "c2", driver=FILE_DRIVER, key=cloud).instances() == {}
    fresh.terminate([m.provider_id, m.provider_id])
    assert fresh.instances() == {} and p.driver().list_nodes() == []


@pytest.mark.parametrize(("native", "state"), [
    ("running", InstanceState.BOOTING), ("pending", InstanceState.BOOTING),
    ("stopping", InstanceState.TERMINATED), ("terminated", InstanceState.TERMINATED),
    ("stopped", InstanceState.FAILED), ("error", InstanceState.FAILED)])
def test_node_states_map_onto_instance_states(tmp_path, native, state) -> None:
    from libcloud.compute.types import NodeState

    p = dummy(tmp_path)
    [m] = p.launch(SIZE_OFFER, 1, "req-5", "")
    node = next(n for n in p.driver().list_nodes() if str(n.id) == m.provider_id)
    node.state = NodeState(native)
    assert p.instances()[m.provider_id].state is state


def test_errors_map_to_what_to_do_next() -> None:
    from libcloud.common.exceptions import RateLimitReachedError
    from libcloud.common.types import InvalidCredsError, LibcloudError, ProviderError

    cases = [
        (InvalidCredsError("bad key"), Stop),
        (RateLimitReachedError(), Retry),
        (ProviderError("Internal error", 500), Retry),
        (ProviderError("Forbidden", 403), Stop),
        (LibcloudError("SkuNotAvailable: Standard_ND96 is not available in eastus"), FailOver),
        (LibcloudError("No valid host was found. There are not enough hosts"), FailOver),
        (LibcloudError("QuotaExceeded: Operation could not be completed as it results in "
                       "exceeding approved standardNCADSA100v4Family Cores quota"), Stop),
        (ConnectionRefusedError("refused"), Retry),
    ]
    for exc, cls in cases:
        got = classify("azure", exc, "create node")
        assert type(got) is cls, (exc, got)
    assert "standardNCADSA100v4Family" in str(classify("azure", cases[6][0], "create node"))


def test_bad_settings_name_the_field(tmp_path) -> None:
    with pytest.raises(ProviderConfigError, match=r"providers.x.driver: 'nosuch' is not a "
                       r"libcloud compute driver; known: .*openstack"):
        make_provider("x", {"kind": "libcloud", "driver": "nosuch"}, "c1")
    with pytest.raises(ProviderConfigError, match=r"providers.x.sizes.s1.gpus"):
        make_provider("x", {"kind": "libcloud", "driver": "dummy", "sizes": {
            "s1": {"gpus": "lots"}}}, "c1")
    with pytest.raises(ProviderConfigError, match=r"providers.x: .*market"):
        make_provider("x", {"kind": "libcloud", "driver": "dummy", "market": "cheap"}, "c1")
    with pytest.raises(Stop, match="image 'nope' is not offered"):
        dummy(tmp_path, image="nope").launch(SIZE_OFFER, 1, "req-6", "")
    with pytest.raises(Stop, match="location 'Mars' is not offered"):
        dummy(tmp_path, location="Mars").launch(SIZE_OFFER, 1, "req-6", "")
    file_cloud = LibcloudProvider("os", "c1", driver=FILE_DRIVER, key=str(tmp_path / "c.json"),
                                  location="London Loft",
                                  sizes={"gpu-a100": {"gpus": "1xA100-80GB"}})
    [o] = file_cloud.offers(Resources())
    assert len(file_cloud.launch(o, 1, "req-7", "")) == 1


def test_a_missing_sdk_names_the_extra(monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "libcloud.compute.providers", None)
    with pytest.raises(MissingExtra, match=r"spillway\[libcloud\]"):
        LibcloudProvider("x", "c1", driver="dummy")
