"""Rebuild the AWS part of the catalog from EC2's own API.

- Instance types, GPUs, vCPUs and memory: ``DescribeInstanceTypes`` (every ``g*`` and ``p*``
  type with ``GpuInfo``, or other patterns), in each region asked for.
- Spot prices: ``DescribeSpotPriceHistory`` for those types (Linux/UNIX) over the last
  ``spot_days``: the series goes to the spot history file, and the last price per zone is the
  zone's spot price.
- On-demand prices: EC2 does not list them. They come from a price file (CSV with columns
  ``instance_type,region,price[,fetched_at]``, dollars per hour; the AWS Price List API or its
  bulk files give these numbers) or, without one, from the current catalog's on-demand rows
  for the same type and region (keeping their source and date). A type with no on-demand price
  gets spot rows only.

boto3 is the ``aws`` extra, imported here only.
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from broker.model.gpus import GPU_FAMILIES, canonical_model, family_of, memory_of
from providers.base import require
from providers.catalog.rows import CatalogRow
from providers.catalog.zones import carbon_zone

SpotPoint = tuple[str, str, str, str, str, float]  # provider, region, zone, type, ISO time, $

# EC2's NVIDIA GPU families are g* and p* (g4dn, g5, g6, g6e, p3, p4d, p5, ...); the others with
# accelerators (dl1, trn1, inf2, f1, vt1) hold no GPU Spillway schedules. DescribeInstanceTypes'
# ``instance-type`` filter takes these wildcards.
TYPE_PATTERNS = ("g*", "p*")


@dataclass(frozen=True)
class AwsType:
    instance_type: str
    gpu_model: str
    gpu_count: int
    vcpus: float
    memory_gb: float


@dataclass
class Refreshed:
    """What a refresher read: catalog rows, spot price changes, and what it left out."""

    provider: str
    rows: list[CatalogRow]
    spot: list[SpotPoint]
    skipped: Counter[str] = field(default_factory=Counter)


class PriceFileError(ValueError):
    """A price file is unreadable or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Quote:
    """An on-demand price, where it came from and its date (the row's source, fetched_at)."""

    price: float
    source: str
    fetched_at: str


def read_price_file(path: str | os.PathLike[str]) -> dict[tuple[str, str], Quote]:
    """``instance_type,region,price[,fetched_at]`` rows -> {(type, region): Quote}; a row
    without ``fetched_at`` is dated by the file's modification time."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        dated = datetime.fromtimestamp(p.stat().st_mtime, tz=timezone.utc).strftime("%Y-%m-%d")
    except OSError as e:
        raise PriceFileError(f"cannot read price file {p}: {e.strerror}") from None
    reader = csv.DictReader(text.splitlines())
    if not {"instance_type", "region", "price"} <= set(reader.fieldnames or ()):
        raise PriceFileError(f"{p}: needs the columns instance_type,region,price")
    out = {}
    for rec in reader:
        try:
            price = float(rec["price"])
        except ValueError:
            raise PriceFileError(f"{p} line {reader.line_num}: price {rec['price']!r} is not "
                                 "a number") from None
        when = (rec.get("fetched_at") or "").strip() or dated
        out[(rec["instance_type"].strip(), rec["region"].strip())] = Quote(
            price, f"aws price file {p.name}", when)
    return out


def _gpu_type(info: Mapping[str, Any], skipped: Counter[str]) -> AwsType | None:
    gpus = info["GpuInfo"]["Gpus"][0]
    model = canonical_model(str(gpus["Name"]), int(gpus["MemoryInfo"]["SizeInMiB"]))
    count = int(gpus.get("Count", 0))
    if family_of(model) not in GPU_FAMILIES or memory_of(model) == 0 or count < 1:
        skipped[f"{gpus['Name']} x{count}"] += 1
        return None
    return AwsType(info["InstanceType"], model, count, float(info["VCpuInfo"]["DefaultVCpus"]),
                   info["MemoryInfo"]["SizeInMiB"] / 1024)


def gpu_types(ec2: Any, skipped: Counter[str],
              patterns: Sequence[str] = TYPE_PATTERNS) -> dict[str, AwsType]:
    """Every GPU instance type matching ``patterns`` that the region offers and whose GPU
    Spillway knows."""
    out = {}
    pages = ec2.get_paginator("describe_instance_types").paginate(
        Filters=[{"Name": "instance-type", "Values": list(patterns)}])
    for page in pages:
        for info in page["InstanceTypes"]:
            if "GpuInfo" in info:
                t = _gpu_type(info, skipped)
                if t is not None:
                    out[t.instance_type] = t
    return out


def spot_points(ec2: Any, region: str, types: Iterable[str], since: datetime) -> list[SpotPoint]:
    """The spot price changes of ``types`` in ``region`` since ``since``."""
    names = sorted(types)
    out: list[SpotPoint] = []
    for i in range(0, len(names), 50):  # the API takes a bounded list of types per call
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=names[i:i + 50], StartTime=since,
            ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"])
        for page in pages:
            for rec in page["SpotPriceHistory"]:
                when = rec["Timestamp"].astimezone(timezone.utc)
                out.append(("aws", region, rec["AvailabilityZone"], rec["InstanceType"],
                            when.strftime("%Y-%m-%dT%H:%M:%SZ"), float(rec["SpotPrice"])))
    return out


def _rows(region: str, types: Mapping[str, AwsType], points: Sequence[SpotPoint],
          prices: Mapping[tuple[str, str], Quote]) -> list[CatalogRow]:
    def make(t: AwsType, zone: str, ondemand: float | None, spot: float | None,
             source: str, when: str) -> CatalogRow:
        return CatalogRow("aws", region, zone, t.instance_type, t.gpu_model, t.gpu_count,
                          float(memory_of(t.gpu_model)), t.vcpus, t.memory_gb, ondemand, spot,
                          carbon_zone("aws", region), source, when)

    quotes = {name: prices[(name, region)] for name in types if (name, region) in prices}
    rows = [make(types[name], "", q.price, None, q.source, q.fetched_at)
            for name, q in sorted(quotes.items())]
    last: dict[tuple[str, str], tuple[str, float]] = {}
    for _, _, zone, name, when, price in sorted(points):
        last[(zone, name)] = (when, price)
    rows += [make(types[name], zone, None, price, "aws DescribeSpotPriceHistory", when[:10])
             for (zone, name), (when, price) in sorted(last.items()) if name in types]
    return rows


def refresh_aws(regions: Sequence[str], prices: Mapping[tuple[str, str], Quote],
                now: datetime, spot_days: float = 7.0, endpoint_url: str | None = None,
                session: Any = None, patterns: Sequence[str] = TYPE_PATTERNS) -> Refreshed:
    """Rows for every GPU type in ``regions`` whose name matches ``patterns``: on demand where
    ``prices`` has a quote, spot per zone from the last ``spot_days`` of price history.
    ``endpoint_url``: another EC2 endpoint (moto in tests); ``session``: a boto3 Session
    (default: the environment's)."""
    boto3 = require("boto3", "aws", "aws")
    session = session or boto3.session.Session()
    out = Refreshed("aws", [], [])
    for region in regions:
        ec2 = session.client("ec2", region_name=region, endpoint_url=endpoint_url)
        types = gpu_types(ec2, out.skipped, patterns)
        points = spot_points(ec2, region, types, now - timedelta(days=spot_days))
        out.rows += _rows(region, types, points, prices)
        out.spot += points
        for name in sorted(types):
            if (name, region) not in prices and not any(p[3] == name for p in points):
                out.skipped[f"{name} in {region} (no price)"] += 1
    return out
