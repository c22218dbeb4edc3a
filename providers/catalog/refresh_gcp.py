"""Rebuild the GCP part of the catalog from Compute Engine's own API and a price file.

- What exists where: ``acceleratorTypes.aggregatedList`` (each zone's GPU types and the most
  cards one VM may hold) and ``machineTypes.aggregatedList`` (each zone's machine types, their
  vCPUs and memory), through google-cloud-compute (the ``gcp`` extra) on the REST transport,
  on any endpoint (a fake one in tests).
- Prices: GCP's Cloud Billing Catalog API lists SKUs by description, not by machine type, so
  prices come from a JSON price file instead: per region, each accelerator's on-demand and spot
  price per GPU-hour, and each host family's price per vCPU-hour and per GB-hour. The shipped
  ``data/gcp_prices.json`` is built with the catalog (the SkyPilot GCP snapshot and
  ``gcp_hosts.py``); write your own in the same shape for current prices::

      {"fetched_at": "2022-06-24", "source": "...",
       "accelerators": {"us-central1": {"nvidia-tesla-t4": {"ondemand": 0.35, "spot": 0.11}}},
       "hosts": {"us-central1": {"n1": {"ondemand": [0.031611, 0.004237],
                                        "spot": [0.006655, 0.000892]}}}}

An offer is a host (gcp_hosts.host_for) with 1, 2, 4, 8 (or 16) GPUs, where the zone lists both
the accelerator (with enough cards) and the host machine type.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from broker.model.gpus import memory_of
from providers.base import require
from providers.catalog import gcp_hosts
from providers.catalog.refresh_aws import PriceFileError, Refreshed
from providers.catalog.rows import CatalogRow
from providers.catalog.zones import carbon_zone

PRICES = Path(__file__).resolve().parent / "data" / "gcp_prices.json"
COUNTS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class GcpPrices:
    accelerators: Mapping[str, Mapping[str, Mapping[str, float]]]  # region -> acc -> market
    hosts: Mapping[str, Mapping[str, Mapping[str, list[float]]]]  # region -> family -> market
    fetched_at: str = ""
    source: str = ""

    def price(self, region: str, accelerator: str, host: gcp_hosts.Host, count: int,
              market: str) -> float | None:
        gpu = self.accelerators.get(region, {}).get(accelerator, {}).get(market)
        rates = self.hosts.get(region, {}).get(host.family, {}).get(market)
        if gpu is None or rates is None:
            return None
        return round(gpu * count + host.vcpus * rates[0] + host.memory_gb * rates[1], 6)

    def to_json(self) -> str:
        return json.dumps({"fetched_at": self.fetched_at, "source": self.source,
                           "accelerators": self.accelerators, "hosts": self.hosts},
                          indent=1, sort_keys=True) + "\n"


def read_gcp_prices(path: str | os.PathLike[str] = PRICES) -> GcpPrices:
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise PriceFileError(f"cannot read price file {p}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise PriceFileError(f"{p}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(doc, dict) or not {"accelerators", "hosts"} <= set(doc):
        raise PriceFileError(f"{p}: needs the keys 'accelerators' and 'hosts' (see "
                             "providers/catalog/refresh_gcp.py)")
    return GcpPrices(doc["accelerators"], doc["hosts"], str(doc.get("fetched_at", "")),
                     str(doc.get("source", "")))


def _scoped(pages: Iterable[tuple[str, Any]], attr: str) -> dict[str, list[Any]]:
    """{zone: items} from an aggregated list's (``zones/<zone>``, scoped list) pairs."""
    out: dict[str, list[Any]] = {}
    for scope, scoped in pages:
        items = list(getattr(scoped, attr, ()))
        if scope.startswith("zones/") and items:
            out.setdefault(scope.removeprefix("zones/"), []).extend(items)
    return out


def _listings(project: str, endpoint: str | None, credentials: Any
              ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    compute = require("google.cloud.compute_v1", "gcp", "gcp")
    from google.api_core.client_options import ClientOptions

    kw = {"credentials": credentials, "transport": "rest",
          "client_options": ClientOptions(api_endpoint=endpoint) if endpoint else None}
    accs = compute.AcceleratorTypesClient(**kw).aggregated_list(project=project)
    machines = compute.MachineTypesClient(**kw).aggregated_list(project=project)
    return _scoped(accs, "accelerator_types"), _scoped(machines, "machine_types")


def _zone_rows(zone: str, accs: list[Any], machines: Mapping[str, Any], prices: GcpPrices,
               skipped: Counter[str]) -> list[CatalogRow]:
    region = zone.rsplit("-", 1)[0]
    rows = []
    for acc in accs:
        if acc.name not in gcp_hosts.ACCELERATORS:
            skipped[acc.name] += 1
            continue
        model = gcp_hosts.ACCELERATORS[acc.name][0]
        for count in (c for c in COUNTS if c <= acc.maximum_cards_per_instance):
            host = gcp_hosts.host_for(acc.name, count)
            mt = None if host is None else machines.get(host.machine_type)
            if host is None or mt is None:
                continue  # a count with no shape, or a host the zone does not offer
            on, spot = (prices.price(region, acc.name, host, count, m)
                        for m in ("ondemand", "spot"))
            if on is None and spot is None:
                skipped[f"{acc.name} in {region} (no price)"] += 1
                continue
            rows.append(CatalogRow(
                "gcp", region, zone, gcp_hosts.instance_type(host, acc.name, count), model,
                count, float(memory_of(model)), float(mt.guest_cpus), mt.memory_mb / 1024, on,
                spot, carbon_zone("gcp", region), "gcp compute API + price file",
                prices.fetched_at or "",
                {"machine_type": host.machine_type, "accelerator_type": acc.name,
                 "accelerator_count": count}))
    return rows


def refresh_gcp(project: str, prices: GcpPrices, now: datetime, regions: Iterable[str] = (),
                endpoint: str | None = None, credentials: Any = None) -> Refreshed:
    """Rows for every GPU offer in the project's zones (only ``regions`` if given).
    ``endpoint``: another Compute endpoint (a fake one in tests); ``credentials``: google-auth
    credentials (default: Application Default Credentials)."""
    accs, machines = _listings(project, endpoint, credentials)
    fetched = now.astimezone(timezone.utc).strftime("%Y-%m-%d")
    priced = GcpPrices(prices.accelerators, prices.hosts, prices.fetched_at or fetched,
                       prices.source)
    out = Refreshed("gcp", [], [])
    wanted = set(regions)
    for zone in sorted(accs):
        if wanted and zone.rsplit("-", 1)[0] not in wanted:
            continue
        by_name = {m.name: m for m in machines.get(zone, ())}
        out.rows += _zone_rows(zone, accs[zone], by_name, priced, out.skipped)
    return out
