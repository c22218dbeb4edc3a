"""AWS EC2 through boto3 (the ``spillway[aws]`` extra): spot or on-demand GPU instances.

Configured as ``providers.<name>`` with ``kind: aws`` (docs/cloud-aws.md has every setting and
the IAM permissions). Each machine is tagged with the cluster, the request id and the offer id
(:data:`~providers.base.CLUSTER_TAG`, ...). A launch is idempotent twice over: it first looks
for machines already tagged with its request id (a repeated launch message, or a provisioner
that died between the launch and its record), and it passes EC2 a ``ClientToken`` derived from
the request id, so EC2 itself refuses to start a second set for a retried call. Errors are
mapped onto Retry, FailOver and Stop by :mod:`providers.aws.errors`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from broker.model.cloud import InstanceState, Market, Offer
from providers.aws.errors import classify, is_not_found
from providers.aws.settings import DEFAULT_IMAGE_NAME, region_settings, zone_subnets
from providers.base import (
    CLUSTER_TAG,
    OFFER_TAG,
    REQUEST_TAG,
    CloudMachine,
    ProviderConfigError,
    Resources,
    Stop,
    check_label,
    require,
)
from providers.offer_source import (
    OfferCatalog,
    OfferList,
    catalog_or_path,
    default_catalog,
    offers_from_settings,
)

log = logging.getLogger(__name__)

#: EC2's instance states (describe_instances ``State.Name``) onto the broker's. A running
#: machine is BOOTING until its agent registers (the broker, not EC2, knows when it is READY);
#: stopping and stopped machines are of no use to Spillway (FAILED: the reconciler terminates
#: them, their disks still cost money); shutting-down is no longer billed (TERMINATED).
STATES: dict[str, InstanceState] = {
    "pending": InstanceState.BOOTING,
    "running": InstanceState.BOOTING,
    "shutting-down": InstanceState.TERMINATED,
    "terminated": InstanceState.TERMINATED,
    "stopping": InstanceState.FAILED,
    "stopped": InstanceState.FAILED,
}
USER_DATA_MAX = 16 * 1024  # EC2's limit on user data, before base64
PAGE_SIZE = 200  # describe_instances results a page


class AwsProvider:
    """Rents EC2 instances in the configured regions for one Spillway cluster."""

    kind = "aws"

    def __init__(self, name: str, cluster: str, regions: Sequence[str] | Mapping[str, Any],
                 endpoint_url: str | None = None, image: str = "",
                 image_name: str = DEFAULT_IMAGE_NAME, image_owner: str = "amazon",
                 security_groups: Sequence[str] = (), key_name: str = "",
                 subnets: Mapping[str, str] | None = None, iam_instance_profile: str = "",
                 spot_max_price: float | None = None, profile: str = "",
                 api_attempts: int = 3, catalog: OfferCatalog | str | None = None,
                 offers: Sequence[Mapping[str, Any]] = ()) -> None:
        self.name, self.cluster = name, check_label(cluster, "cluster")
        defaults = {"image": image, "image_name": image_name, "image_owner": image_owner,
                    "security_groups": security_groups, "key_name": key_name}
        self.regions = region_settings(name, regions, defaults)
        self.subnets = zone_subnets(name, subnets or {})  # zone -> subnet id
        self.endpoint_url, self.profile = endpoint_url, profile
        self.iam_instance_profile = iam_instance_profile
        if spot_max_price is not None and not spot_max_price > 0:
            raise ProviderConfigError(f"providers.{name}.spot_max_price: {spot_max_price!r} "
                                      "must be dollars per hour > 0 (leave it out to pay at "
                                      "most the on-demand price)")
        self.spot_max_price = spot_max_price
        if isinstance(api_attempts, bool) or not isinstance(api_attempts, int) \
                or api_attempts < 1:
            raise ProviderConfigError(f"providers.{name}.api_attempts: {api_attempts!r} must "
                                      "be a whole number >= 1 (tries per EC2 call)")
        self.api_attempts = api_attempts
        where = f"providers.{name}"
        try:
            if offers:  # written in the configuration instead of the catalog's
                catalog = OfferList(offers_from_settings(self.kind, offers, _region_of, where))
            self._catalog, self._catalog_path = catalog_or_path(catalog, where)
        except ValueError as e:
            raise ProviderConfigError(str(e)) from None
        self._boto3 = require("boto3", name, "aws")
        self._lock = threading.Lock()
        self._session: Any = None
        self._clients: dict[str, Any] = {}
        self._images: dict[str, str] = {}
        self._region_of: dict[str, str] = {}  # instance id -> region, as seen

    # -- offers --------------------------------------------------------------------------------

    def offers(self, request: Resources) -> list[Offer]:
        """The catalog's AWS offers for ``request`` in the configured regions (and in the
        request's regions, if it names any), labelled with this provider's name. Where
        ``subnets`` are configured, only their zones are offered, and a regional offer becomes
        one offer per zone with a subnet (a machine lands in one zone: its site names it)."""
        wanted = set(self.regions)
        if request.regions:
            wanted &= set(request.regions)
        out: list[Offer] = []
        for o in self._offer_source().offers(self.kind, request):
            if o.region not in wanted:
                continue
            zones = [o.zone] if o.zone else [""]
            if self.subnets:
                zones = [z for z in self.subnets if z == o.zone
                         or (not o.zone and z.startswith(o.region))]
            out += [replace(o, provider=self.name, zone=z) for z in zones]
        return out

    def _offer_source(self) -> OfferCatalog:
        if self._catalog is None:  # the shipped catalog, or the file configured; Stop if bad
            self._catalog = default_catalog(self.name, self._catalog_path)
        return self._catalog

    # -- launch --------------------------------------------------------------------------------

    def launch(self, offer: Offer, count: int, request_id: str,
               user_data: str) -> list[CloudMachine]:
        """Start ``count`` machines of ``offer`` (all or none), or return those a launch with
        the same ``request_id`` already started."""
        check_label(request_id, "request id")
        region = self._check_offer(offer, count, user_data)
        # RunInstances is tried once: EC2 answers a capacity shortage with HTTP 500, which
        # botocore would retry in place (burning the account's RunInstances rate) where
        # Spillway fails over to the next offer; throttling comes back as Retry instead
        ec2 = self.client(region, attempts=1)
        doing = f"launch of {count} x {offer.instance_type}"
        already = self._describe(region, [_tag_filter(REQUEST_TAG, request_id)], doing,
                                 offer.id)
        if already:
            log.info("%s: request %s already started %s", self.name, request_id,
                     ", ".join(m.provider_id for m in already))
            return already
        params = self._run_params(offer, count, request_id, user_data, region)
        try:
            response = ec2.run_instances(**params)
        except Exception as e:
            raise classify(self.name, e, doing, offer.id) from e
        machines = [self._machine(i, region) for i in response.get("Instances", [])]
        log.info("%s: launched %s for request %s (%s)", self.name,
                 ", ".join(m.provider_id for m in machines), request_id, offer.id)
        return machines

    def _check_offer(self, offer: Offer, count: int, user_data: str) -> str:
        """The offer's region, if this provider may launch it; Stop if not."""
        if offer.provider != self.name:
            raise Stop(self.name, f"offer {offer.id} belongs to provider {offer.provider!r}, "
                       f"not {self.name!r}", offer_id=offer.id)
        if offer.region not in self.regions:
            raise Stop(self.name, f"offer {offer.id}: region {offer.region!r} is not among "
                       f"providers.{self.name}.regions ({', '.join(self.regions)}); add it",
                       offer_id=offer.id)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise Stop(self.name, f"offer {offer.id}: count {count!r} must be a whole number "
                       ">= 1", offer_id=offer.id)
        if len(user_data.encode()) > USER_DATA_MAX:
            raise Stop(self.name, f"offer {offer.id}: the user data is "
                       f"{len(user_data.encode())} bytes, EC2 takes at most {USER_DATA_MAX}",
                       offer_id=offer.id)
        if offer.zone and self.subnets and offer.zone not in self.subnets:
            raise Stop(self.name, f"offer {offer.id}: providers.{self.name}.subnets has no "
                       f"subnet for zone {offer.zone!r} (it has "
                       f"{', '.join(sorted(self.subnets))}); add one", offer_id=offer.id)
        return offer.region

    def _run_params(self, offer: Offer, count: int, request_id: str, user_data: str,
                    region: str) -> dict[str, Any]:
        tags = [{"Key": CLUSTER_TAG, "Value": self.cluster},
                {"Key": REQUEST_TAG, "Value": request_id},
                {"Key": OFFER_TAG, "Value": offer.id},
                {"Key": "Name", "Value": f"spillway-{self.cluster}-{request_id}"[:255]}]
        rs = self.regions[region]
        params: dict[str, Any] = {
            "ImageId": self.image(region), "InstanceType": offer.instance_type,
            "MinCount": count, "MaxCount": count, "UserData": user_data,
            "ClientToken": client_token(self.cluster, request_id),
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags},
                                  {"ResourceType": "volume", "Tags": tags[:3]}],
            # IMDSv2 only: the agent's interruption watcher asks for a token first
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        }
        if offer.market is Market.SPOT:
            spot: dict[str, Any] = {"SpotInstanceType": "one-time",
                                    "InstanceInterruptionBehavior": "terminate"}
            if self.spot_max_price is not None:
                spot["MaxPrice"] = f"{self.spot_max_price:.4f}"
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        subnet = self.subnets.get(offer.zone, "")
        if subnet:
            params["SubnetId"] = subnet  # the subnet fixes the zone
        elif offer.zone:
            params["Placement"] = {"AvailabilityZone": offer.zone}
        if rs.security_groups:
            params["SecurityGroupIds"] = list(rs.security_groups)
        if rs.key_name:
            params["KeyName"] = rs.key_name
        if self.iam_instance_profile:
            key = "Arn" if self.iam_instance_profile.startswith("arn:") else "Name"
            params["IamInstanceProfile"] = {key: self.iam_instance_profile}
        return params

    def image(self, region: str) -> str:
        """The AMI launches in ``region`` use: configured, or the newest one by name."""
        rs = self.regions[region]
        if rs.image:
            return rs.image
        if region not in self._images:
            doing = f"image lookup ({rs.image_name!r} owned by {rs.image_owner})"
            try:
                found = self.client(region).describe_images(
                    Owners=[rs.image_owner],
                    Filters=[{"Name": "name", "Values": [rs.image_name]},
                             {"Name": "state", "Values": ["available"]}])["Images"]
            except Exception as e:
                raise classify(self.name, e, doing) from e
            if not found:
                raise Stop(self.name, f"{doing} in {region} found no AMI; set "
                           f"providers.{self.name}.image (an AMI id) or image_name")
            newest = max(found, key=lambda i: str(i.get("CreationDate", "")))
            self._images[region] = str(newest["ImageId"])
        return self._images[region]

    # -- terminate -----------------------------------------------------------------------------

    def terminate(self, provider_ids: Sequence[str]) -> None:
        """Terminate these instances wherever they are; an id EC2 does not know is skipped."""
        todo = list(dict.fromkeys(i for i in provider_ids if i))
        if not todo:
            return
        by_region: dict[str, list[str]] = {}
        unknown = [i for i in todo if i not in self._region_of]
        if unknown:  # find them: an id filter does not fail on unknown ids
            for region in self.regions:
                for m in self._describe(region, [{"Name": "instance-id", "Values": unknown}],
                                        "terminate"):
                    self._region_of[m.provider_id] = region
        for i in todo:
            if i in self._region_of:
                by_region.setdefault(self._region_of[i], []).append(i)
            else:
                log.info("%s: instance %s is not known to EC2 (already gone)", self.name, i)
        for region, ids in by_region.items():
            self._terminate_in(region, ids)

    def _terminate_in(self, region: str, ids: list[str]) -> None:
        ec2 = self.client(region)
        try:
            ec2.terminate_instances(InstanceIds=ids)
        except Exception as e:
            if not is_not_found(e):
                raise classify(self.name, e, f"terminate of {', '.join(ids)}") from e
            for one in ids:  # one of them vanished meanwhile: terminate the rest singly
                try:
                    ec2.terminate_instances(InstanceIds=[one])
                except Exception as e1:
                    if not is_not_found(e1):
                        raise classify(self.name, e1, f"terminate of {one}") from e1
        log.info("%s: terminating %s in %s", self.name, ", ".join(ids), region)

    # -- listing -------------------------------------------------------------------------------

    def instances(self) -> dict[str, CloudMachine]:
        """Every instance tagged with this cluster, in every configured region (terminated
        ones included while EC2 still lists them)."""
        out: dict[str, CloudMachine] = {}
        for region in self.regions:
            for m in self._describe(region, [], "instance listing"):
                out[m.provider_id] = m
        return out

    def _describe(self, region: str, filters: list[dict[str, Any]], doing: str,
                  offer_id: str = "") -> list[CloudMachine]:
        """This cluster's instances in ``region`` matching ``filters`` (every page)."""
        flt = [_tag_filter(CLUSTER_TAG, self.cluster), *filters]
        try:
            pages = self.client(region).get_paginator("describe_instances").paginate(
                Filters=flt, PaginationConfig={"PageSize": PAGE_SIZE})
            found = list(_instances(pages))
        except Exception as e:
            raise classify(self.name, e, f"{doing} (describe_instances in {region})",
                           offer_id) from e
        return [self._machine(i, region) for i in found]

    def _machine(self, inst: Mapping[str, Any], region: str) -> CloudMachine:
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags", []) or []}
        native = str(inst.get("State", {}).get("Name", ""))
        launched: Any = inst.get("LaunchTime")  # a datetime (botocore parses it)
        iid = str(inst["InstanceId"])
        self._region_of[iid] = region
        placement = inst.get("Placement", {}) or {}
        return CloudMachine(
            provider_id=iid, request_id=tags.get(REQUEST_TAG, ""),
            state=STATES.get(native, InstanceState.FAILED),
            instance_type=str(inst.get("InstanceType", "")),
            zone=str(placement.get("AvailabilityZone", "")),
            market=Market.SPOT if inst.get("InstanceLifecycle") == "spot" else Market.ONDEMAND,
            launched_at=launched.timestamp() if hasattr(launched, "timestamp") else None,
            native_state=native,
            extra={"region": region, "offer_id": tags.get(OFFER_TAG, ""),
                   "private_ip": inst.get("PrivateIpAddress", ""),
                   "public_ip": inst.get("PublicIpAddress", ""),
                   "state_reason": (inst.get("StateReason") or {}).get("Code", "")})

    # -- clients -------------------------------------------------------------------------------

    def client(self, region: str, attempts: int | None = None) -> Any:
        """The boto3 EC2 client for ``region`` trying each call ``attempts`` times (default
        ``api_attempts``); one each, made once (clients are thread-safe)."""
        attempts = self.api_attempts if attempts is None else attempts
        key = f"{region}/{attempts}"
        with self._lock:
            if key not in self._clients:
                from botocore.config import Config as BotoConfig

                if self._session is None:
                    self._session = self._boto3.session.Session(
                        profile_name=self.profile or None)
                cfg = BotoConfig(retries={"mode": "standard", "total_max_attempts": attempts},
                                 connect_timeout=10, read_timeout=60)
                self._clients[key] = self._session.client(
                    "ec2", region_name=region, endpoint_url=self.endpoint_url or None,
                    config=cfg)
            return self._clients[key]


def _region_of(zone: str) -> str:
    """An EC2 zone's region: us-east-1a -> us-east-1 (Local Zones aside)."""
    return zone[:-1] if zone[-1:].isalpha() else zone


def client_token(cluster: str, request_id: str) -> str:
    """EC2's idempotency token for a launch (at most 64 ASCII characters)."""
    digest = hashlib.sha256(f"{cluster}/{request_id}".encode()).hexdigest()
    return f"spillway-{digest[:48]}"


def _tag_filter(key: str, value: str) -> dict[str, Any]:
    return {"Name": f"tag:{key}", "Values": [value]}


def _instances(pages: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for page in pages:
        for reservation in page.get("Reservations", []):
            yield from reservation.get("Instances", [])
