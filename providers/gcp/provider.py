"""Google Compute Engine through google-cloud-compute (the ``gcp`` extra), REST transport.

- ``launch``: one ``instances.insert`` per machine, spot (``provisioningModel: SPOT``, deleted
  or stopped when preempted) or standard, with the GPUs (``guestAccelerators`` for N1 types;
  A2/A3/A4/G2 types carry theirs), the cluster and request id as labels, and the user data as
  the ``startup-script`` metadata. Names come from the request id, and each insert carries a
  ``requestId`` derived from the name, so a repeated launch reads back the machines the first
  one made. Each insert's operation is awaited through a ``ZoneOperationsClient`` on the
  configured endpoint (``insert(...).result()`` would poll Google's own endpoint), with a
  deadline.
- ``terminate``: ``instances.delete``; a machine Compute no longer knows is not an error.
- ``instances``: ``instances.aggregatedList`` filtered by the cluster label.

Errors are sorted by providers.gcp.errors. No call is retried here: a Retry goes back to the
provisioner, which backs off.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from broker.model.cloud import InstanceState, Market, Offer
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
from providers.gcp import errors as gcp_errors
from providers.gcp import shapes
from providers.offer_source import (
    OfferCatalog,
    OfferList,
    catalog_or_path,
    default_catalog,
    in_zones,
    offers_from_settings,
)

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"


class GcpProvider:
    """Rents GCE machines in ``project``, in the configured ``zones``.

    ``endpoint`` points the client at another Compute endpoint (the tests' fake);
    ``credentials_file`` is a service-account key file; ``anonymous`` sends no credentials
    (a fake only); neither: Application Default Credentials. Offers come from the shipped
    catalog, another one (``catalog``: its path), or ``offers`` written in the configuration."""

    def __init__(self, name: str, cluster: str, project: str, zones: Sequence[str],
                 endpoint: str | None = None, credentials_file: str | None = None,
                 anonymous: bool = False, image: str = DEFAULT_IMAGE,
                 network: str = "global/networks/default", subnetwork: str = "",
                 public_ip: bool = True, service_account: str = "",
                 disk_size_gb: int = 100, disk_type: str = "pd-balanced",
                 termination_action: str = "DELETE", labels: Mapping[str, str] | None = None,
                 call_timeout_s: float = 30.0, operation_timeout_s: float = 300.0,
                 offers: Sequence[Mapping[str, Any]] = (),
                 catalog: OfferCatalog | str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.compute = require("google.cloud.compute_v1", name, "gcp")
        self.name, self.cluster = name, check_label(cluster, "cluster")
        where = f"providers.{name}"
        if not str(project).strip():
            raise ProviderConfigError(f"{where}.project: must name the GCP project id")
        if isinstance(zones, str) or not zones:
            raise ProviderConfigError(f"{where}.zones: must be a list of zones, such as "
                                      "[us-central1-a, us-central1-b]")
        try:
            self.region_of = {z: shapes.region_of(z) for z in zones}
        except ValueError as e:
            raise ProviderConfigError(f"{where}.zones: {e}") from None
        action = str(termination_action).upper()
        if action not in ("DELETE", "STOP"):
            raise ProviderConfigError(f"{where}.termination_action: {termination_action!r} "
                                      "is not DELETE or STOP (what GCE does to a preempted "
                                      "spot machine)")
        extra = dict(labels or {})
        try:
            for key, value in extra.items():
                check_label(str(key), f"{where}.labels key")
                if value:
                    check_label(str(value), f"{where}.labels[{key}]")
        except ValueError as e:
            raise ProviderConfigError(str(e)) from None
        self.project, self.zones = str(project), list(zones)
        self.endpoint, self.credentials_file, self.anonymous = endpoint, credentials_file, \
            anonymous
        self.image, self.network, self.subnetwork = image, network, subnetwork
        self.public_ip, self.service_account = public_ip, service_account
        self.disk_size_gb, self.disk_type = int(disk_size_gb), disk_type
        self.termination_action, self.labels = action, extra
        self.call_timeout_s, self.operation_timeout_s = call_timeout_s, operation_timeout_s
        if offers:
            try:
                catalog = OfferList(offers_from_settings("gcp", offers, shapes.region_of,
                                                         where))
            except ValueError as e:
                raise ProviderConfigError(str(e)) from None
        self._clock = clock
        try:
            self._catalog, self._catalog_path = catalog_or_path(catalog, where)
        except ValueError as e:
            raise ProviderConfigError(str(e)) from None
        self._clients: tuple[Any, Any] | None = None

    # -- clients --------------------------------------------------------------------------

    def _credentials(self) -> Any:
        if self.anonymous:
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()
        if self.credentials_file:
            from google.oauth2 import service_account

            try:
                return service_account.Credentials.from_service_account_file(
                    self.credentials_file, scopes=[CLOUD_PLATFORM])
            except (OSError, ValueError) as e:
                raise Stop(self.name, f"credentials_file {self.credentials_file!r} cannot be "
                           f"read as a service-account key: {e}", code="credentials") from None
        return None  # Application Default Credentials, found by the client

    def clients(self) -> tuple[Any, Any]:
        """(InstancesClient, ZoneOperationsClient), both on the configured endpoint."""
        if self._clients is None:
            from google.api_core.client_options import ClientOptions

            opts = ClientOptions(api_endpoint=self.endpoint) if self.endpoint else None
            kw = {"credentials": self._credentials(), "transport": "rest",
                  "client_options": opts}
            try:
                self._clients = (self.compute.InstancesClient(**kw),
                                 self.compute.ZoneOperationsClient(**kw))
            except Exception as e:  # DefaultCredentialsError and the like
                raise Stop(self.name, f"cannot build a Compute client: {e}; "
                           f"{gcp_errors.AUTH_HINT}", code="credentials") from None
        return self._clients

    def _call(self, what: str, fn: Callable[..., Any], offer_id: str = "",
              **kw: Any) -> Any:
        """One SDK call with the configured timeout and no SDK retry, its failure sorted."""
        from google.api_core import exceptions as gexc
        from google.auth import exceptions as auth_exc

        try:
            return fn(retry=None, timeout=self.call_timeout_s, **kw)
        except (gexc.GoogleAPICallError, gexc.RetryError, auth_exc.TransportError,
                OSError) as e:  # requests' ConnectionError and Timeout are OSErrors
            raise gcp_errors.from_call(self.name, e, what, offer_id) from None
        except auth_exc.GoogleAuthError as e:  # refused credentials (401, then no refresh)
            raise Stop(self.name, f"{what}: credentials refused: {e}; {gcp_errors.AUTH_HINT}",
                       code="credentials", offer_id=offer_id) from None

    # -- offers ---------------------------------------------------------------------------

    def offers(self, request: Resources) -> list[Offer]:
        """The catalog's GCP offers in the configured zones (a region's offer, once per
        configured zone of the region)."""
        if self._catalog is None:
            self._catalog = default_catalog(self.name, self._catalog_path)
        offers = in_zones(self._catalog.offers("gcp", request), self.zones, self.region_of,
                          self.name)
        return [o for o in offers if not request.regions or o.region in request.regions]

    # -- launch ---------------------------------------------------------------------------

    def _zone_for(self, offer: Offer) -> str:
        if offer.zone:
            if offer.zone not in self.region_of:
                raise Stop(self.name, f"offer {offer.id}: zone {offer.zone} is not among the "
                           f"configured zones ({', '.join(self.zones)})", code="zone",
                           offer_id=offer.id)
            return offer.zone
        for zone in self.zones:
            if self.region_of[zone] == offer.region:
                return zone
        raise Stop(self.name, f"offer {offer.id}: no configured zone is in region "
                   f"{offer.region} (zones: {', '.join(self.zones)})", code="zone",
                   offer_id=offer.id)

    def body(self, offer: Offer, zone: str, name: str, request_id: str,
             user_data: str) -> Any:
        """The Instance resource for one machine of a launch."""
        c = self.compute
        spot = offer.market is Market.SPOT
        machine_type, named_acc, named_count = shapes.split_type(offer.instance_type)
        try:
            acc = shapes.accelerator_for(machine_type, offer.gpu_model, named_acc or str(
                offer.extra.get("accelerator_type", "")))
        except ValueError as e:
            raise Stop(self.name, f"offer {offer.id}: {e}", code="accelerator",
                       offer_id=offer.id) from None
        scheduling = c.Scheduling(
            provisioning_model="SPOT" if spot else "STANDARD",
            on_host_maintenance="TERMINATE",  # GPU machines cannot live-migrate
            automatic_restart=not spot)
        if spot:
            scheduling.instance_termination_action = self.termination_action
        nic = c.NetworkInterface(network=self.network)
        if self.subnetwork:
            nic.subnetwork = self.subnetwork
        if self.public_ip:
            nic.access_configs = [c.AccessConfig(name="external", type_="ONE_TO_ONE_NAT")]
        disk = c.AttachedDisk(boot=True, auto_delete=True, initialize_params=(
            c.AttachedDiskInitializeParams(
                source_image=self.image, disk_size_gb=self.disk_size_gb,
                disk_type=f"zones/{zone}/diskTypes/{self.disk_type}")))
        labels = {**self.labels, CLUSTER_TAG: self.cluster, REQUEST_TAG: request_id,
                  "spillway-market": str(offer.market)}
        items = {"startup-script": user_data, OFFER_TAG: offer.id, REQUEST_TAG: request_id}
        inst = c.Instance(
            name=name, machine_type=f"zones/{zone}/machineTypes/{machine_type}",
            labels=labels, scheduling=scheduling, disks=[disk], network_interfaces=[nic],
            metadata=c.Metadata(items=[c.Items(key=k, value=v) for k, v in items.items()]))
        if acc is not None:
            inst.guest_accelerators = [c.AcceleratorConfig(
                accelerator_type=f"zones/{zone}/acceleratorTypes/{acc}",
                accelerator_count=named_count or offer.gpu_count)]
        if self.service_account:
            inst.service_accounts = [c.ServiceAccount(email=self.service_account,
                                                      scopes=[CLOUD_PLATFORM])]
        return inst

    def launch(self, offer: Offer, count: int, request_id: str,
               user_data: str) -> list[CloudMachine]:
        """Start ``count`` machines of ``offer`` (or find the ones this request started).

        On a FailOver or Stop the machines this request has in the zone are deleted (best
        effort; the reconciler reaps what is left), so a failed launch leaves nothing billed;
        on a Retry they stay, and the repeated launch finds them by name."""
        check_label(request_id, "request id")
        if count < 1:
            raise Stop(self.name, f"launch count {count} must be >= 1", code="count")
        zone = self._zone_for(offer)
        names = [shapes.instance_name(self.cluster, request_id, zone, i) for i in range(count)]
        try:
            pending = [(n, self._insert(offer, zone, n, request_id, user_data)) for n in names]
            for n, op in pending:
                if op is not None:
                    self._await(op, zone, f"insert {zone}/{n}", offer.id)
            return [self._read(zone, n, offer.id) for n in names]
        except ProviderError as e:
            if e.action != "retry":
                self._delete_quietly(zone, names)
            raise

    def _insert(self, offer: Offer, zone: str, name: str, request_id: str,
                user_data: str) -> Any:
        """Send the insert; None when the machine already exists (a repeated launch)."""
        ic, _ = self.clients()
        body = self.body(offer, zone, name, request_id, user_data)
        try:
            return self._call(f"insert {zone}/{name}", ic.insert_unary, offer.id,
                              request=self.compute.InsertInstanceRequest(
                                  project=self.project, zone=zone, instance_resource=body,
                                  request_id=shapes.insert_request_id(name, self.project)))
        except ProviderError as e:
            if e.code != "409":  # 409 alreadyExists: the name is taken
                raise
            return None  # the name exists: _read checks it is ours

    def _await(self, op: Any, zone: str, what: str, offer_id: str = "") -> None:
        """Wait for a zone operation to be DONE (the ``wait`` call returns early on a real
        endpoint, so it is called until DONE or the deadline); raise its error, if any."""
        _, oc = self.clients()
        done = self.compute.Operation.Status.DONE
        deadline = self._clock() + self.operation_timeout_s
        while op.status != done:
            if self._clock() >= deadline:
                raise Stop(self.name, f"{what}: operation {op.name} not done after "
                           f"{self.operation_timeout_s:g} s", code="operation-timeout",
                           offer_id=offer_id)
            op = self._call(f"{what}: wait for {op.name}", oc.wait, offer_id,
                            project=self.project, zone=zone, operation=op.name)
        if "error" in op and list(op.error.errors):
            raise gcp_errors.from_operation(self.name, op, what, offer_id)

    def _read(self, zone: str, name: str, offer_id: str) -> CloudMachine:
        ic, _ = self.clients()
        inst = self._call(f"get {zone}/{name}", ic.get, offer_id, project=self.project,
                          zone=zone, instance=name)
        owner = dict(inst.labels).get(CLUSTER_TAG, "")
        if owner != self.cluster:
            raise Stop(self.name, f"instance {zone}/{name} exists but belongs to cluster "
                       f"{owner or '(none)'}, not {self.cluster}; rename one cluster",
                       code="name-taken", offer_id=offer_id)
        return self.machine(inst)

    # -- terminate and list ---------------------------------------------------------------

    def terminate(self, provider_ids: Sequence[str]) -> None:
        """Delete machines by name (or ``zone/name``); unknown names are not an error."""
        if not provider_ids:
            return
        zones = {m.provider_id: m.zone for m in self.instances().values()}
        errors: list[ProviderError] = []
        for pid in provider_ids:
            zone, _, name = pid.rpartition("/")
            zone = zone or zones.get(name, "")
            if zone:
                try:
                    self._delete(zone, name)
                except ProviderError as e:
                    errors.append(e)
        if errors:
            raise errors[0]

    def _delete(self, zone: str, name: str) -> None:
        ic, _ = self.clients()
        try:
            op = self._call(f"delete {zone}/{name}", ic.delete_unary, project=self.project,
                            zone=zone, instance=name)
        except ProviderError as e:
            if e.code == "404":  # already gone
                return
            raise
        self._await(op, zone, f"delete {zone}/{name}")

    def _delete_quietly(self, zone: str, names: Sequence[str]) -> None:
        """Delete the machines of a failed launch that are this cluster's (a name can be
        another cluster's: that is why it failed). What fails here, the reconciler finds by
        its label and reaps."""
        ic, _ = self.clients()
        for name in names:
            with contextlib.suppress(ProviderError):
                inst = self._call(f"get {zone}/{name}", ic.get, project=self.project,
                                  zone=zone, instance=name)
                if dict(inst.labels).get(CLUSTER_TAG) == self.cluster:
                    self._delete(zone, name)

    def instances(self) -> dict[str, CloudMachine]:
        """Every machine in the project labelled with this cluster, by name."""
        ic, _ = self.clients()
        pages = self._call("list instances", ic.aggregated_list, request={
            "project": self.project, "filter": f"labels.{CLUSTER_TAG} = {self.cluster}"})
        out: dict[str, CloudMachine] = {}
        from google.api_core import exceptions as gexc

        try:
            for _scope, scoped in pages:  # later pages are fetched while iterating
                for inst in scoped.instances:
                    if dict(inst.labels).get(CLUSTER_TAG) == self.cluster:
                        machine = self.machine(inst)
                        out[machine.provider_id] = machine
        except (gexc.GoogleAPICallError, OSError) as e:
            raise gcp_errors.from_call(self.name, e, "list instances") from None
        return out

    def machine(self, inst: Any) -> CloudMachine:
        """A CloudMachine from a GCE Instance."""
        labels = dict(inst.labels)
        meta = {i.key: i.value for i in inst.metadata.items}
        status = str(inst.status)
        zone = shapes.last_part(inst.zone)
        ips = [n.network_i_p for n in inst.network_interfaces if n.network_i_p]
        kind = shapes.last_part(inst.machine_type)
        for acc in inst.guest_accelerators:  # the catalog's name for an N1 type with GPUs
            kind = f"{kind}+{shapes.last_part(acc.accelerator_type)}x{acc.accelerator_count}"
        return CloudMachine(
            provider_id=inst.name, request_id=labels.get(REQUEST_TAG, ""),
            state=shapes.NATIVE_STATES.get(status, InstanceState.BOOTING),
            instance_type=kind, zone=zone,
            market=shapes.market_of(inst.scheduling.provisioning_model,
                                    inst.scheduling.preemptible),
            launched_at=shapes.parse_time(inst.creation_timestamp), native_state=status,
            extra={"id": str(inst.id), "zone": zone, "offer_id": meta.get(OFFER_TAG, ""),
                   "internal_ip": ips[0] if ips else "", "labels": labels})
