"""providers/aws/provider.py against moto's EC2 server (a real HTTP endpoint), with faults
injected by tests/fake_ec2.py's proxy: launch (spot, on-demand, idempotent), listing by tag across
regions and pages, terminate (missing ids too), offers, configuration errors, and every fault
class (capacity, spot count, throttling, 5xx, auth, quota) with what it maps onto."""

from __future__ import annotations

import base64
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from broker.model.cloud import InstanceState, Market, Offer
from providers.aws import provider as aws_mod
from providers.aws.errors import error_class
from providers.aws.provider import AwsProvider, client_token
from providers.base import (
    CLUSTER_TAG,
    OFFER_TAG,
    REQUEST_TAG,
    FailOver,
    MissingExtra,
    ProviderConfigError,
    Resources,
    Retry,
    Stop,
    make_provider,
)
from tests.fake_ec2 import AWS_TEST_ENV, FaultProxy, moto_ec2, reset_moto

AMI = "ami-12c6146b"  # any id: moto does not check AMIs unless told to


@pytest.fixture(scope="module")
def ec2_server() -> Iterator[tuple[str, FaultProxy]]:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in AWS_TEST_ENV.items():
            mp.setenv(k, v)
        with moto_ec2() as served:
            yield served


@pytest.fixture
def proxy(ec2_server: tuple[str, FaultProxy], monkeypatch: pytest.MonkeyPatch
          ) -> Iterator[FaultProxy]:
    """The module's server, moto emptied for this test (the instances, VPCs and instance
    profiles that another test made are gone, whatever ran before)."""
    for k, v in AWS_TEST_ENV.items():
        monkeypatch.setenv(k, v)
    reset_moto(ec2_server[0])
    p = ec2_server[1]
    yield p
    for action in ("RunInstances", "DescribeInstances", "TerminateInstances"):
        assert p.pending(action) == 0, f"the test left {action} faults unserved"


def cluster_name() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def provider(proxy: FaultProxy, cluster: str | None = None, **kw: Any) -> AwsProvider:
    settings: dict[str, Any] = {"regions": ["us-east-1", "us-west-2"], "image": AMI,
                                "endpoint_url": proxy.url, "api_attempts": 1, **kw}
    p = make_provider("aws", settings, cluster or cluster_name())
    assert isinstance(p, AwsProvider)
    return p


def offer(market: Market = Market.SPOT, zone: str = "us-east-1a", region: str = "us-east-1",
          itype: str = "g5.xlarge") -> Offer:
    return Offer("aws", region, zone, itype, "A10G", 1, 24.0, market, 1.006 * (
        0.4 if market is Market.SPOT else 1.0))


def raw(region: str = "us-east-1") -> Any:
    return boto3.client("ec2", region_name=region, endpoint_url=_moto_url)


_moto_url = ""


@pytest.fixture(autouse=True)
def _remember_moto(ec2_server: tuple[str, FaultProxy]) -> None:
    global _moto_url
    _moto_url = ec2_server[0]


# -- launch ------------------------------------------------------------------------------------


def test_spot_launch_tags_market_zone_and_user_data(proxy: FaultProxy) -> None:
    p = provider(proxy)
    machines = p.launch(offer(), 2, "req-spot-1", "#!/bin/bash\necho hello\n")
    assert len(machines) == 2
    ids = [m.provider_id for m in machines]
    described = raw().describe_instances(InstanceIds=ids)["Reservations"][0]["Instances"]
    for inst in described:
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert tags[CLUSTER_TAG] == p.cluster and tags[REQUEST_TAG] == "req-spot-1"
        assert tags[OFFER_TAG] == "aws:us-east-1:us-east-1a:spot/g5.xlarge"
        assert inst["InstanceLifecycle"] == "spot"
        assert inst["Placement"]["AvailabilityZone"] == "us-east-1a"
        assert inst["InstanceType"] == "g5.xlarge" and inst["ImageId"] == AMI
        attr = raw().describe_instance_attribute(InstanceId=inst["InstanceId"],
                                                 Attribute="userData")
        assert base64.b64decode(attr["UserData"]["Value"]) == b"#!/bin/bash\necho hello\n"
    assert all(m.market is Market.SPOT and m.state is InstanceState.BOOTING for m in machines)
    assert {m.request_id for m in machines} == {"req-spot-1"}
    p.terminate(ids)


