"""Where a provider's offers come from: the offer catalog (``providers/catalog/``), read
through a small protocol so a provider can be given any catalog (tests give a short list).

Scoring reads the catalog, never a cloud API (DESIGN.md, convention 4): ``offers()`` of a
provider is the catalog's offers for its cloud, narrowed to the places it is configured for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

from broker.model.cloud import Offer
from broker.model.gpus import memory_of, type_matches
from providers.base import Resources, Stop


@runtime_checkable
class OfferCatalog(Protocol):
    def offers(self, provider: str, request: Resources) -> list[Offer]: ...


class OfferList:
    """A fixed list of offers as a catalog (tests, and clouds the catalog does not know)."""

    def __init__(self, offers: Iterable[Offer]) -> None:
        self._offers = tuple(offers)

    def offers(self, provider: str, request: Resources) -> list[Offer]:
        return [o for o in self._offers if o.provider == provider and fits(o, request)]


def fits(offer: Offer, request: Resources) -> bool:
    """The request's own terms: GPU model (family or exact), count, memory, market, regions."""
    if request.gpu_model and not type_matches(offer.gpu_model, request.gpu_model):
        return False
    if offer.gpu_count < request.gpu_count or offer.gpu_memory_gb < request.min_gpu_memory_gb:
        return False
    if request.market is not None and offer.market is not request.market:
        return False
    return not request.regions or offer.region in request.regions


def catalog_or_path(value: OfferCatalog | str | None,
                    where: str) -> tuple[OfferCatalog | None, str]:
    """A provider's ``catalog`` setting: a catalog file's path (configuration) or a catalog
    object (code, tests). ValueError naming the field for anything else."""
    if value is None or value == "":
        return None, ""
    if isinstance(value, str):
        return None, value
    if isinstance(value, OfferCatalog):
        return value, ""
    raise ValueError(f"{where}.catalog: {value!r} is not a catalog file's path")


def default_catalog(provider: str, path: str = "") -> OfferCatalog:
    """The catalog at ``path`` ("" for the shipped one, ``providers.catalog.load_catalog``),
    or Stop saying why it cannot be read."""
    try:
        module = importlib.import_module("providers.catalog")
        catalog: OfferCatalog = module.load_catalog(path or None)
    except (ImportError, OSError, ValueError) as e:
        raise Stop(provider, f"no offer catalog{' at ' + path if path else ''}: {e}",
                   code="no-catalog") from None
    return catalog


_OFFER_KEYS = {"region", "zone", "instance_type", "gpu_model", "gpu_count", "gpu_memory_gb",
               "market", "price_per_hour", "carbon_zone"}
_INVENTORY_KEYS = {"gpus", "cpus", "memory_gb", "accelerator_type"}  # go to Offer.extra


def offers_from_settings(kind: str, entries: Sequence[Mapping[str, Any]],
                         region_of: Callable[[str], str] | None, where: str) -> list[Offer]:
    """Offers written in the configuration (``offers: [{zone: ..., instance_type: ...}]``),
    for a cloud or an account the catalog does not know. ``gpus``, ``cpus``, ``memory_gb``
    (a machine's inventory for its agent, when it has no NVML) and ``accelerator_type`` go to
    the offer's extra. ValueError naming the entry and the field when one is wrong."""
    out: list[Offer] = []
    for i, entry in enumerate(entries):
        at = f"{where}.offers[{i}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{at}: must be a mapping of offer fields")
        unknown = set(entry) - _OFFER_KEYS - _INVENTORY_KEYS
        if unknown:
            raise ValueError(f"{at}: unknown field(s) {', '.join(sorted(unknown))}; allowed: "
                             f"{', '.join(sorted(_OFFER_KEYS | _INVENTORY_KEYS))}")
        fields = {k: v for k, v in entry.items() if k in _OFFER_KEYS}
        zone = str(fields.get("zone", ""))
        if "region" not in fields and zone and region_of is not None:
            fields["region"] = region_of(zone)
        for key in ("region", "instance_type", "gpu_model", "gpu_count", "market",
                    "price_per_hour"):
            if key not in fields:
                raise ValueError(f"{at}.{key}: missing")
        fields.setdefault("gpu_memory_gb", float(memory_of(str(fields["gpu_model"]))))
        try:
            out.append(Offer(provider=kind, **fields, extra={
                k: v for k, v in entry.items() if k in _INVENTORY_KEYS}))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{at}: {e}") from None
    return out


def in_zones(offers: Sequence[Offer], zones: Sequence[str], region_of: dict[str, str],
             name: str) -> list[Offer]:
    """Offers narrowed to ``zones``, relabelled with the provider's configured ``name``.

    A zone offer is kept when its zone is configured; a region offer (zone "") becomes one
    offer per configured zone of that region, since a machine is launched in one zone."""
    out: list[Offer] = []
    for offer in offers:
        if offer.zone:
            places = [offer.zone] if offer.zone in zones else []
        else:
            places = [z for z in zones if region_of[z] == offer.region]
        out.extend(replace(offer, provider=name, zone=z) for z in places)
    return out
