"""The energy model: how much power a run draws, and what it emits, integrated over the run.

    power (kW)     = GPUs x board power (W) x utilisation x (1 + node overhead) / 1000
    energy (kWh)   = power x PUE x hours
    emissions (kg) = integral over the run of power x PUE x intensity(t) dt / 1000

where intensity (gCO2e/kWh) is the grid's, in the carbon zone of the run's site, as a
:class:`~broker.energy.steps.CarbonSource` gives it (the actual series where the source has
one, else its forecast). Pure: the source is passed in, and times are unix seconds.

Figures (docs/carbon.md has the table)
--------------------------------------
Board power: the maximum board power / TDP in NVIDIA's data sheets, for the SXM module where
the part comes in SXM and PCIe forms (the clouds' 8-GPU machines and DGX/HGX servers use SXM):

[V100]   NVIDIA Tesla V100 data sheet (2020): SXM2 300 W, PCIe 250 W.
[A100]   NVIDIA A100 Tensor Core GPU data sheet (2021): SXM4 400 W, PCIe 80GB 300 W.
[H100]   NVIDIA H100 Tensor Core GPU data sheet (2023): SXM up to 700 W, PCIe 300-350 W.
[H200]   NVIDIA H200 Tensor Core GPU data sheet (2024): SXM up to 700 W.
[B200]   NVIDIA HGX B200 specifications (2024): up to 1,000 W per GPU.
[T4]     NVIDIA T4 data sheet: 70 W.   [L4] NVIDIA L4 data sheet: 72 W.
[A10]    NVIDIA A10 data sheet: 150 W (AWS's A10G, the same GA102 part, taken as equal).
[A40]    NVIDIA A40 data sheet: 300 W.   [A6000] NVIDIA RTX A6000 data sheet: 300 W.
[L40S]   NVIDIA L40S data sheet: 350 W.  [4090] NVIDIA GeForce RTX 4090 specifications: 450 W.
[P100]   NVIDIA Tesla P100 data sheet: SXM2 300 W, PCIe 250 W (clouds rent the PCIe card).
[K80]    NVIDIA Tesla K80 data sheet: 300 W per board of two GK210 GPUs; a cloud "K80" is one.

Node overhead (host CPUs, memory, network, fans, power supplies), as a fraction of the GPUs'
power: NVIDIA's DGX data sheets give the maximum system power of 8-GPU servers: DGX-1 (V100)
3.5 kW for 2.4 kW of GPUs (0.46), DGX A100 6.5 kW for 3.2 kW (1.03), DGX H100 10.2 kW for
5.6 kW (0.82). Those are the defaults for their families; other families take 0.5.

Utilisation: 1.0 (a busy GPU draws its board power), as the TDP-times-hours method of the ML
CO2 Impact calculator does (Lacoste et al., "Quantifying the Carbon Emissions of Machine
Learning", 2019): an upper bound; set it lower for measured fleets.

PUE (data-centre power over IT power): on-prem 1.55, the average of the Uptime Institute's
Global Data Center Survey 2022 (the figure docs/catalog.md's on-prem price uses); AWS 1.15
(the global PUE AWS publishes on its sustainability pages); GCP 1.10 (Google, fleet-wide
trailing twelve-month PUE for 2023, Environmental Report 2024); any other cloud 1.55.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from broker.energy.steps import CarbonSource, integrate
from broker.model.gpus import family_of

#: Board power in watts by GPU family, and the source (see the module's doc).
GPU_POWER_W: Mapping[str, tuple[float, str]] = MappingProxyType({
    "K80": (150.0, "K80"), "P100": (250.0, "P100"), "T4": (70.0, "T4"),
    "V100": (300.0, "V100"), "A10G": (150.0, "A10"), "A10": (150.0, "A10"),
    "L4": (72.0, "L4"), "A40": (300.0, "A40"), "A6000": (300.0, "A6000"),
    "L40S": (350.0, "L40S"), "A100": (400.0, "A100"), "H100": (700.0, "H100"),
    "H200": (700.0, "H200"), "B200": (1000.0, "B200"), "RTX4090": (450.0, "4090"),
})
#: Node overhead by GPU family (DGX maximum system power); other families: DEFAULT_OVERHEAD.
NODE_OVERHEAD: Mapping[str, float] = MappingProxyType({"V100": 0.46, "A100": 1.03,
                                                       "H100": 0.82})
DEFAULT_OVERHEAD = 0.5
DEFAULT_POWER_W = 300.0  # an unknown GPU: a V100's
#: PUE by provider ("onprem" for on-prem sites); others: DEFAULT_PUE.
PUE: Mapping[str, float] = MappingProxyType({"onprem": 1.55, "aws": 1.15, "gcp": 1.10})
DEFAULT_PUE = 1.55


@dataclass(frozen=True)
class EnergyModel:
    """The knobs of the model (defaults: the figures above). ``gpu_power_w`` and
    ``node_overhead`` take a family (``A100``) or a model (``A100-40GB``) as key; ``pue`` a
    site id (``onprem``, ``aws:us-east-1:spot``) or a provider (``aws``)."""

    utilisation: float = 1.0
    gpu_power_w: Mapping[str, float] = field(default_factory=dict)
    node_overhead: Mapping[str, float] = field(default_factory=dict)
    pue: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (0.0 < self.utilisation <= 1.0):
            raise ValueError(f"energy utilisation {self.utilisation!r} is not allowed; use a "
                             "fraction > 0 and <= 1")
        for name, table, low in (("gpu_power_w", self.gpu_power_w, 0.0),
                                 ("node_overhead", self.node_overhead, -1.0),
                                 ("pue", self.pue, 1.0)):
            for key, value in table.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)) \
                        or not math.isfinite(value) or value < low or (name != "pue"
                                                                       and value == low):
                    allowed = {"gpu_power_w": "watts > 0", "node_overhead": "a fraction >= 0",
                               "pue": "a ratio >= 1"}[name]
                    raise ValueError(f"energy {name}.{key}: {value!r} is not allowed; use "
                                     f"{allowed}")

    def gpu_watts(self, model: str) -> float:
        family = family_of(model)
        for key in (model, family):
            if key in self.gpu_power_w:
                return float(self.gpu_power_w[key])
        return GPU_POWER_W.get(family, (DEFAULT_POWER_W, ""))[0]

    def overhead(self, model: str) -> float:
        family = family_of(model)
        for key in (model, family):
            if key in self.node_overhead:
                return float(self.node_overhead[key])
        return NODE_OVERHEAD.get(family, DEFAULT_OVERHEAD)

    def site_pue(self, site: str) -> float:
        provider = site.split(":", 1)[0]
        region = ":".join(site.split(":")[:2])
        for key in (site, region, provider):
            if key in self.pue:
                return float(self.pue[key])
        return PUE.get(provider, DEFAULT_PUE)

    def power_kw(self, gpus: float, model: str) -> float:
        """IT power of ``gpus`` busy GPUs of ``model`` with their share of the host, in kW."""
        return gpus * self.gpu_watts(model) * self.utilisation * (1 + self.overhead(model)) / 1e3

    def energy_kwh(self, gpus: float, model: str, site: str, seconds: float) -> float:
        """Energy drawn from the grid (IT power x PUE) over ``seconds``."""
        return self.power_kw(gpus, model) * self.site_pue(site) * max(0.0, seconds) / 3600.0


def actual_steps(source: CarbonSource, zone: str, start: float,
                 end: float) -> list[tuple[float, float]]:
    """What the grid emitted over ``[start, end)``: the source's actual series when it has one
    (``actual``, as :class:`~providers.carbon.csv.CsvCarbonSource` does), else its forecast."""
    actual = getattr(source, "actual", None)
    steps: list[tuple[float, float]] = actual(zone, start, end) if callable(actual) \
        else source.forecast(zone, start, end)
    return steps


def emissions_kg(model: EnergyModel, source: CarbonSource, zone: str, site: str, start: float,
                 end: float, gpus: float, gpu_model: str) -> float:
    """kgCO2e of a run of ``gpus`` GPUs of ``gpu_model`` at ``site`` (grid zone ``zone``)
    from ``start`` to ``end`` (unix seconds): power x PUE x intensity, integrated."""
    if end <= start or gpus <= 0:
        return 0.0
    grams_s = integrate(actual_steps(source, zone, start, end), start, end)  # g/kWh x s
    kw = model.power_kw(gpus, gpu_model) * model.site_pue(site)
    return kw * grams_s / 3600.0 / 1000.0