def test_ondemand_launch_in_a_configured_subnet(proxy: FaultProxy) -> None:
    ec2 = raw()
    vpc = ec2.create_vpc(CidrBlock="10.7.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.7.1.0/24",
                               AvailabilityZone="us-east-1b")["Subnet"]["SubnetId"]
    iam = boto3.client("iam", region_name="us-east-1", endpoint_url=_moto_url)
    iam.create_instance_profile(InstanceProfileName="spillway-agent")
    p = provider(proxy, subnets={"us-east-1b": subnet}, iam_instance_profile="spillway-agent")
    [m] = p.launch(offer(Market.ONDEMAND, zone="us-east-1b"), 1, "req-od-1", "echo")
    inst = ec2.describe_instances(InstanceIds=[m.provider_id])["Reservations"][0]["Instances"][0]
    assert inst["SubnetId"] == subnet and "InstanceLifecycle" not in inst
    assert m.market is Market.ONDEMAND and m.zone == "us-east-1b"
    with pytest.raises(Stop, match=r"subnets has no subnet for zone 'us-east-1c'"):
        p.launch(offer(Market.ONDEMAND, zone="us-east-1c"), 1, "req-od-2", "echo")
    p.terminate([m.provider_id])


def test_repeated_launch_returns_the_same_machines(proxy: FaultProxy) -> None:
    p = provider(proxy)
    first = p.launch(offer(), 2, "req-idem", "echo")
    seen = proxy.seen["RunInstances"]
    again = provider(proxy, cluster=p.cluster).launch(offer(), 2, "req-idem", "echo")
    assert sorted(m.provider_id for m in again) == sorted(m.provider_id for m in first)
    assert proxy.seen["RunInstances"] == seen  # found by its tag: no second RunInstances
    assert len(p.instances()) == 2
    p.terminate([m.provider_id for m in first])


def test_client_token_is_stable_and_fits_ec2() -> None:
    token = client_token("c" * 63, "r" * 63)
    assert token == client_token("c" * 63, "r" * 63) and len(token) <= 64
    assert token != client_token("c" * 63, "r" * 62)


def test_image_lookup_takes_the_newest_by_name(proxy: FaultProxy) -> None:
    p = provider(proxy, image="", image_name="Deep Learning AMI *")
    found = raw().describe_images(Owners=["amazon"], Filters=[
        {"Name": "name", "Values": ["Deep Learning AMI *"]}])["Images"]
    newest = max(found, key=lambda i: i["CreationDate"])["ImageId"]
    assert p.image("us-east-1") == newest
    p = provider(proxy, image="", image_name="no such image *")
    with pytest.raises(Stop, match=r"found no AMI; set providers.aws.image"):
        p.launch(offer(), 1, "req-noimg", "echo")


# -- listing and terminate ---------------------------------------------------------------------


def test_instances_lists_this_cluster_in_every_region_over_pages(
        proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aws_mod, "PAGE_SIZE", 5)
    p = provider(proxy)
    other = provider(proxy)  # another cluster, same account
    east = [m for i in range(6) for m in p.launch(offer(), 1, f"req-east-{i}", "echo")]
    west = p.launch(offer(zone="us-west-2a", region="us-west-2"), 1, "req-west", "echo")
    stranger = other.launch(offer(), 1, "req-other", "echo")
    seen_before = proxy.seen["DescribeInstances"]
    listed = p.instances()
    assert set(listed) == {m.provider_id for m in east + west}
    assert proxy.seen["DescribeInstances"] - seen_before >= 3  # 2 pages in us-east-1, 1 west
    assert listed[west[0].provider_id].extra["region"] == "us-west-2"
    assert listed[west[0].provider_id].request_id == "req-west"
    # a fresh provider (no cache of regions) terminates across regions, skipping unknown ids
    fresh = provider(proxy, cluster=p.cluster)
    fresh.terminate([*listed, "i-0123456789abcdef0"])
    after = p.instances()
    assert {m.state for m in after.values()} == {InstanceState.TERMINATED}
    assert {m.native_state for m in after.values()} <= {"shutting-down", "terminated"}
    fresh.terminate(list(listed))  # again: already terminated is fine
    other.terminate([m.provider_id for m in stranger])


def test_terminate_of_unknown_ids_is_no_error(proxy: FaultProxy) -> None:
    p = provider(proxy)
    p.terminate(["i-0123456789abcdef0", "i-00000000000000001"])
    p.terminate([])


def test_native_states_map_onto_instance_states(proxy: FaultProxy) -> None:
    p = provider(proxy)
    [m] = p.launch(offer(Market.ONDEMAND), 1, "req-states", "echo")
    raw().stop_instances(InstanceIds=[m.provider_id])
    listed = p.instances()[m.provider_id]
    assert listed.native_state in ("stopping", "stopped") and listed.state is InstanceState.FAILED
    p.terminate([m.provider_id])
    assert p.instances()[m.provider_id].state is InstanceState.TERMINATED


