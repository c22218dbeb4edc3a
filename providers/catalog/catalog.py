"""The offer catalog: what each cloud rents, where, and at what price, read from data files.

Scoring reads the catalog, never a cloud API (DESIGN.md, convention 4). :func:`load_catalog`
reads a catalog file (default: the one shipped in ``providers/catalog/data``) once per path;
:meth:`Catalog.offers` turns its rows into :class:`~broker.model.Offer` for a request and
:meth:`Catalog.cheapest` ranks them by the price of a unit of work.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from broker.model.cloud import Market, Offer
from broker.model.gpus import type_matches
from broker.model.speed import speed_of
from providers.base import Resources
from providers.catalog.rows import CatalogRow, read_rows
from providers.catalog.spot import (
    InterruptionEstimate,
    SpotSeries,
    SpotTrace,
    interruption_rate,
    read_series,
)

DATA_DIR = Path(__file__).resolve().parent / "data"
SHIPPED = DATA_DIR / "catalog.csv"


def spot_file(catalog_path: str | os.PathLike[str]) -> Path:
    """The spot history file that goes with a catalog file: ``X.csv`` -> ``X.spot.csv.gz``."""
    p = Path(catalog_path)
    return p.with_name(p.name.removesuffix(".csv") + ".spot.csv.gz")


def _row_offers(row: CatalogRow) -> Iterable[Offer]:
    extra = {"vcpus": row.vcpus, "memory_gb": row.memory_gb, "source": row.source,
             "fetched_at": row.fetched_at, **row.extra}
    for market, price in ((Market.ONDEMAND, row.ondemand_price), (Market.SPOT, row.spot_price)):
        if price is not None:
            yield Offer(row.provider, row.region, row.zone, row.instance_type, row.gpu_model,
                        row.gpu_count, row.gpu_memory_gb, market, price, row.carbon_zone,
                        extra)


def fits(row: CatalogRow, request: Resources) -> bool:
    """Whether one machine of this row holds the request (market aside)."""
    return (row.gpu_count >= request.gpu_count
            and (request.gpu_model is None or type_matches(row.gpu_model, request.gpu_model))
            and row.gpu_memory_gb >= request.min_gpu_memory_gb
            and row.vcpus >= request.cpus and row.memory_gb >= request.memory_gb
            and (not request.regions or row.region in request.regions))


def work_price(offer: Offer, gpus: int | None = None,
               speed: Callable[[str], float] = speed_of) -> float:
    """Dollars per V100-hour of work when ``gpus`` of the offer's GPUs work (default: all of
    them): the price per GPU-hour divided by the model's speed when every GPU works."""
    used = offer.gpu_count if gpus is None else min(max(gpus, 1), offer.gpu_count)
    return offer.price_per_hour / (used * speed(offer.gpu_model))


@dataclass(frozen=True)
class Catalog:
    """Catalog rows, and the spot price history that came with them."""

    rows: tuple[CatalogRow, ...]
    path: Path | None = None
    spot_path: Path | None = None
    _series: dict[tuple[str, str, str], SpotSeries] = field(
        default_factory=dict, compare=False, repr=False)

    @property
    def providers(self) -> tuple[str, ...]:
        return tuple(sorted({r.provider for r in self.rows}))

    @property
    def gpu_models(self) -> tuple[str, ...]:
        return tuple(sorted({r.gpu_model for r in self.rows}))

    def offers(self, provider: str, request: Resources) -> list[Offer]:
        """Every offer of ``provider`` one machine of which holds ``request``: one per
        (instance type, region, zone where prices are zonal, market), in catalog order."""
        out = []
        for row in self.rows:
            if row.provider == provider and fits(row, request):
                out += [o for o in _row_offers(row)
                        if request.market is None or o.market is request.market]
        return out

    def cheapest(self, request: Resources, providers: Sequence[str] | None = None,
                 speed: Callable[[str], float] = speed_of) -> list[Offer]:
        """The offers of ``providers`` (default: all) for ``request``, cheapest unit of work
        first: the instance's price over the request's GPUs times the model's speed (for an
        instance with exactly the GPUs asked for, its price per GPU-hour over the speed), then
        the price per GPU-hour, then the offer id. Deterministic."""
        names = self.providers if providers is None else tuple(providers)
        offers = [o for p in names for o in self.offers(p, request)]
        return sorted(offers, key=lambda o: (work_price(o, request.gpu_count, speed),
                                             o.price_per_gpu_hour / speed(o.gpu_model), o.id))

    # -- spot markets ---------------------------------------------------------------------------

    def _spot(self) -> dict[tuple[str, str, str], SpotSeries]:
        if not self._series and self.spot_path is not None and self.spot_path.exists():
            self._series.update(read_series(self.spot_path))
        return self._series

    def spot_series(self, provider: str | None = None) -> list[SpotSeries]:
        """Every spot price series (of one provider), sorted by provider, zone and type."""
        return [s for k, s in sorted(self._spot().items())
                if provider is None or s.provider == provider]

    def spot_history(self, provider: str, zone: str, instance_type: str) -> SpotSeries | None:
        """The spot price series of one instance type in one zone; None if the catalog has
        none (GCP's preemptible prices are fixed: no history)."""
        return self._spot().get((provider, zone, instance_type))

    def interruption_rate(self, offer: Offer,
                          traces: Sequence[SpotTrace]) -> InterruptionEstimate:
        """Interruptions per hour for a spot offer, from availability traces
        (:func:`providers.catalog.spot.load_traces`); on-demand offers: 0."""
        if offer.market is not Market.SPOT:
            return InterruptionEstimate(0.0, "ondemand", 0)
        return interruption_rate(traces, offer.provider, offer.zone, offer.instance_type)

    def with_interruption_rates(self, offers: Iterable[Offer],
                                traces: Sequence[SpotTrace]) -> list[Offer]:
        """``offers`` with ``extra["interruption_rate_per_hour"]`` and
        ``extra["interruption_basis"]`` set on the spot ones (the burst policy's cost model,
        policies/burst/offers.py, reads the rate from there)."""
        out = []
        for o in offers:
            if o.market is Market.SPOT:
                est = self.interruption_rate(o, traces)
                o = replace(o, extra={**o.extra, "interruption_rate_per_hour": est.rate_per_hour,
                                      "interruption_basis": est.basis})
            out.append(o)
        return out


_CACHE: dict[Path, Catalog] = {}
_LOCK = threading.Lock()


def load_catalog(path: str | os.PathLike[str] | None = None) -> Catalog:
    """The catalog in ``path`` (None: the shipped one), read once per path and cached.
    Raises :class:`~providers.catalog.rows.CatalogError` naming the file and line."""
    p = (Path(path).expanduser() if path else SHIPPED).resolve()
    with _LOCK:
        cached = _CACHE.get(p)
        if cached is None:
            cached = Catalog(tuple(read_rows(p)), p, spot_file(p))
            _CACHE[p] = cached
    return cached


def forget_cached(path: str | os.PathLike[str] | None = None) -> None:
    """Drop a cached catalog (after a refresh rewrote its file); None: drop all."""
    with _LOCK:
        if path is None:
            _CACHE.clear()
        else:
            _CACHE.pop(Path(path).expanduser().resolve(), None)
