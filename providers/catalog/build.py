"""Build the shipped catalog from the public snapshots in the shared data folder.

    python -m providers.catalog.build --from ../shared/data [--out providers/catalog/data]

Reads ``cloud_gpu_catalog_skypilot_2021_2022/`` (AWS on-demand 2021-11, GCP GPU prices
2022-06; Apache-2.0) and ``spot_price_history_aws_azure_2020_trainingonadime/`` (AWS spot price
changes Dec 2019 - Mar 2020; MIT) and writes ``catalog.csv``, ``catalog.spot.csv.gz`` and
``gcp_prices.json`` (the GCP refresher's default prices). GPU
models Spillway does not know (K520, M60, Radeon, Gaudi, P4) are left out and counted. GCP
offers add the host VM's price (providers/catalog/gcp_hosts.py) to the GPUs'. The NOTICE.md
beside the output carries the attribution.
"""

from __future__ import annotations

import argparse
import ast
import csv
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.model.gpus import GPU_FAMILIES, canonical_model, family_of, memory_of
from providers.catalog import gcp_hosts
from providers.catalog.refresh_gcp import GcpPrices
from providers.catalog.rows import CatalogRow, write_rows
from providers.catalog.spot import write_series
from providers.catalog.zones import carbon_zone

SKYPILOT = "cloud_gpu_catalog_skypilot_2021_2022"
DIME = "spot_price_history_aws_azure_2020_trainingonadime"
AWS_SOURCE = "skypilot aws.csv@1b1eb32"
GCP_SOURCE = "skypilot gcp.csv@e47cd5c + GCP host list prices"
SPOT_SOURCE = "training_on_a_dime@85f6595"


@dataclass(frozen=True)
class Shape:
    gpu_model: str
    gpu_count: int
    vcpus: float
    memory_gb: float


@dataclass
class Built:
    rows: list[CatalogRow]
    spot: list[tuple[str, str, str, str, str, float]]
    skipped: Counter[str]
    gcp_prices: GcpPrices


def _aws_shape(rec: dict[str, str]) -> Shape | None:
    info: dict[str, Any] = ast.literal_eval(rec["gpu_info_raw"])  # a Python dict literal
    mib = int(info["Gpus"][0]["MemoryInfo"]["SizeInMiB"])
    model = canonical_model(rec["gpu_name"], mib)
    if family_of(model) not in GPU_FAMILIES or memory_of(model) == 0:
        return None
    return Shape(model, int(float(rec["gpu_count"])), float(rec["vcpus"]),
                 float(rec["memory_gib"]))


def _aws(folder: Path, skipped: Counter[str]) -> tuple[list[CatalogRow], dict[str, Shape]]:
    rows, shapes = [], {}
    with open(folder / "aws_gpu_ondemand_catalog_2021-11-10.csv", newline="") as f:
        for rec in csv.DictReader(f):
            shape = _aws_shape(rec)
            if shape is None:
                skipped[f"aws {rec['gpu_name']}"] += 1
                continue
            shapes[rec["instance_type"]] = shape
            rows.append(CatalogRow(
                "aws", rec["region"], "", rec["instance_type"], shape.gpu_model,
                shape.gpu_count, float(memory_of(shape.gpu_model)), shape.vcpus,
                shape.memory_gb, float(rec["on_demand_price_usd_per_hour"]), None,
                carbon_zone("aws", rec["region"]), AWS_SOURCE, "2021-11-10"))
    return rows, shapes


def _aws_spot(folder: Path, shapes: dict[str, Shape], skipped: Counter[str]
              ) -> tuple[list[CatalogRow], list[tuple[str, str, str, str, str, float]]]:
    points: list[tuple[str, str, str, str, str, float]] = []
    with open(folder / "aws_gpu_spot_price_history_2019-2020.csv", newline="") as f:
        for rec in csv.DictReader(f):
            if rec["instance_type"] not in shapes:
                skipped[f"aws spot {rec['instance_type']}"] += 1
                continue
            stamp = rec["timestamp_utc"].replace(".000Z", "Z")
            points.append(("aws", rec["region"], rec["availability_zone"],
                           rec["instance_type"], stamp, float(rec["spot_price_usd_per_hour"])))
    last: dict[tuple[str, str, str], tuple[str, float]] = {}
    for _, region, zone, itype, stamp, price in sorted(points):
        last[(region, zone, itype)] = (stamp, price)  # the price in force at the end
    rows = []
    for (region, zone, itype), (stamp, price) in sorted(last.items()):
        s = shapes[itype]
        rows.append(CatalogRow("aws", region, zone, itype, s.gpu_model, s.gpu_count,
                               float(memory_of(s.gpu_model)), s.vcpus, s.memory_gb, None, price,
                               carbon_zone("aws", region), SPOT_SOURCE, stamp[:10]))
    return rows, points