# -- faults ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "cls", "says"), [
    ("InsufficientInstanceCapacity", FailOver, "no capacity"),
    ("MaxSpotInstanceCountExceeded", FailOver, "spot instances is reached"),
    ("SpotMaxPriceTooLow", FailOver, "maximum price"),
    ("RequestLimitExceeded", Retry, "throttled"),
    ("InternalError", Retry, "internal error"),
    ("Unavailable", Retry, "unavailable"),
    ("UnauthorizedOperation", Stop, "IAM policy"),
    ("VcpuLimitExceeded", Stop, "Service Quotas"),
])
def test_launch_faults_map_onto_what_to_do(proxy: FaultProxy, code: str,
                                           cls: type[Exception], says: str) -> None:
    p = provider(proxy)
    proxy.inject("RunInstances", code)
    o = offer()
    with pytest.raises(cls) as info:
        p.launch(o, 1, "req-fault", "echo")
    err = info.value
    assert err.code == code and err.offer_id == o.id  # type: ignore[attr-defined]
    assert o.id in str(err) and says in str(err), str(err)
    assert p.instances() == {}  # nothing started
    if cls is Retry:  # the same call again succeeds once the fault has passed
        machines = p.launch(o, 1, "req-fault", "echo")
        assert len(machines) == 1 and len(p.instances()) == 1
        p.terminate([m.provider_id for m in machines])


def test_botocore_retries_throttling_within_one_call_but_launches_once(
        proxy: FaultProxy) -> None:
    p = provider(proxy, api_attempts=3)
    proxy.inject("DescribeInstances", "RequestLimitExceeded", times=2)
    before = proxy.seen["DescribeInstances"]
    assert p.instances() == {}
    assert proxy.seen["DescribeInstances"] - before == 4  # 2 throttled, then 1 per region
    # RunInstances is tried once: a capacity shortage (HTTP 500) fails over at once
    proxy.inject("RunInstances", "InsufficientInstanceCapacity")
    before = proxy.seen["RunInstances"]
    with pytest.raises(FailOver):
        p.launch(offer(), 1, "req-once", "echo")
    assert proxy.seen["RunInstances"] - before == 1


def test_throttled_listing_and_terminate_say_retry(proxy: FaultProxy) -> None:
    p = provider(proxy)
    proxy.inject("DescribeInstances", "RequestLimitExceeded")
    with pytest.raises(Retry, match="instance listing"):
        p.instances()
    [m] = p.launch(offer(), 1, "req-term", "echo")
    proxy.inject("TerminateInstances", "InternalError")
    with pytest.raises(Retry, match=f"terminate of {m.provider_id}"):
        p.terminate([m.provider_id])
    p.terminate([m.provider_id])
    assert p.instances()[m.provider_id].state is InstanceState.TERMINATED


def test_unreachable_endpoint_says_retry() -> None:
    from broker.control.embedded import free_port

    p = make_provider("aws", {"regions": ["us-east-1"], "image": AMI, "api_attempts": 1,
                              "endpoint_url": f"http://127.0.0.1:{free_port()}"}, "tconn")
    with pytest.raises(Retry, match="Could not connect"):
        p.instances()


@pytest.mark.parametrize(("code", "status", "action"), [
    ("InvalidParameterValue", 400, "stop"), ("InvalidAMIID.NotFound", 400, "stop"),
    ("AuthFailure", 401, "stop"), ("InstanceLimitExceeded", 400, "stop"),
    ("Unsupported", 400, "failover"), ("Throttling", 400, "retry"),
    ("ServiceUnavailable", 503, "retry"), ("SomethingNew", 502, "retry"),
    ("SomethingNew", 400, "stop"),
])
def test_error_codes_table(code: str, status: int, action: str) -> None:
    assert error_class(code, status).action == action


# -- offers and configuration ------------------------------------------------------------------


class ListCatalog:
    """A catalog holding a fixed list of offers (the real one is providers/catalog)."""

    def __init__(self, offers: list[Offer]) -> None:
        self.items, self.asked = offers, []

    def offers(self, provider: str, request: Resources) -> list[Offer]:
        self.asked.append(provider)
        return [o for o in self.items if o.provider == provider
                and o.gpu_count >= request.gpu_count]


def test_offers_are_the_catalogs_in_configured_regions() -> None:
    items = [offer(), offer(zone="us-west-2b", region="us-west-2"),
             offer(zone="eu-west-1a", region="eu-west-1"),
             Offer("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", "A100-40GB", 1,
                   40.0, Market.SPOT, 1.1)]
    cat = ListCatalog(items)
    p = AwsProvider("aws-main", "tcat", ["us-east-1", "us-west-2"], image=AMI, catalog=cat)
    found = p.offers(Resources(gpu_count=1))
    assert [(o.provider, o.region) for o in found] == [("aws-main", "us-east-1"),
                                                       ("aws-main", "us-west-2")]
    assert cat.asked == ["aws"]
    assert [o.region for o in p.offers(Resources(regions=("us-west-2",)))] == ["us-west-2"]
    assert p.offers(Resources(gpu_count=8)) == []
    # with subnets, only their zones: a regional offer becomes one per zone with a subnet
    regional = offer(Market.ONDEMAND, zone="")
    p = AwsProvider("aws", "tcat", ["us-east-1"], image=AMI, catalog=ListCatalog(
        [regional, offer(zone="us-east-1a"), offer(zone="us-east-1d")]),
        subnets={"us-east-1a": "subnet-a", "us-east-1b": "subnet-b"})
    assert [o.id for o in p.offers(Resources())] == [
        "aws:us-east-1:us-east-1a:ondemand/g5.xlarge",
        "aws:us-east-1:us-east-1b:ondemand/g5.xlarge",
        "aws:us-east-1:us-east-1a:spot/g5.xlarge"]


