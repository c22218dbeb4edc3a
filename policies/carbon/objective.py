"""One objective for placing work: dollars, carbon at an internal price, and lateness.

    value = dollars x usd + carbon_usd_per_tonne x tCO2e + late_usd_per_gpu_hour x GPU-hours late

per unit of work: divided by the job's work in reference GPU-hours (its GPUs x its runtime on a
V100, broker/model/speed.py), so a faster GPU that costs more an hour but finishes sooner is
compared
on what it costs to get the work done, not on its hourly price.

- **dollars** (``usd_weight``, 1): the expected bill (policies/burst/offers.py ``CostModel``: price
x
  runtime on that GPU model, boot, spot interruptions).
- **carbon** (``carbon_usd_per_tonne``, 0): an internal carbon price in $ per tonne CO2e times
  the expected emissions: the energy model's power for the GPUs (broker/energy/model.py: board
  power,
  node overhead, the provider's PUE) x the forecast intensity of the site's grid zone over the
  run (``Snapshot.carbon_forecast``, else the intensity now, else the zone's yearly average,
  else none). For scale: the US EPA's social cost of carbon (2023 report) is $190 a tonne at a
  2% discount rate for emissions in 2020; companies' internal prices are mostly $10-100.
- **lateness** (``late_usd_per_gpu_hour``, 0): a penalty per GPU-hour a job waits past its
  class SLA (for a job whose SLA is already lost, a slower boot costs more).

Where it is used: the ``sla`` burst policy ranks the offers that could finish a job by it
(policies/burst/offers.py :func:`~policies.burst.offers.rank_value`). With the defaults (carbon
price 0,
no lateness penalty) the rank is the expected dollars themselves, so every plan is the same
as with dollars alone. Settings: ``policy_settings: {objective: {...}}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from broker.energy.model import EnergyModel
from broker.model.speed import convert_runtime
from policies.carbon.window import slot_means
from policies.registry import declare_settings

OBJECTIVE_DEFAULTS: dict[str, float] = {
    "usd_weight": 1.0,  # weight of the expected dollars
    "carbon_usd_per_tonne": 0.0,  # internal carbon price, $ per tonne CO2e
    "late_usd_per_gpu_hour": 0.0,  # penalty per GPU-hour waited past the class SLA
}
declare_settings("objective", OBJECTIVE_DEFAULTS)
REFERENCE_GPU = "V100"  # work is counted in V100-hours (broker/model/speed.py's baseline)
_ENERGY = EnergyModel()


@dataclass(frozen=True)
class Objective:
    """The weights (see the module's doc)."""

    usd_weight: float = 1.0
    carbon_usd_per_tonne: float = 0.0
    late_usd_per_gpu_hour: float = 0.0

    def __post_init__(self) -> None:
        for name in OBJECTIVE_DEFAULTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f"objective {name}: {value!r} is not allowed; use a number "
                                 ">= 0")

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> Objective:
        return cls(**{k: float(settings[k]) for k in OBJECTIVE_DEFAULTS if k in settings})

    @property
    def dollars_only(self) -> bool:
        """True when the value ranks exactly as the dollars do (the defaults)."""
        return (self.usd_weight == 1.0 and self.carbon_usd_per_tonne == 0.0
                and self.late_usd_per_gpu_hour == 0.0)

    def value(self, usd: float, kg: float = 0.0, late_gpu_hours: float = 0.0) -> float:
        """The weighted sum, in dollars."""
        return (self.usd_weight * usd + self.carbon_usd_per_tonne * kg / 1000.0
                + self.late_usd_per_gpu_hour * late_gpu_hours)

    def per_work(self, usd: float, kg: float, late_gpu_hours: float, work: float) -> float:
        """:meth:`value` per reference GPU-hour of work (``work`` from :func:`work_hours`)."""
        return self.value(usd, kg, late_gpu_hours) / work if work > 0 else math.inf


def work_hours(gpus: int, runtime_s: float, model: str) -> float:
    """The work of ``gpus`` GPUs of ``model`` busy for ``runtime_s``, in reference GPU-hours
    (V100-hours: a GPU twice as fast does twice the work in an hour)."""
    on_ref = convert_runtime(runtime_s, model, REFERENCE_GPU)
    return max(0, gpus) * on_ref / 3600.0


def mean_intensity(zone: str, start: float, end: float,
                   forecast: Mapping[str, Sequence[tuple[float, float]]],
                   now_g: Mapping[str, float]) -> float | None:
    """gCO2e/kWh expected in ``zone`` over ``[start, end)``: the forecast's mean, else the
    intensity now (the signals put a zone's yearly average there when its source knows
    nothing better: broker/energy/carbon_signals.py); None when nothing is known of it."""
    steps = forecast.get(zone)
    if steps:
        if end <= start:
            return float(steps[0][1])
        return slot_means(steps, start, 1, end - start)[0]
    if zone in now_g:
        return float(now_g[zone])
    return None


def expected_kg(gpus: int, model: str, site: str, intensity_g: float | None,
                runtime_s: float) -> float:
    """kgCO2e of ``gpus`` busy GPUs of ``model`` at ``site`` for ``runtime_s`` at an
    intensity of ``intensity_g`` gCO2e/kWh (0 when it is unknown)."""
    if intensity_g is None or runtime_s <= 0 or gpus <= 0:
        return 0.0
    kwh = _ENERGY.energy_kwh(gpus, model, site, runtime_s)
    return kwh * intensity_g / 1000.0
