"""providers/gcp/provider.py: google-cloud-compute (REST) against the fake Compute endpoint in
tests/fakes/gce.py, with its faults."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

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
from providers.gcp.provider import GcpProvider
from providers.gcp.shapes import instance_name, region_of, split_type
from providers.offer_source import OfferList
from tests.fakes.gce import FakeCompute, serving

ZONES = ["us-central1-a", "us-central1-b"]
A2_SPOT = Offer("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", "A100-40GB", 1, 40.0,
                Market.SPOT, 1.10)
N1_V100 = Offer("gcp", "us-central1", "us-central1-b", "n1-standard-16+nvidia-tesla-v100x2",
                "V100-16GB", 2, 16.0, Market.ONDEMAND, 5.72)
T4_REGION = Offer("gcp", "us-central1", "", "n1-standard-8", "T4-16GB", 1, 16.0,
                  Market.ONDEMAND, 0.73)
SCRIPT = "#!/bin/sh\necho booted\n"


@pytest.fixture
def fake() -> Iterator[FakeCompute]:
    with serving() as f:
        yield f
        assert f.bugs == []  # every request was answered by the fake's rules


def provider(fake: FakeCompute, cluster: str = "c1", **kw: Any) -> GcpProvider:
    kw.setdefault("call_timeout_s", 5.0)
    kw.setdefault("operation_timeout_s", 10.0)
    return GcpProvider("gcp", cluster, "proj", ZONES, endpoint=fake.url, anonymous=True, **kw)


def inserted(fake: FakeCompute, name: str) -> dict[str, Any]:
    return next(b for b in fake.inserts if b["name"] == name)


def waits(fake: FakeCompute) -> int:
    return sum(1 for m, p in fake.calls if p.endswith("/wait"))


# -- launch -------------------------------------------------------------------------------


def test_spot_launch_sends_spot_scheduling_labels_and_the_startup_script(fake) -> None:
    machines = provider(fake).launch(A2_SPOT, 2, "req-1", SCRIPT)
    assert [m.request_id for m in machines] == ["req-1", "req-1"]
    assert {m.zone for m in machines} == {"us-central1-a"}
    assert all(m.market is Market.SPOT and m.instance_type == "a2-highgpu-1g"
               for m in machines)
    assert all(m.native_state == "RUNNING" and m.state is InstanceState.BOOTING
               for m in machines)
    body = inserted(fake, machines[0].provider_id)
    assert body["scheduling"] == {"provisioningModel": "SPOT",
                                  "instanceTerminationAction": "DELETE",
                                  "onHostMaintenance": "TERMINATE", "automaticRestart": False}
    assert "guestAccelerators" not in body  # an A2 type carries its A100
    assert body["labels"] == {CLUSTER_TAG: "c1", REQUEST_TAG: "req-1",
                              "spillway-market": "spot"}
    meta = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert meta["startup-script"] == SCRIPT
    assert meta["spillway-offer"] == A2_SPOT.id
    assert body["machineType"] == "zones/us-central1-a/machineTypes/a2-highgpu-1g"
    assert waits(fake) >= 2  # each operation was PENDING/RUNNING first and was waited on


def test_standard_n1_launch_attaches_its_gpus_as_guest_accelerators(fake) -> None:
    [m] = provider(fake).launch(N1_V100, 1, "req-2", SCRIPT)
    body = inserted(fake, m.provider_id)
    assert body["scheduling"] == {"provisioningModel": "STANDARD",
                                  "onHostMaintenance": "TERMINATE", "automaticRestart": True}
    assert body["machineType"].endswith("/machineTypes/n1-standard-16")
    assert body["guestAccelerators"] == [{
        "acceleratorType": "zones/us-central1-b/acceleratorTypes/nvidia-tesla-v100",
        "acceleratorCount": 2}]
    assert m.market is Market.ONDEMAND and m.instance_type == N1_V100.instance_type


def test_stop_on_preemption_and_extra_labels_and_service_account(fake) -> None:
    p = provider(fake, termination_action="stop", labels={"team": "vision"},
                 service_account="runner@proj.iam.gserviceaccount.com")
    [m] = p.launch(A2_SPOT, 1, "req-3", SCRIPT)
    body = inserted(fake, m.provider_id)
    assert body["scheduling"]["instanceTerminationAction"] == "STOP"
    assert body["labels"]["team"] == "vision"
    assert body["serviceAccounts"][0]["email"] == "runner@proj.iam.gserviceaccount.com"


def test_a_repeated_launch_returns_the_same_machines(fake) -> None:
    p = provider(fake)
    first = p.launch(A2_SPOT, 2, "req-4", SCRIPT)
    again = p.launch(A2_SPOT, 2, "req-4", SCRIPT)  # same requestId: the first operation
    fake.forget_request_ids()
    third = GcpProvider("gcp", "c1", "proj", ZONES, endpoint=fake.url, anonymous=True) \
        .launch(A2_SPOT, 2, "req-4", SCRIPT)  # a fresh process; the names answer 409
    ids = [m.provider_id for m in first]
    assert [m.provider_id for m in again] == ids == [m.provider_id for m in third]
    assert len(fake.inserts) == 2 and len(fake.labelled(REQUEST_TAG, "req-4")) == 2


def test_a_name_held_by_another_cluster_is_not_taken_over(fake) -> None:
    name = instance_name("c1", "req-5", "us-central1-a", 0)
    provider(fake, "other").launch(A2_SPOT, 1, "req-5", SCRIPT)  # their machine...
    theirs = fake.instances.pop(("proj", "us-central1-a",
                                 instance_name("other", "req-5", "us-central1-a", 0)))
    fake.instances[("proj", "us-central1-a", name)] = {**theirs, "name": name}  # ...our name
    fake.forget_request_ids()
    with pytest.raises(Stop, match="belongs to cluster other"):
        provider(fake).launch(A2_SPOT, 1, "req-5", SCRIPT)
    assert ("proj", "us-central1-a", name) in fake.instances  # theirs: left alone


def test_a_region_offer_launches_in_the_first_configured_zone_of_its_region(fake) -> None:
    t4 = Offer("gcp", "us-central1", "", "n1-standard-8", "T4-16GB", 1, 16.0, Market.SPOT, 0.2)
    [m] = provider(fake).launch(t4, 1, "req-6", SCRIPT)
    assert m.zone == "us-central1-a"
    assert inserted(fake, m.provider_id)["guestAccelerators"][0]["acceleratorType"] \
        .endswith("/nvidia-tesla-t4")
    with pytest.raises(Stop, match="no configured zone is in region europe-west4"):
        provider(fake).launch(Offer("gcp", "europe-west4", "", "a2-highgpu-1g", "A100-40GB",
                                    1, 40.0, Market.SPOT, 1.0), 1, "req-7", SCRIPT)


# -- terminate and list -------------------------------------------------------------------


def test_terminate_deletes_and_a_missing_machine_is_not_an_error(fake) -> None:
    p = provider(fake)
    a, b = p.launch(A2_SPOT, 2, "req-8", SCRIPT)
    p.terminate([a.provider_id, "never-was-0", "us-central1-a/also-missing"])
    assert set(p.instances()) == {b.provider_id}
    p.terminate([f"us-central1-a/{b.provider_id}"])  # zone/name works too
    p.terminate([b.provider_id])  # twice: still fine
    assert p.instances() == {}


def test_instances_lists_this_clusters_machines_across_zones_and_pages(fake) -> None:
    fake.page_size = 2
    mine, theirs = provider(fake, "c1"), provider(fake, "c2")
    ids = [m.provider_id for m in mine.launch(A2_SPOT, 3, "req-9", SCRIPT)]
    ids += [m.provider_id for m in mine.launch(N1_V100, 1, "req-10", SCRIPT)]
    theirs.launch(A2_SPOT, 1, "req-9", SCRIPT)
    calls = len(fake.calls)
    listed = mine.instances()
    pages = [p for _, p in fake.calls[calls:] if p.endswith("/aggregated/instances")]
    assert len(pages) == 2  # four machines of c1, two a page: the pager followed the token
    assert sorted(listed) == sorted(ids)
    assert {m.zone for m in listed.values()} == set(ZONES)
    assert all(m.extra["offer_id"] in (A2_SPOT.id, N1_V100.id) for m in listed.values())
    assert len(theirs.instances()) == 1


@pytest.mark.parametrize(("native", "state"), [
    ("PROVISIONING", InstanceState.BOOTING), ("STAGING", InstanceState.BOOTING),
    ("RUNNING", InstanceState.BOOTING), ("STOPPING", InstanceState.TERMINATED),
    ("SUSPENDED", InstanceState.FAILED), ("TERMINATED", InstanceState.FAILED),
    ("REPAIRING", InstanceState.FAILED)])
def test_native_statuses_map_onto_instance_states(fake, native, state) -> None:
    p = provider(fake)
    [m] = p.launch(A2_SPOT, 1, "req-11", SCRIPT)
    fake.instances[("proj", "us-central1-a", m.provider_id)]["status"] = native
    listed = p.instances()[m.provider_id]
    assert (listed.state, listed.native_state) == (state, native)


@pytest.mark.parametrize(("action", "end"), [("DELETE", None), ("STOP", InstanceState.FAILED)])
def test_a_preempted_spot_machine_stops_and_is_deleted_or_kept_stopped(action, end) -> None:
    from broker.waiting import poll_until

    with serving(op_seconds=0.3) as fake:
        p = provider(fake, termination_action=action)
        [m] = p.launch(A2_SPOT, 1, "req-pre", SCRIPT)
        fake.preempt(m.provider_id)
        assert p.instances()[m.provider_id].state is InstanceState.TERMINATED  # STOPPING
        poll_until(lambda: p.instances().get(m.provider_id, m).native_state != "STOPPING", 10,
                   "the preemption to end")
        listed = p.instances().get(m.provider_id)
        assert (listed.state if listed else None) is end


# -- faults -------------------------------------------------------------------------------


def test_a_stockout_fails_over_and_leaves_nothing_and_the_next_zone_works(fake) -> None:
    fake.stockout("us-central1-a")
    p = provider(fake)
    with pytest.raises(FailOver) as e:
        p.launch(A2_SPOT, 2, "req-12", SCRIPT)
    assert e.value.code == "ZONE_RESOURCE_POOL_EXHAUSTED" and e.value.offer_id == A2_SPOT.id
    assert "stockout" in str(e.value) and "us-central1-a" in str(e.value)
    assert p.instances() == {}
    b = Offer("gcp", "us-central1", "us-central1-b", "a2-highgpu-1g", "A100-40GB", 1, 40.0,
              Market.SPOT, 1.1)
    assert len(p.launch(b, 2, "req-12", SCRIPT)) == 2


def test_a_quota_in_the_operation_stops_and_names_the_quota(fake) -> None:
    fake.quota_exceeded("PREEMPTIBLE_NVIDIA_A100_GPUS", "us-central1")
    with pytest.raises(Stop) as e:
        provider(fake).launch(A2_SPOT, 1, "req-13", SCRIPT)
    assert e.value.code == "QUOTA_EXCEEDED"
    assert "compute.googleapis.com/preemptible_nvidia_a100_gpus" in str(e.value)
    assert "region=us-central1" in str(e.value) and "higher quota" in str(e.value)
    assert fake.labelled(REQUEST_TAG, "req-13") == []


def test_a_quota_refused_at_the_call_stops(fake) -> None:
    fake.quota_exceeded("GPUS_ALL_REGIONS", "global", sync=True)
    with pytest.raises(Stop, match="Quota 'GPUS_ALL_REGIONS' exceeded") as e:
        provider(fake).launch(A2_SPOT, 1, "req-14", SCRIPT)
    assert e.value.code == "QUOTA_EXCEEDED"


@pytest.mark.parametrize(("status", "reason", "cls"), [
    (429, "rateLimitExceeded", Retry), (403, "rateLimitExceeded", Retry),
    (503, "backendError", Retry), (500, "internalError", Retry),
    (401, "authError", Stop), (403, "forbidden", Stop), (400, "invalid", Stop)])
def test_call_errors_map_to_what_to_do_next(fake, status, reason, cls) -> None:
    fake.fail_next(status, reason, method="POST")
    with pytest.raises(cls) as e:
        provider(fake).launch(A2_SPOT, 1, "req-15", SCRIPT)
    assert type(e.value) is cls
    if status in (401, 403) and cls is Stop:
        assert "roles/compute.instanceAdmin.v1" in str(e.value)


def test_after_a_429_the_retried_launch_succeeds_with_one_set_of_machines(fake) -> None:
    p = provider(fake)
    fake.fail_next(429, "rateLimitExceeded", method="POST", after=1)  # the second insert
    with pytest.raises(Retry):
        p.launch(A2_SPOT, 2, "req-16", SCRIPT)
    assert len(fake.labelled(REQUEST_TAG, "req-16")) == 1  # a Retry keeps what it made
    machines = p.launch(A2_SPOT, 2, "req-16", SCRIPT)
    assert len(machines) == 2 and len(fake.labelled(REQUEST_TAG, "req-16")) == 2


def test_a_503_while_waiting_retries_and_the_repeat_finds_the_machine(fake) -> None:
    p = provider(fake)
    fake.fail_next(503, "backendError", method="POST", after=1)  # the first wait
    with pytest.raises(Retry):
        p.launch(A2_SPOT, 1, "req-17", SCRIPT)
    [m] = p.launch(A2_SPOT, 1, "req-17", SCRIPT)
    assert m.request_id == "req-17" and len(fake.inserts) == 1


def test_a_stop_midway_deletes_what_the_launch_made(fake) -> None:
    fake.fail_next(403, "forbidden", method="POST", after=1)
    with pytest.raises(Stop):
        provider(fake).launch(A2_SPOT, 2, "req-18", SCRIPT)
    assert fake.labelled(REQUEST_TAG, "req-18") == []


def test_an_operation_that_never_finishes_stops_at_the_deadline() -> None:
    ticks = iter(range(1000))
    with serving(op_steps=10_000, op_seconds=3600) as fake:
        p = provider(fake, operation_timeout_s=5, clock=lambda: float(next(ticks)))
        with pytest.raises(Stop, match="not done after 5 s") as e:
            p.launch(A2_SPOT, 1, "req-19", SCRIPT)
    assert e.value.code == "operation-timeout"


def test_an_unreachable_endpoint_is_a_retry() -> None:
    with serving() as fake:
        url = fake.url
    p = GcpProvider("gcp", "c1", "proj", ZONES, endpoint=url, anonymous=True,
                    call_timeout_s=2)
    with pytest.raises(Retry):
        p.instances()


# -- offers and configuration -------------------------------------------------------------


def test_offers_are_the_catalogs_in_the_configured_zones() -> None:
    other = Offer("gcp", "us-west1", "us-west1-b", "a2-highgpu-1g", "A100-40GB", 1, 40.0,
                  Market.SPOT, 1.0)
    p = GcpProvider("gcp-eu", "c1", "proj", ZONES, anonymous=True,
                    catalog=OfferList([A2_SPOT, N1_V100, T4_REGION, other]))
    got = p.offers(Resources(gpu_count=1))
    assert {(o.zone, o.instance_type) for o in got} == {
        ("us-central1-a", "a2-highgpu-1g"), ("us-central1-b", N1_V100.instance_type),
        ("us-central1-a", "n1-standard-8"), ("us-central1-b", "n1-standard-8")}
    assert {o.provider for o in got} == {"gcp-eu"}
    assert [o.instance_type for o in p.offers(Resources(gpu_model="A100"))] == \
        ["a2-highgpu-1g"]
    assert p.offers(Resources(market=Market.SPOT, gpu_model="V100")) == []


def test_offers_from_the_configuration_and_the_shipped_catalog() -> None:
    p = make_provider("gcp", {"project": "proj", "zones": ["us-central1-a"], "anonymous": True,
                              "offers": [{"zone": "us-central1-a", "instance_type":
                                          "a2-highgpu-1g", "gpu_model": "A100-40GB",
                                          "gpu_count": 1, "market": "spot",
                                          "price_per_hour": 1.1, "gpus": "1xA100-40GB"}]},
                      "c1")
    [o] = p.offers(Resources())
    assert (o.region, o.gpu_memory_gb, o.extra["gpus"]) == ("us-central1", 40.0, "1xA100-40GB")
    shipped = GcpProvider("gcp", "c1", "proj", ZONES, anonymous=True).offers(
        Resources(gpu_model="V100"))
    assert shipped and all(o.zone in ZONES and o.gpu_model.startswith("V100")
                           for o in shipped)
    from providers.catalog import SHIPPED

    by_path = make_provider("gcp", {"project": "p", "zones": ZONES, "catalog": str(SHIPPED)},
                            "c1").offers(Resources(gpu_model="V100"))
    assert [o.id for o in by_path] == [o.id for o in shipped]


@pytest.mark.parametrize(("settings", "field"), [
    ({"project": "", "zones": ZONES}, "providers.gcp.project"),
    ({"project": "p", "zones": "us-central1-a"}, "providers.gcp.zones"),
    ({"project": "p", "zones": ["us-central1"]}, "providers.gcp.zones"),
    ({"project": "p", "zones": ZONES, "termination_action": "KEEP"},
     "providers.gcp.termination_action"),
    ({"project": "p", "zones": ZONES, "labels": {"Team": "x"}}, "providers.gcp.labels key"),
    ({"project": "p", "zones": ZONES, "offers": [{"zone": "us-central1-a"}]},
     "providers.gcp.offers[0].instance_type"),
    ({"project": "p", "zones": ZONES, "projekt": "p"}, "providers.gcp: "),
    ({"project": "p", "zones": ZONES, "catalog": 5}, "providers.gcp.catalog"),
])
def test_bad_settings_name_the_field(settings, field) -> None:
    with pytest.raises(ProviderConfigError) as e:
        make_provider("gcp", settings, "c1")
    assert field in str(e.value)


def test_a_missing_sdk_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "google.cloud.compute_v1", None)
    with pytest.raises(MissingExtra, match=r"pip install 'spillway\[gcp\]'"):
        GcpProvider("gcp", "c1", "proj", ZONES)


def test_a_bad_credentials_file_stops(tmp_path) -> None:
    key = tmp_path / "key.json"
    key.write_text("{}")
    p = GcpProvider("gcp", "c1", "proj", ZONES, credentials_file=str(key))
    with pytest.raises(Stop, match="cannot be read as a service-account key"):
        p.instances()


@pytest.mark.parametrize("request_id", ["a", "req_with_under_scores", "x" * 63, "r-9-"])
def test_names_are_valid_gce_names_and_stable(request_id) -> None:
    from tests.fakes.gce_rules import NAME

    names = {instance_name("c1", request_id, z, i) for z in ZONES for i in range(3)}
    assert len(names) == 6 and all(NAME.fullmatch(n) for n in names)
    assert instance_name("c1", request_id, ZONES[0], 0) in names
    assert instance_name("c2", request_id, ZONES[0], 0) not in names


def test_shapes() -> None:
    assert region_of("europe-west4-a") == "europe-west4"
    with pytest.raises(ValueError, match="not a GCE zone"):
        region_of("us-central1")
    assert split_type("n1-standard-8+nvidia-tesla-t4x4") == ("n1-standard-8",
                                                              "nvidia-tesla-t4", 4)
    assert split_type("a3-highgpu-8g") == ("a3-highgpu-8g", "", 0)
