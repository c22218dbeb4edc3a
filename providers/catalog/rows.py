"""One catalog row, and the catalog file format: read, check and write.

The file is CSV, UTF-8, with one comment line first naming the format and its version
(``#spillway-catalog 1``) and then a header with :data:`COLUMNS`. A row is one instance type in
one region, or in one zone where the prices are zonal; ``ondemand_price`` and ``spot_price``
are dollars per hour for the whole instance, empty where that market is not offered there.
``extra`` is a JSON object of provider details (for GCP: ``machine_type``,
``accelerator_type``, ``accelerator_count``). docs/catalog.md describes every column.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from broker.model.gpus import KNOWN_MODELS

FORMAT = "#spillway-catalog 1"
COLUMNS = ("provider", "region", "zone", "instance_type", "gpu_model", "gpu_count",
           "gpu_memory_gb", "vcpus", "memory_gb", "ondemand_price", "spot_price",
           "carbon_zone", "source", "fetched_at", "extra")


class CatalogError(ValueError):
    """A catalog file is missing or malformed; the message names the file, line and column."""


@dataclass(frozen=True)
class CatalogRow:
    provider: str
    region: str
    zone: str  # "" where the prices hold in every zone of the region
    instance_type: str
    gpu_model: str  # canonical (broker.model.gpus.KNOWN_MODELS)
    gpu_count: int
    gpu_memory_gb: float  # per GPU
    vcpus: float
    memory_gb: float
    ondemand_price: float | None  # $/h for the instance; None: not offered on demand here
    spot_price: float | None  # $/h; None: no spot price known here
    carbon_zone: str = ""
    source: str = ""
    fetched_at: str = ""  # ISO 8601 date or time the prices were read
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        where = f"{self.provider}:{self.zone or self.region}/{self.instance_type}"
        for name in ("provider", "region", "instance_type"):
            if not getattr(self, name):
                raise ValueError(f"{where}: {name} must not be empty")
        if self.gpu_model not in KNOWN_MODELS:
            raise ValueError(f"{where}: gpu_model {self.gpu_model!r} is not one of "
                             f"{', '.join(KNOWN_MODELS)}")
        if isinstance(self.gpu_count, bool) or self.gpu_count < 1:
            raise ValueError(f"{where}: gpu_count {self.gpu_count!r} must be >= 1")
        for name in ("gpu_memory_gb", "vcpus", "memory_gb", "ondemand_price", "spot_price"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise ValueError(f"{where}: {name} {value!r} must be a number >= 0")
        if self.ondemand_price is None and self.spot_price is None:
            raise ValueError(f"{where}: needs an ondemand_price or a spot_price")
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    def to_csv(self) -> list[str]:
        def num(v: float | None) -> str:
            return "" if v is None else f"{v:.6g}"
        return [self.provider, self.region, self.zone, self.instance_type, self.gpu_model,
                str(self.gpu_count), num(self.gpu_memory_gb), num(self.vcpus),
                num(self.memory_gb), num(self.ondemand_price), num(self.spot_price),
                self.carbon_zone, self.source, self.fetched_at,
                json.dumps(dict(self.extra), sort_keys=True, separators=(",", ":"))
                if self.extra else ""]


def _number(raw: str, column: str, optional: bool) -> float | None:
    text = raw.strip()
    if not text:
        if optional:
            return None
        raise ValueError(f"column {column}: is empty; a number is required")
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"column {column}: {raw!r} is not a number") from None


def row_from_csv(record: Mapping[str, str]) -> CatalogRow:
    """A CatalogRow from one CSV record; ValueError naming the column that is wrong."""
    nums = {c: _number(record[c], c, c in ("ondemand_price", "spot_price"))
            for c in ("gpu_count", "gpu_memory_gb", "vcpus", "memory_gb", "ondemand_price",
                      "spot_price")}
    count = nums.pop("gpu_count")
    if count is None or count != int(count):
        raise ValueError(f"column gpu_count: {record['gpu_count']!r} is not a whole number")
    extra_text = record["extra"].strip()
    try:
        extra = json.loads(extra_text) if extra_text else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"column extra: not a JSON object ({e.msg})") from None
    if not isinstance(extra, dict):
        raise ValueError("column extra: not a JSON object")
    return CatalogRow(
        provider=record["provider"].strip(), region=record["region"].strip(),
        zone=record["zone"].strip(), instance_type=record["instance_type"].strip(),
        gpu_model=record["gpu_model"].strip(), gpu_count=int(count),
        gpu_memory_gb=float(nums["gpu_memory_gb"] or 0), vcpus=float(nums["vcpus"] or 0),
        memory_gb=float(nums["memory_gb"] or 0), ondemand_price=nums["ondemand_price"],
        spot_price=nums["spot_price"], carbon_zone=record["carbon_zone"].strip(),
        source=record["source"].strip(), fetched_at=record["fetched_at"].strip(), extra=extra)


def read_rows(path: str | os.PathLike[str]) -> list[CatalogRow]:
    """Every row of a catalog file; CatalogError naming the file, line and problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise CatalogError(f"cannot read offer catalog {p}: {e.strerror}") from None
    first, _, body = text.partition("\n")
    if first.strip() != FORMAT:
        raise CatalogError(f"{p}: not a Spillway offer catalog (its first line must be "
                           f"{FORMAT!r}); build one with `spillway catalog refresh`")
    reader = csv.DictReader(io.StringIO(body))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise CatalogError(f"{p}: header lacks column(s) {', '.join(missing)}; expected "
                           f"{','.join(COLUMNS)}")
    rows = []
    for record in reader:
        try:
            rows.append(row_from_csv(record))
        except ValueError as e:
            raise CatalogError(f"{p} line {reader.line_num + 1}: {e}") from None
    return rows


def write_rows(path: str | os.PathLike[str], rows: Iterable[CatalogRow]) -> Path:
    """Write ``rows`` as a catalog file (sorted, so rebuilds diff cleanly), atomically."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    ordered = sorted(rows, key=lambda r: (r.provider, r.region, r.zone, r.instance_type))
    buf = io.StringIO()
    buf.write(FORMAT + "\n")
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(r.to_csv() for r in ordered)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(buf.getvalue(), encoding="utf-8")
    tmp.replace(p)
    return p
