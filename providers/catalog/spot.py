"""Spot markets over time: price series per zone, and availability traces with the
interruption rate they imply.

- **Prices** (:class:`SpotSeries`): the catalog's spot history file (``catalog.spot.csv.gz``
  beside ``catalog.csv``), one price change per line, read through
  :meth:`providers.catalog.Catalog.spot_history`. The shipped one holds AWS p2/p3 prices of
  Dec 2019 - Mar 2020 (Narayanan et al., DISPA 2020; MIT).
- **Availability** (:class:`SpotTrace`): the single-node GPU traces of "Can't Be Late" (Wu et
  al., NSDI'24), one sample every ``gap_s``: whether a spot instance of that type could be held
  in that zone. They carry no licence, so the project never copies them: :func:`load_traces`
  reads them from ``../shared/data/spot_availability_cantbelate`` (or a folder given) and
  returns nothing when the folder is absent.
- **Interruption rate** (:func:`interruption_rate`): interruptions per hour of holding a spot
  instance, from the traces of that zone and type when there are any, else from the same type
  in other zones, else :data:`DEFAULT_INTERRUPTION_RATE`.
"""

from __future__ import annotations

import bisect
import csv
import gzip
import io
import itertools
import json
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

SPOT_COLUMNS = ("provider", "region", "zone", "instance_type", "timestamp_utc", "price")

# The traces' GPU names -> the instance type the collector rented (the collector's own map, as
# PROVENANCE.md of the data folder reads it: k80_1=p2.xlarge, k80_8=p2.8xlarge, v100_1=
# p3.2xlarge, v100_8=p3.16xlarge).
TRACE_TYPES = {"k80_1": "p2.xlarge", "k80_8": "p2.8xlarge", "v100_1": "p3.2xlarge",
               "v100_8": "p3.16xlarge"}

DEFAULT_TRACES = Path(__file__).resolve().parents[3] / "shared" / "data" / \
    "spot_availability_cantbelate"

# Interruptions per hour held, used when no trace covers an offer: the median (0.797) of the 21
# single-node AWS GPU traces of "Can't Be Late" (availability/1-node and preemption/1-node,
# 2022-2023), measured by `python -m providers.catalog.spot` (docs/catalog.md).
DEFAULT_INTERRUPTION_RATE = 0.8


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class SpotSeries:
    """Spot prices of one instance type in one zone: a step function of time."""

    provider: str
    region: str
    zone: str
    instance_type: str
    times: tuple[float, ...]  # epoch seconds of each price change, ascending
    prices: tuple[float, ...]  # $/h from that time on

    def price_at(self, t: float) -> float:
        """The price in force at ``t`` (before the first change: the first price)."""
        i = bisect.bisect_right(self.times, t) - 1
        return self.prices[max(i, 0)]

    def mean(self, start: float | None = None, end: float | None = None) -> float:
        """The time-weighted mean price over [start, end] (default: the series' span)."""
        lo = self.times[0] if start is None else start
        hi = self.times[-1] if end is None else end
        if hi <= lo:
            return self.price_at(lo)
        edges = [lo, *(t for t in self.times if lo < t < hi), hi]
        return sum(self.price_at(a) * (b - a) for a, b in itertools.pairwise(edges)) / (hi - lo)


def read_series(path: str | os.PathLike[str]) -> dict[tuple[str, str, str], SpotSeries]:
    """Every series of a spot history file, by (provider, zone, instance_type)."""
    points: dict[tuple[str, str, str, str], list[tuple[float, float]]] = {}
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
        for rec in csv.DictReader(f):
            key = (rec["provider"], rec["region"], rec["zone"], rec["instance_type"])
            points.setdefault(key, []).append((_epoch(rec["timestamp_utc"]),
                                               float(rec["price"])))
    out = {}
    for (provider, region, zone, itype), pts in points.items():
        pts.sort()
        out[(provider, zone, itype)] = SpotSeries(provider, region, zone, itype,
                                                  tuple(t for t, _ in pts),
                                                  tuple(p for _, p in pts))
    return out


