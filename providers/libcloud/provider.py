"""Any apache-libcloud compute driver (the ``libcloud`` extra): Azure, OpenStack and the
clouds without a native provider.

The driver is named as libcloud names it (``azure_arm``, ``openstack``, ``dummy``, ...) or as
``module:Class`` for a driver outside libcloud, and built with ``key``, ``secret`` and
``driver_options``. A machine carries this cluster and its request id:

- in tags, where the driver's ``create_node`` takes them (``ex_tags`` on Azure, ``ex_labels``
  on GCE, ``ex_metadata`` on OpenStack and EC2), read back from ``node.extra``;
- always in its name, ``<request id>-<digest of the cluster>-<index>``, which is also its
  provider id (the boot script is told it as ``SPILLWAY_INSTANCE_ID``, so the agent registers
  with it);
- and, for a driver that ignores the name and has no tags (libcloud's dummy driver), in a
  ledger file under ``state_dir`` (node id -> request id), written right after the node is
  made.

The user data goes in ``ex_customdata`` (Azure) or ``ex_userdata`` (OpenStack, EC2); a driver
with neither cannot boot an agent, so a launch with user data is refused (Stop) there. Offers
come from the catalog for a cloud it knows (``catalog_provider``: azure_arm -> azure, ...), or
from the driver's ``list_sizes`` for the sizes configured in ``sizes`` (GPUs and price), or
from ``offers`` written in the configuration.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from broker.model.cloud import InstanceState, Market, Offer, Site
from broker.model.gpus import memory_of, parse_inventory
from providers.base import (
    CLUSTER_TAG,
    OFFER_TAG,
    REQUEST_TAG,
    CloudMachine,
    ProviderConfigError,
    ProviderError,
    Resources,
    Stop,
    check_label,
    require,
)
from providers.libcloud.errors import classify
from providers.offer_source import (
    OfferCatalog,
    OfferList,
    catalog_or_path,
    default_catalog,
    fits,
    offers_from_settings,
)

# libcloud NodeState values -> InstanceState, as the AWS and GCP providers map theirs: up or
# coming up is BOOTING (the reconciler knows when an agent joined), going or gone is
# TERMINATED, existing but not running (still billed for its disk) or broken is FAILED.
NODE_STATES: dict[str, InstanceState] = {
    "running": InstanceState.BOOTING, "starting": InstanceState.BOOTING,
    "pending": InstanceState.BOOTING, "rebooting": InstanceState.BOOTING,
    "reconfiguring": InstanceState.BOOTING, "migrating": InstanceState.BOOTING,
    "updating": InstanceState.BOOTING, "normal": InstanceState.BOOTING,
    "unknown": InstanceState.BOOTING,
    "stopping": InstanceState.TERMINATED, "terminated": InstanceState.TERMINATED,
    "stopped": InstanceState.FAILED, "suspended": InstanceState.FAILED,
    "paused": InstanceState.FAILED, "error": InstanceState.FAILED,
}
TAG_ARGS = ("ex_tags", "ex_labels", "ex_metadata")  # create_node keywords, first found wins
USER_DATA_ARGS = ("ex_customdata", "ex_userdata")
TAG_EXTRA_KEYS = ("tags", "labels", "metadata")  # where drivers put them in node.extra
CATALOG_NAMES = {"azure_arm": "azure", "azure": "azure", "ec2": "aws", "gce": "gcp"}
_NAME = re.compile(r"(?P<rid>[a-z][a-z0-9_-]*)-(?P<digest>[0-9a-f]{8})-(?P<index>[0-9]+)")


def _digest(cluster: str) -> str:
    return hashlib.sha256(f"spillway/{cluster}".encode()).hexdigest()[:8]


def _with_instance_id(user_data: str, name: str) -> str:
    """The boot script with ``SPILLWAY_INSTANCE_ID`` set to the node's name (libcloud has no
    common metadata service, and a cloud may give the host another name), after its ``#!``
    line."""
    line = f"export SPILLWAY_INSTANCE_ID={shlex.quote(name)}\n"
    first, sep, rest = user_data.partition("\n")
    return f"{first}{sep}{line}{rest}" if first.startswith("#!") else line + user_data


class LibcloudProvider:
    """Nodes of one libcloud driver, in one region (see the module docstring)."""

    def __init__(self, name: str, cluster: str, driver: str, region: str = "default",
                 zone: str = "", key: Any = None, secret: str | None = None,
                 driver_options: Mapping[str, Any] | None = None, image: str = "",
                 location: str = "", market: str = "ondemand",
                 sizes: Mapping[str, Mapping[str, Any]] | None = None,
                 offers: Sequence[Mapping[str, Any]] = (), catalog_provider: str = "",
                 create_options: Mapping[str, Any] | None = None,
                 ssh_key: str = "",
                 state_dir: str = "~/.local/state/spillway/libcloud",
                 catalog: OfferCatalog | str | None = None) -> None:
        self.lc = require("libcloud.compute.providers", name, "libcloud")
        self.name, self.cluster = name, check_label(cluster, "cluster")
        where = f"providers.{name}"
        try:
            self.site = Site(name, region, zone, market)  # type: ignore[arg-type]
        except ValueError as e:
            raise ProviderConfigError(f"{where}: {e}") from None
        self.driver_name, self.key, self.secret = str(driver), key, secret
        self.driver_options = dict(driver_options or {})
        self.image, self.location = image, location
        self.create_options, self.ssh_key = dict(create_options or {}), ssh_key
        self.catalog_provider = catalog_provider or CATALOG_NAMES.get(self.driver_name, "")
        self.sizes = self._check_sizes(dict(sizes or {}), where)
        try:
            self._catalog, self._catalog_path = catalog_or_path(catalog, where)
        except ValueError as e:
            raise ProviderConfigError(str(e)) from None
        if offers:
            try:
                self._catalog = OfferList(offers_from_settings(name, [
                    {"region": region, "zone": zone, "market": market, **o} for o in offers],
                    None, where))
            except ValueError as e:
                raise ProviderConfigError(str(e)) from None
            self.catalog_provider = name
        self.ledger_path = Path(state_dir).expanduser() / f"{self.cluster}.{name}.json"
        self._driver: Any = None
        self._driver_class()  # an unknown driver is a configuration error, said now

    @staticmethod
    def _check_sizes(sizes: dict[str, Mapping[str, Any]],
                     where: str) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for size, spec in sizes.items():
            at = f"{where}.sizes.{size}"
            if not isinstance(spec, Mapping) or "gpus" not in spec:
                raise ProviderConfigError(f"{at}: must give gpus (e.g. 4xA100-80GB) and "
                                          "price_per_hour")
            try:
                entries = parse_inventory(str(spec["gpus"]))
            except ValueError as e:
                raise ProviderConfigError(f"{at}.gpus: {e}") from None
            price = spec.get("price_per_hour")
            if price is not None and (isinstance(price, bool)
                                      or not isinstance(price, (int, float)) or price < 0):
                raise ProviderConfigError(f"{at}.price_per_hour: {price!r} must be a number >= 0")
            out[str(size)] = {**spec, "model": entries[0].model,
                              "count": sum(e.count for e in entries)}
        return out

    # -- the driver -----------------------------------------------------------------------

    def _driver_class(self) -> Any:
        if ":" in self.driver_name:
            module, _, cls = self.driver_name.partition(":")
            try:
                return getattr(importlib.import_module(module), cls)
            except (ImportError, AttributeError) as e:
                raise ProviderConfigError(f"providers.{self.name}.driver: "
                                          f"{self.driver_name!r} cannot be imported: {e}") from None
        try:
            return self.lc.get_driver(self.driver_name)
        except AttributeError:
            from libcloud.compute.types import Provider as Names

            known = sorted(v for k, v in vars(Names).items() if k.isupper() and
                           isinstance(v, str))
            raise ProviderConfigError(f"providers.{self.name}.driver: {self.driver_name!r} is "
                                      f"not a libcloud compute driver; known: "
                                      f"{', '.join(known)}") from None

    def driver(self) -> Any:
        if self._driver is None:
            args = [a for a in (self.key, self.secret) if a is not None]
            try:
                self._driver = self._driver_class()(*args, **self.driver_options)
            except Exception as e:
                raise classify(self.name, e, f"build driver {self.driver_name}") from None
        return self._driver

    def _call(self, what: str, fn: Any, *args: Any, offer_id: str = "", **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except ProviderError:
            raise
        except Exception as e:
            raise classify(self.name, e, what, offer_id) from None

    # -- offers ---------------------------------------------------------------------------

    def offers(self, request: Resources) -> list[Offer]:
        if request.regions and self.site.region not in request.regions:
            return []
        if self._catalog is None and self.catalog_provider:
            self._catalog = default_catalog(self.name, self._catalog_path)
        if self._catalog is not None:
            found = self._catalog.offers(self.catalog_provider, request)
            return [o for o in self._relabel(found) if o.region == self.site.region]
        return [o for o in self._size_offers() if fits(o, request)]

    def _relabel(self, offers: Sequence[Offer]) -> list[Offer]:
        return [replace(o, provider=self.name) for o in offers]

    def _size_offers(self) -> list[Offer]:
        """One offer per configured size the driver lists."""
        drv = self.driver()
        where = self._find("location", self.location, drv.list_locations, "") \
            if self.location else None
        listed = {s.id: s for s in self._call("list sizes", drv.list_sizes, where)}
        listed.update({s.name: s for s in listed.values() if s.name})
        out = []
        for size_id, spec in self.sizes.items():
            size = listed.get(size_id)
            if size is None:
                continue
            price = spec.get("price_per_hour", size.price or 0.0)
            out.append(Offer(self.name, self.site.region, self.site.zone, size_id,
                             spec["model"], spec["count"],
                             float(spec.get("gpu_memory_gb") or memory_of(spec["model"])),
                             self.site.market or Market.ONDEMAND, float(price), extra={
                                 k: spec[k] for k in ("gpus", "cpus", "memory_gb") if k in spec}))
        return out

    # -- launch ---------------------------------------------------------------------------

    def _keyword(self, choices: Sequence[str]) -> str | None:
        params = inspect.signature(type(self.driver()).create_node).parameters
        return next((c for c in choices if c in params), None)

    def launch(self, offer: Offer, count: int, request_id: str,
               user_data: str) -> list[CloudMachine]:
        """Create the nodes of this request that do not exist yet; return all of them."""
        check_label(request_id, "request id")
        drv = self.driver()
        have = {m.extra["index"]: m for m in self.instances().values()
                if m.request_id == request_id}
        missing = [i for i in range(count) if i not in have]
        if not missing:
            return [have[i] for i in range(count)]
        kw = self._create_kwargs(offer, request_id, user_data)
        if self.location:
            kw["location"] = self._find("location", self.location, drv.list_locations,
                                        offer.id)
        size = self._find("size", offer.instance_type,
                          lambda: drv.list_sizes(kw.get("location")), offer.id)
        image = self._image(offer.id)
        data_arg = self._keyword(USER_DATA_ARGS)
        for i in missing:
            name = f"{request_id}-{_digest(self.cluster)}-{i}"
            if user_data and data_arg:
                kw[data_arg] = _with_instance_id(user_data, name)
            node = self._call(f"create node {name}", drv.create_node, offer_id=offer.id,
                              name=name, size=size, image=image, **kw)
            if node.name != name and not self._tags(node):
                self._remember(str(node.id), request_id, i)  # the driver kept nothing of ours
            have[i] = self.machine(node, request_id, i)
        return [have[i] for i in range(count)]

    def _create_kwargs(self, offer: Offer, request_id: str, user_data: str) -> dict[str, Any]:
        kw = dict(self.create_options)
        if self.ssh_key and self._keyword(("auth",)):
            from libcloud.compute.base import NodeAuthSSHKey

            kw["auth"] = NodeAuthSSHKey(self.ssh_key)
        tags_arg = self._keyword(TAG_ARGS)
        if tags_arg:
            kw[tags_arg] = {CLUSTER_TAG: self.cluster, REQUEST_TAG: request_id,
                            **({OFFER_TAG: offer.id} if tags_arg != "ex_labels" else {})}
        data_arg = self._keyword(USER_DATA_ARGS)
        if user_data and data_arg is None:
            raise Stop(self.name, f"driver {self.driver_name} takes no user data "
                       f"({' or '.join(USER_DATA_ARGS)}), so a node could not start its "
                       "agent; use a driver that does", code="no-user-data", offer_id=offer.id)
        return kw

    def _image(self, offer_id: str) -> Any:
        """The configured image: ``get_image`` where the driver has it (Azure reads a
        marketplace URN without listing thousands), else found in ``list_images``."""
        drv = self.driver()
        if not self.image:
            return self._call("list images", drv.list_images, offer_id=offer_id)[0]
        try:
            return drv.get_image(self.image)
        except Exception:  # NotImplementedError, or an id get_image does not take
            return self._find("image", self.image, drv.list_images, offer_id)

    def _find(self, what: str, wanted: str, lister: Any, offer_id: str) -> Any:
        for item in self._call(f"list {what}s", lister, offer_id=offer_id):
            if wanted in (str(item.id), item.name):
                return item
        raise Stop(self.name, f"{what} {wanted!r} is not offered by driver "
                   f"{self.driver_name}", code=f"no-{what}", offer_id=offer_id)

    # -- terminate and list ---------------------------------------------------------------

    def terminate(self, provider_ids: Sequence[str]) -> None:
        """Destroy nodes by id; ids the driver no longer lists are not an error."""
        wanted = set(provider_ids)
        if not wanted:
            return
        drv = self.driver()
        for node in list(self._call("list nodes", drv.list_nodes)):
            if wanted & {str(node.id), node.name} and self._owner(node) is not None:
                self._call(f"destroy node {node.id}", drv.destroy_node, node)
        self._forget(wanted)

    def instances(self) -> dict[str, CloudMachine]:
        """Every node of this cluster (by tags, name or ledger), by provider id: the node's
        name where the driver kept the name Spillway gave it, else its id."""
        out: dict[str, CloudMachine] = {}
        for node in self._call("list nodes", self.driver().list_nodes):
            owner = self._owner(node)
            if owner is not None:
                machine = self.machine(node, *owner)
                out[machine.provider_id] = machine
        return out

    def _tags(self, node: Any) -> dict[str, str]:
        for key in TAG_EXTRA_KEYS:
            value = (node.extra or {}).get(key)
            if isinstance(value, Mapping) and CLUSTER_TAG in value:
                return {str(k): str(v) for k, v in value.items()}
        return {}

    def _owner(self, node: Any) -> tuple[str, int] | None:
        """(request id, index) when the node is this cluster's, else None."""
        tags = self._tags(node)
        m = _NAME.fullmatch(str(node.name or ""))
        if tags:
            if tags[CLUSTER_TAG] != self.cluster:
                return None
            return tags.get(REQUEST_TAG, ""), int(m.group("index")) if m else 0
        if m and m.group("digest") == _digest(self.cluster):
            return m.group("rid"), int(m.group("index"))
        entry = self._ledger().get(str(node.id))
        return (entry["request_id"], int(entry["index"])) if entry else None

    def machine(self, node: Any, request_id: str, index: int) -> CloudMachine:
        state = str(node.state).lower()
        created = getattr(node, "created_at", None)
        m = _NAME.fullmatch(str(node.name or ""))
        named = m is not None and m.group("digest") == _digest(self.cluster)
        return CloudMachine(
            provider_id=str(node.name) if named else str(node.id), request_id=request_id,
            state=NODE_STATES.get(state, InstanceState.BOOTING),
            instance_type=str(getattr(node.size, "id", "") or node.extra.get("size", "")),
            zone=self.site.zone, market=self.site.market,
            launched_at=created.timestamp() if created is not None else None,
            native_state=state, extra={"node_id": str(node.id), "index": index,
                                       "public_ips": list(node.public_ips or ()),
                                       "private_ips": list(node.private_ips or ())})

    # -- the ledger (drivers that keep nothing of ours) -----------------------------------

    def _ledger(self) -> dict[str, dict[str, Any]]:
        try:
            data: dict[str, dict[str, Any]] = json.loads(self.ledger_path.read_text())
            return data
        except (OSError, ValueError):
            return {}

    def _remember(self, node_id: str, request_id: str, index: int) -> None:
        ledger = self._ledger()
        ledger[node_id] = {"request_id": request_id, "index": index}
        self._write_ledger(ledger)

    def _forget(self, node_ids: set[str]) -> None:
        ledger = self._ledger()
        if node_ids & set(ledger):
            for node_id in node_ids:
                ledger.pop(node_id, None)
            self._write_ledger(ledger)

    def _write_ledger(self, ledger: dict[str, dict[str, Any]]) -> None:
        self.ledger_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.ledger_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(ledger, indent=1, sort_keys=True))
        tmp.replace(self.ledger_path)