@pytest.mark.parametrize(("settings", "says"), [
    ({"regions": []}, "providers.aws.regions: [] must be a non-empty list"),
    ({"regions": "us-east-1"}, "providers.aws.regions: 'us-east-1' must be"),
    ({"regions": {"us-east-1": {"imgae": "ami-1"}}},
     "providers.aws.regions.us-east-1: unknown setting(s) imgae"),
    ({"regions": ["us-east-1"], "security_groups": "sg-1"}, "security_groups: 'sg-1' must be"),
    ({"regions": ["us-east-1"], "api_attempts": 0}, "providers.aws.api_attempts: 0"),
    ({"regions": ["us-east-1"], "spot_max_price": -1}, "providers.aws.spot_max_price: -1"),
    ({"regions": ["us-east-1"], "subnets": ["subnet-1"]}, "providers.aws.subnets"),
    ({"regions": ["us-east-1"], "zones": ["a"]}, "providers.aws: "),
])
def test_bad_settings_name_the_field(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(ProviderConfigError) as info:
        make_provider("aws", settings, "tcfg")
    assert says in str(info.value), str(info.value)


def test_offer_outside_the_configured_regions_is_refused(proxy: FaultProxy) -> None:
    p = provider(proxy)
    with pytest.raises(Stop, match=r"region 'eu-west-1' is not among providers.aws.regions"):
        p.launch(offer(zone="eu-west-1a", region="eu-west-1"), 1, "req-x", "echo")
    with pytest.raises(Stop, match="at most 16384"):
        p.launch(offer(), 1, "req-y", "x" * 20000)
    with pytest.raises(ValueError, match="request id 'Bad Id'"):
        p.launch(offer(), 1, "Bad Id", "echo")


def test_missing_boto3_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(MissingExtra, match=r"pip install 'spillway\[aws\]'"):
        make_provider("aws", {"regions": ["us-east-1"]}, "tmiss")


def test_offers_written_in_the_configuration_and_catalog_errors() -> None:
    p = make_provider("aws", {"regions": ["us-east-1"], "image": AMI, "offers": [
        {"zone": "us-east-1a", "instance_type": "p2.xlarge", "gpu_model": "K80-12GB",
         "gpu_count": 1, "market": "spot", "price_per_hour": 0.38, "gpus": "1xK80-12GB",
         "cpus": 4}]}, "tcfgoffers")
    [o] = p.offers(Resources())
    assert o.id == "aws:us-east-1:us-east-1a:spot/p2.xlarge" and o.gpu_memory_gb == 12.0
    assert dict(o.extra) == {"gpus": "1xK80-12GB", "cpus": 4}
    with pytest.raises(ProviderConfigError, match=r"providers.aws.offers\[0\].gpu_count"):
        make_provider("aws", {"regions": ["us-east-1"], "offers": [
            {"zone": "us-east-1a", "instance_type": "p2.xlarge", "gpu_model": "K80-12GB",
             "market": "spot", "price_per_hour": 0.38}]}, "tcfgoffers")
    with pytest.raises(ProviderConfigError, match=r"providers.aws.catalog: 5"):
        make_provider("aws", {"regions": ["us-east-1"], "catalog": 5}, "tcfgoffers")
    missing = make_provider("aws", {"regions": ["us-east-1"], "catalog": "/no/such.csv"},
                            "tcfgoffers")
    with pytest.raises(Stop, match=r"no offer catalog at /no/such\.csv"):
        missing.offers(Resources())


def test_offers_from_the_shipped_catalog() -> None:
    p = AwsProvider("aws", "tship", ["us-east-1"], image=AMI)
    found = p.offers(Resources(gpu_count=8, gpu_model="V100"))
    assert found, "the shipped catalog has 8 x V100 offers in us-east-1"
    assert {(o.provider, o.region) for o in found} == {("aws", "us-east-1")}
    assert all(o.gpu_count >= 8 and o.gpu_model.startswith("V100") for o in found)
    assert {o.market for o in found} == {Market.SPOT, Market.ONDEMAND}
    assert all(o.zone for o in found if o.market is Market.SPOT)  # spot prices are zonal