def write_series(path: str | os.PathLike[str],
                 records: Iterable[tuple[str, str, str, str, str, float]]) -> Path:
    """Write spot price changes (provider, region, zone, type, ISO time, price), sorted."""
    p = Path(path)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(SPOT_COLUMNS)
    w.writerows((*r[:5], f"{r[5]:.6g}") for r in sorted(set(records)))
    # mtime=0: the same records give the same bytes, so a rebuild diffs clean
    with open(p, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        gz.write(buf.getvalue().encode("utf-8"))
    return p


# ---------------------------------------------------------------------------------------------
# Availability traces


@dataclass(frozen=True)
class SpotTrace:
    """Whether spot capacity of one type could be held in one zone, one sample every gap_s."""

    name: str  # the file, relative to the traces folder
    provider: str
    zone: str
    instance_type: str
    gap_s: float
    available: tuple[bool, ...]

    @property
    def hours(self) -> float:
        return len(self.available) * self.gap_s / 3600

    def availability(self) -> float:
        """The share of samples with spot available."""
        return sum(self.available) / len(self.available) if self.available else 0.0

    def interruptions(self) -> int:
        """Samples where spot went from available to not (a running instance lost)."""
        return sum(a and not b for a, b in itertools.pairwise(self.available))

    def interruption_rate(self) -> float:
        """Interruptions per hour of holding an instance (available time)."""
        held_h = sum(self.available) * self.gap_s / 3600
        return self.interruptions() / held_h if held_h else 0.0


def _trace(root: Path, path: Path) -> SpotTrace | None:
    """A single-node GPU trace (``<zone>_<gpu>_<n>.json``: 1 = no spot), or None."""
    stem = path.stem
    zone, _, gpu = stem.partition("_")
    itype = TRACE_TYPES.get(gpu)
    if itype is None or "1-node" not in path.parts:
        return None  # CPU traces, and multi-node counts whose direction is unverified
    doc = json.loads(path.read_text(encoding="utf-8"))
    provider = path.parent.name.split("-", 1)[0]
    return SpotTrace(str(path.relative_to(root)), provider, zone, itype,
                     float(doc["metadata"]["gap_seconds"]),
                     tuple(not bool(v) for v in doc["data"]))


def load_traces(root: str | os.PathLike[str] | None = None) -> list[SpotTrace]:
    """The single-node GPU availability traces under ``root`` (default: the shared data
    folder), sorted by name; [] when the folder is absent."""
    base = Path(root) if root is not None else DEFAULT_TRACES
    if not base.is_dir():
        return []
    traces = (_trace(base, p) for p in sorted(base.rglob("*.json")))
    return [t for t in traces if t is not None]


@dataclass(frozen=True)
class InterruptionEstimate:
    rate_per_hour: float
    basis: str  # "zone" (traces of this zone and type), "type" (other zones), "default"
    traces: int  # how many traces it rests on


def interruption_rate(traces: Sequence[SpotTrace], provider: str, zone: str,
                      instance_type: str) -> InterruptionEstimate:
    """Interruptions per hour held for a spot offer: the mean over the traces of that zone and
    type, else the median over that type's traces elsewhere, else the default."""
    same = [t for t in traces if (t.provider, t.zone, t.instance_type) ==
            (provider, zone, instance_type)]
    if same:
        return InterruptionEstimate(statistics.fmean(t.interruption_rate() for t in same),
                                    "zone", len(same))
    kin = [t for t in traces if (t.provider, t.instance_type) == (provider, instance_type)]
    if kin:
        return InterruptionEstimate(statistics.median(t.interruption_rate() for t in kin),
                                    "type", len(kin))
    return InterruptionEstimate(DEFAULT_INTERRUPTION_RATE, "default", 0)


def main() -> None:
    """Print each trace's availability and interruption rate, and their median."""
    traces = load_traces()
    for t in traces:
        print(f"{t.name:55} {t.hours:7.1f} h  available {t.availability():.2f}  "
              f"interruptions {t.interruptions():4d}  {t.interruption_rate():.3f}/h")
    if traces:
        print(f"median over {len(traces)} traces: "
              f"{statistics.median(t.interruption_rate() for t in traces):.3f}/h")


if __name__ == "__main__":
    main()
