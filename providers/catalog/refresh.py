"""Write a refreshed catalog: the rows a refresher read replace the base catalog's rows of that
provider in the regions it covered; every other row, and the spot history of everything else,
is kept. ``spillway catalog refresh`` calls :func:`refresh`; the refreshers themselves are
:mod:`providers.catalog.refresh_aws` and :mod:`providers.catalog.refresh_gcp`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from providers.catalog.catalog import Catalog, forget_cached, spot_file
from providers.catalog.refresh_aws import (
    TYPE_PATTERNS,
    Quote,
    Refreshed,
    read_price_file,
    refresh_aws,
)
from providers.catalog.refresh_gcp import PRICES, read_gcp_prices, refresh_gcp
from providers.catalog.rows import write_rows
from providers.catalog.spot import write_series

REFRESHERS = ("aws", "gcp")


@dataclass(frozen=True)
class Written:
    path: Path
    spot_path: Path
    fresh: int  # rows the refresher read
    kept: int  # rows kept from the base catalog
    regions: tuple[str, ...]
    skipped: dict[str, int]


def known_prices(base: Catalog, provider: str) -> dict[tuple[str, str], Quote]:
    """The on-demand prices the catalog knows for ``provider``, with their source and date
    (the AWS refresher's prices when no price file is given)."""
    return {(r.instance_type, r.region): Quote(r.ondemand_price, r.source, r.fetched_at)
            for r in base.rows if r.provider == provider and r.ondemand_price is not None}


def merge(base: Catalog, fresh: Refreshed, regions: Sequence[str], out: Path) -> Written:
    """Write ``out`` (and its spot history): ``fresh`` in place of the base rows of its
    provider in ``regions`` (and in every region it read)."""
    covered = set(regions) | {r.region for r in fresh.rows}
    kept = [r for r in base.rows if r.provider != fresh.provider or r.region not in covered]
    points = [(s.provider, s.region, s.zone, s.instance_type, _iso(t), p)
              for s in base.spot_series()
              if s.provider != fresh.provider or s.region not in covered
              for t, p in zip(s.times, s.prices)]
    path = write_rows(out, [*kept, *fresh.rows])
    spot = write_series(spot_file(out), [*points, *fresh.spot])
    forget_cached(out)
    return Written(path, spot, len(fresh.rows), len(kept), tuple(sorted(covered)),
                   dict(fresh.skipped))


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def refresh(provider: str, base: Catalog, out: str | os.PathLike[str], now: datetime,
            regions: Sequence[str] = (), prices: str | os.PathLike[str] | None = None,
            endpoint: str | None = None, project: str = "", spot_days: float = 7.0,
            session: Any = None, credentials: Any = None,
            types: Sequence[str] = ()) -> Written:
    """Read ``provider``'s API and write the merged catalog to ``out``. AWS needs
    ``regions``; GCP needs ``project``; ``types``: AWS instance-type patterns (default g*, p*).
    ValueError naming the option for a bad call."""
    if provider == "aws":
        if not regions:
            raise ValueError("regions: name at least one AWS region (--region us-east-1)")
        table = read_price_file(prices) if prices else known_prices(base, "aws")
        fresh = refresh_aws(regions, table, now, spot_days, endpoint, session,
                            tuple(types) or TYPE_PATTERNS)
    elif provider == "gcp":
        if not project:
            raise ValueError("project: name the GCP project whose zones to list (--project)")
        fresh = refresh_gcp(project, read_gcp_prices(prices or PRICES), now, regions,
                            endpoint, credentials)
    else:
        raise ValueError(f"provider: {provider!r} has no refresher; use one of "
                         f"{', '.join(REFRESHERS)}")
    return merge(base, fresh, regions, Path(out))