def _gcp(folder: Path, skipped: Counter[str]) -> list[CatalogRow]:
    rows: dict[tuple[str, str], CatalogRow] = {}
    with open(folder / "gcp_gpu_tpu_catalog_2022-06-24.csv", newline="") as f:
        for rec in csv.DictReader(f):
            accel = gcp_hosts.BY_NAME.get(rec["AcceleratorName"])
            count = int(float(rec["AcceleratorCount"]))
            host = None if accel is None else gcp_hosts.host_for(accel, count)
            region, zone = rec["Region"], rec["AvailabilityZone"]
            if accel is None or host is None:
                skipped[f"gcp {rec['AcceleratorName']}"] += 1
                continue
            on, spot = (gcp_hosts.host_price(host, region, s) for s in (False, True))
            if on is None or spot is None:
                skipped[f"gcp {rec['AcceleratorName']} in {region} (no host price)"] += 1
                continue
            model = gcp_hosts.ACCELERATORS[accel][0]
            itype = gcp_hosts.instance_type(host, accel, count)
            extra = {"machine_type": host.machine_type, "accelerator_type": accel,
                     "accelerator_count": count}
            rows[(zone, itype)] = CatalogRow(
                "gcp", region, zone, itype, model, count, float(memory_of(model)),
                float(host.vcpus), host.memory_gb, round(float(rec["Price"]) + on, 6),
                round(float(rec["SpotPrice"]) + spot, 6), carbon_zone("gcp", region),
                GCP_SOURCE, "2022-06-24", extra)
    return list(rows.values())


def _gcp_prices(folder: Path) -> GcpPrices:
    """The GCP refresher's default price file: per-GPU prices by region (the snapshot's
    one-GPU rows) and the host rates of gcp_hosts.py."""
    accs: dict[str, dict[str, dict[str, float]]] = {}
    with open(folder / "gcp_gpu_tpu_catalog_2022-06-24.csv", newline="") as f:
        for rec in csv.DictReader(f):
            accel = gcp_hosts.BY_NAME.get(rec["AcceleratorName"])
            if accel is not None and int(float(rec["AcceleratorCount"])) == 1:
                accs.setdefault(rec["Region"], {})[accel] = {
                    "ondemand": float(rec["Price"]), "spot": float(rec["SpotPrice"])}
    hosts = {region: {fam: {"ondemand": list(r[0]), "spot": list(r[1])}
                      for fam, r in fams.items()}
             for region, fams in gcp_hosts.HOST_RATES.items()}
    return GcpPrices(accs, hosts, "2022-06-24", GCP_SOURCE)


def build(data: Path) -> Built:
    """Rows and spot history from the shared data folder."""
    skipped: Counter[str] = Counter()
    aws_rows, shapes = _aws(data / SKYPILOT, skipped)
    spot_rows, points = _aws_spot(data / DIME, shapes, skipped)
    return Built(aws_rows + spot_rows + _gcp(data / SKYPILOT, skipped), points, skipped,
                 _gcp_prices(data / SKYPILOT))


def write(built: Built, out: Path) -> tuple[Path, Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    prices = out / "gcp_prices.json"
    prices.write_text(built.gcp_prices.to_json(), encoding="utf-8")
    return (write_rows(out / "catalog.csv", built.rows),
            write_series(out / "catalog.spot.csv.gz", built.spot), prices)


def summary(built: Built, paths: Iterable[Path]) -> str:
    per = Counter(r.provider for r in built.rows)
    lines = [f"wrote {p} ({p.stat().st_size:,} bytes)" for p in paths]
    lines.append("rows: " + ", ".join(f"{k} {v}" for k, v in sorted(per.items()))
                 + f"; spot price changes: {len(built.spot)}")
    if built.skipped:
        lines.append("left out: " + ", ".join(f"{k} ({v})" for k, v in
                                               sorted(built.skipped.items())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m providers.catalog.build",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="data", type=Path, required=True,
                        help="the shared data folder (holding the SkyPilot and spot folders)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data")
    args = parser.parse_args(argv)
    for sub in (SKYPILOT, DIME):
        if not (args.data / sub).is_dir():
            parser.error(f"--from {args.data}: no {sub}/ folder there")
    built = build(args.data)
    print(summary(built, write(built, args.out)))


if __name__ == "__main__":
    main()
