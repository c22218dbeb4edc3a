"""The offer catalog: GPU instance types, their prices per region, zone and market, the grid
zone each region draws from, and spot markets over time. See docs/catalog.md.

    from providers.catalog import load_catalog
    catalog = load_catalog()                       # the shipped catalog
    catalog.offers("aws", Resources(gpu_count=8, gpu_model="A100"))
    catalog.cheapest(Resources(gpu_count=1, market=Market.SPOT))
"""

from __future__ import annotations

from providers.catalog.catalog import (
    SHIPPED,
    Catalog,
    fits,
    forget_cached,
    load_catalog,
    spot_file,
    work_price,
)
from providers.catalog.rows import CatalogError, CatalogRow, read_rows, write_rows
from providers.catalog.spot import (
    DEFAULT_INTERRUPTION_RATE,
    InterruptionEstimate,
    SpotSeries,
    SpotTrace,
    interruption_rate,
    load_traces,
)
from providers.catalog.zones import ZONES, carbon_zone

__all__ = [
    "DEFAULT_INTERRUPTION_RATE",
    "SHIPPED",
    "ZONES",
    "Catalog",
    "CatalogError",
    "CatalogRow",
    "InterruptionEstimate",
    "SpotSeries",
    "SpotTrace",
    "carbon_zone",
    "fits",
    "forget_cached",
    "interruption_rate",
    "load_catalog",
    "load_traces",
    "read_rows",
    "spot_file",
    "work_price",
    "write_rows",
]
