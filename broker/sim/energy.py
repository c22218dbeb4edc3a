"""Carbon and cost accounting of a simulation run: ``carbon_kg`` and ``cost_per_gpu_hour``.

Every run of a job (each attempt: one piece of GPU time from its start to its end or its
eviction) is charged, on-prem and in the cloud:

- **emissions**: the energy model (:mod:`broker.energy.model`) for the run's GPUs, model and site,
  times the carbon intensity of the site's zone integrated over the run. The series are CSV
  series (by default the shipped Electricity Maps 2022 hourly series of US-CAL-CISO, ES, NO and
  BR) moved onto the trace's dates: :meth:`providers.carbon.csv.CsvCarbonSource.shifted` moves
  each series onto the year the trace starts in by a whole number of weeks (weekdays kept,
  dates within 3 days) and wraps past its end.
- **zones**: a cloud site's from the zone table (:func:`providers.catalog.zones.site_zone`), an
  on-prem site's from ``onprem_zones`` (default: ``onprem`` -> US-CAL-CISO, the Philly trace
  being a US cluster's). A zone the series do not cover is replaced by a *stand-in* that they
  do (:func:`stand_in`: any ``US-*`` zone by US-CAL-CISO, ``BR*`` by BR, ``NO*`` by NO, any
  other by ES), and the JSON says so under ``carbon.stand_ins``: the figures are then an
  illustration of that grid, not a measurement of the real one.
- **cost**: on-prem GPU-hours run x the amortised on-prem price (``onprem_price_per_gpu_hour``,
  $0.81; a site's ``price_per_gpu_hour`` if set) plus, where a site has an electricity price,
  its energy at that price; plus the cloud's bill (``cloud_cost_usd``, idle instance time
  included). ``cost_per_gpu_hour`` = that total / the GPU-hours run.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.config.energy import EnergySettings
from broker.energy.model import emissions_kg
from providers.carbon.base import CarbonSource
from providers.carbon.csv import SHIPPED_2022, CsvCarbonSource
from providers.catalog.zones import site_zone

DEFAULT_ONPREM_ZONE = "US-CAL-CISO"
DEFAULT_PRICE_PER_GPU_HOUR = 0.81  # broker.config.core.Config.onprem_price_per_gpu_hour


@dataclass(frozen=True)
class RunPiece:
    """One run of one job: ``gpus`` GPUs of ``model`` at ``site`` from ``start_s`` to
    ``end_s`` (seconds since the trace's start)."""

    start_s: float
    end_s: float
    gpus: int
    model: str
    site: str


def stand_in(zone: str, covered: Iterable[str]) -> str:
    """The zone whose series stands in for ``zone`` (itself when covered)."""
    have = set(covered)
    if zone in have:
        return zone
    for prefix, other in (("US-", "US-CAL-CISO"), ("BR", "BR"), ("NO", "NO")):
        if zone.startswith(prefix) and other in have:
            return other
    return "ES" if "ES" in have else sorted(have)[0]


@dataclass
class SimEnergy:
    """The accounting of one run (see the module's doc)."""

    source: CarbonSource
    zones: frozenset[str]  # what the source covers
    origin: float  # epoch seconds of the trace's t = 0
    energy: EnergySettings = field(default_factory=EnergySettings)
    onprem_zones: Mapping[str, str] = field(
        default_factory=lambda: {"onprem": DEFAULT_ONPREM_ZONE})
    price_per_gpu_hour: float = DEFAULT_PRICE_PER_GPU_HOUR

    @classmethod
    def for_trace(cls, origin: float, source: CsvCarbonSource | None = None,
                  energy: EnergySettings | None = None, **kw: Any) -> SimEnergy:
        """Accounting for a trace starting at ``origin``: ``source`` (default: the shipped
        2022 series) shifted onto the trace's year."""
        import datetime as dt

        year = dt.datetime.fromtimestamp(origin, dt.timezone.utc).year
        src = (source or CsvCarbonSource.from_files([SHIPPED_2022])).shifted(year)
        energy = energy or EnergySettings()
        zones = {**{"onprem": DEFAULT_ONPREM_ZONE}, **energy.zones()}
        return cls(src, frozenset(src.zones), origin, energy, zones, **kw)

    def zone_of(self, site: str) -> tuple[str, str]:
        """(the site's zone, the zone whose series is used for it)."""
        zone = site_zone(site, self.onprem_zones) or DEFAULT_ONPREM_ZONE
        return zone, stand_in(zone, self.zones)

    def metrics(self, pieces: Iterable[RunPiece], cloud_cost_usd: float = 0.0) -> dict[str, Any]:
        """``carbon_kg``, ``cost_per_gpu_hour`` and the ``carbon`` breakdown."""
        model = self.energy.model
        by_zone: dict[str, float] = defaultdict(float)
        stand_ins: dict[str, str] = {}
        kwh = gpu_h = onprem_gpu_h = onprem_usd = 0.0
        for p in pieces:
            if p.end_s <= p.start_s or p.gpus <= 0:
                continue
            zone, used = self.zone_of(p.site)
            if used != zone:
                stand_ins[zone] = used
            start, end = self.origin + p.start_s, self.origin + p.end_s
            by_zone[zone] += emissions_kg(model, self.source, used, p.site, start, end, p.gpus,
                                          p.model)
            seconds = p.end_s - p.start_s
            kwh += model.energy_kwh(p.gpus, p.model, p.site, seconds)
            hours = p.gpus * seconds / 3600.0
            gpu_h += hours
            if p.site.split(":", 1)[0] == "onprem":
                onprem_gpu_h += hours
                onprem_usd += self.energy.onprem_cost_usd(p.site, p.gpus, p.model, start, end,
                                                          self.price_per_gpu_hour)
        total_kg = math.fsum(by_zone.values())
        total_usd = onprem_usd + cloud_cost_usd
        return {
            "carbon_kg": round(total_kg, 3),
            "cost_per_gpu_hour": round(total_usd / gpu_h, 4) if gpu_h > 0 else None,
            "carbon": {
                "by_zone_kg": {z: round(v, 3) for z, v in sorted(by_zone.items())},
                "energy_kwh": round(kwh, 1),
                "gpu_hours": round(gpu_h, 2),
                "onprem_gpu_hours": round(onprem_gpu_h, 2),
                "onprem_cost_usd": round(onprem_usd, 2),
                "cloud_cost_usd": round(cloud_cost_usd, 2),
                "stand_ins": dict(sorted(stand_ins.items())),
                "series_zones": sorted(self.zones),
            },
        }
