"""The ``energy:`` and ``carbon:`` sections of the configuration, checked when it loads.

``energy:`` holds the energy model's knobs (:class:`broker.energy.model.EnergyModel`) and the
on-prem
sites' own settings; ``carbon:`` names the carbon-intensity source and its options. Every
problem is a :class:`~broker.errors.ConfigError` naming the key, what was wrong and what is
allowed. docs/carbon.md describes both sections with an example.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from broker.config.keys import key_hint
from broker.energy.model import EnergyModel
from broker.energy.prices import ElectricityPrice, PriceSeries, TimeOfUseTariff
from broker.errors import ConfigError

ENERGY_KEYS = ("utilisation", "gpu_power_w", "node_overhead", "pue", "sites")
SITE_KEYS = ("carbon_zone", "pue", "price_per_gpu_hour", "electricity")
CARBON_SOURCES = ("csv", "electricitymaps", "watttime", "uk-carbon-intensity",
                  "carbon-aware-sdk")
CARBON_KEYS: Mapping[str, tuple[str, ...]] = {
    "csv": ("files", "dir", "years", "column", "forecast_error", "seed", "shift_to_year"),
    "electricitymaps": ("url", "token", "emission_factor_type"),
    "watttime": ("url", "username", "password", "regions", "signal_type"),
    "uk-carbon-intensity": ("url",),
    "carbon-aware-sdk": ("url", "locations", "window_minutes"),
}
_COMMON_CARBON = ("source", "averages", "timeout_s", "cache_ttl_s")


@dataclass(frozen=True)
class SiteEnergy:
    """An on-prem site's carbon zone, PUE, amortised GPU-hour price and electricity price."""

    carbon_zone: str = ""
    pue: float | None = None  # None: the model's
    price_per_gpu_hour: float | None = None  # None: onprem_price_per_gpu_hour
    electricity: ElectricityPrice | None = None  # None: not priced separately


@dataclass(frozen=True)
class EnergySettings:
    model: EnergyModel = field(default_factory=EnergyModel)
    sites: Mapping[str, SiteEnergy] = field(default_factory=dict)

    def zones(self) -> dict[str, str]:
        """On-prem site id -> carbon zone, for :func:`providers.catalog.zones.site_zone`."""
        return {s: e.carbon_zone for s, e in self.sites.items() if e.carbon_zone}

    def onprem_cost_usd(self, site: str, gpus: float, gpu_model: str, start: float,
                        end: float, default_price: float) -> float:
        """What ``gpus`` GPUs of ``gpu_model`` at on-prem ``site`` cost from ``start`` to
        ``end`` (unix seconds), for chargeback: GPU-hours x the site's amortised price
        (``default_price``, the configuration's ``onprem_price_per_gpu_hour``, unless the site
        sets its own), plus the energy (IT power x PUE) at the site's electricity price where
        it has one."""
        if end <= start or gpus <= 0:
            return 0.0
        own = self.sites.get(site)
        price = own.price_per_gpu_hour if own is not None and \
            own.price_per_gpu_hour is not None else default_price
        usd = gpus * (end - start) / 3600.0 * price
        if own is not None and own.electricity is not None:
            kw = self.model.power_kw(gpus, gpu_model) * self.model.site_pue(site)
            usd += own.electricity.cost(kw, start, end)
        return usd


@dataclass(frozen=True)
class CarbonSettings:
    source: str = ""  # "": none configured
    options: Mapping[str, Any] = field(default_factory=dict)
    averages: Mapping[str, float] = field(default_factory=dict)
    timeout_s: float = 5.0
    cache_ttl_s: float = 300.0


def _unknown(where: str, raw: Mapping[str, Any], known: tuple[str, ...]) -> None:
    for key in raw:
        if key not in known:
            raise ConfigError(f"{where}.{key}: not a setting; {key_hint(str(key), known)}")


def _mapping(raw: Any, where: str, example: str) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: {raw!r} is not a mapping; use {example}")
    return raw


def _number(value: Any, where: str, allowed: str, low: float, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < low or (strict and value == low):
        raise ConfigError(f"{where}: {value!r} is not allowed; use {allowed}")
    return float(value)


def _table(raw: Any, where: str, allowed: str, low: float, strict: bool) -> dict[str, float]:
    table = _mapping(raw, where, "{key: number}")
    return {str(k): _number(v, f"{where}.{k}", allowed, low, strict) for k, v in table.items()}


def _electricity(raw: Any, where: str) -> ElectricityPrice:
    if isinstance(raw, Mapping) and "series" in raw:
        _unknown(where, raw, ("series",))
        try:
            return PriceSeries.read(str(raw["series"]))
        except ValueError as e:
            raise ConfigError(f"{where}.series: {e}") from None
    try:
        return TimeOfUseTariff.parse(dict(raw) if isinstance(raw, Mapping) else raw, where)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _site(name: str, raw: Any) -> SiteEnergy:
    where = f"config energy.sites.{name}"
    item = _mapping(raw, where, "{carbon_zone, pue, price_per_gpu_hour, electricity}")
    _unknown(where, item, SITE_KEYS)
    zone = item.get("carbon_zone", "")
    if not isinstance(zone, str):
        raise ConfigError(f"{where}.carbon_zone: {zone!r} must be an Electricity Maps zone key "
                          "such as DE or US-CAL-CISO")
    pue = item.get("pue")
    price = item.get("price_per_gpu_hour")
    return SiteEnergy(
        carbon_zone=zone,
        pue=None if pue is None else _number(pue, f"{where}.pue", "a ratio >= 1", 1.0),
        price_per_gpu_hour=None if price is None else _number(
            price, f"{where}.price_per_gpu_hour", "dollars per GPU-hour >= 0", 0.0),
        electricity=None if item.get("electricity") is None else _electricity(
            item["electricity"], f"{where}.electricity"))


def parse_energy(raw: Any) -> EnergySettings:
    """The ``energy:`` section checked; ConfigError naming the key otherwise."""
    where = "config energy"
    data = _mapping(raw, where, "{utilisation, gpu_power_w, node_overhead, pue, sites}")
    _unknown(where, data, ENERGY_KEYS)
    sites = {str(k): _site(str(k), v) for k, v in
             _mapping(data.get("sites"), f"{where}.sites", "{site id: its settings}").items()}
    pue = _table(data.get("pue"), f"{where}.pue", "a ratio >= 1", 1.0, False)
    pue.update({s: e.pue for s, e in sites.items() if e.pue is not None})
    utilisation = _number(data.get("utilisation", 1.0), f"{where}.utilisation",
                          "a fraction > 0 and <= 1", 0.0, strict=True)
    if utilisation > 1.0:
        raise ConfigError(f"{where}.utilisation: {data['utilisation']!r} is not allowed; use a "
                          "fraction > 0 and <= 1")
    model = EnergyModel(
        utilisation=utilisation,
        gpu_power_w=_table(data.get("gpu_power_w"), f"{where}.gpu_power_w", "watts > 0", 0.0,
                           True),
        node_overhead=_table(data.get("node_overhead"), f"{where}.node_overhead",
                             "a fraction >= 0", 0.0, False),
        pue=pue)
    return EnergySettings(model, MappingProxyType(sites))


def parse_carbon(raw: Any) -> CarbonSettings:
    """The ``carbon:`` section checked; ConfigError naming the key otherwise."""
    where = "config carbon"
    data = _mapping(raw, where, "{source: csv, dir: ..., ...}")
    if not data:
        return CarbonSettings()
    source = data.get("source")
    if source not in CARBON_SOURCES:
        raise ConfigError(f"{where}.source: {source!r} is not one of {', '.join(CARBON_SOURCES)}")
    _unknown(where, data, (*_COMMON_CARBON, *CARBON_KEYS[source]))
    options = {k: v for k, v in data.items() if k not in _COMMON_CARBON}
    for key in ("url", "token", "username", "password", "dir", "column", "signal_type",
                "emission_factor_type"):
        if key in options and not isinstance(options[key], str):
            raise ConfigError(f"{where}.{key}: {options[key]!r} must be a string")
    for key in ("regions", "locations"):
        if key in options:
            table = _mapping(options[key], f"{where}.{key}", "{zone: the API's name for it}")
            options[key] = {str(k): str(v) for k, v in table.items()}
    if "files" in options and (not isinstance(options["files"], list) or not all(
            isinstance(f, str) for f in options["files"])):
        raise ConfigError(f"{where}.files: {options['files']!r} must be a list of CSV paths")
    if source == "csv" and not options.get("files") and not options.get("dir"):
        raise ConfigError(f"{where}: a csv source needs files: [paths] or dir: a directory")
    if "forecast_error" in options:
        options["forecast_error"] = _number(options["forecast_error"],
                                            f"{where}.forecast_error",
                                            "a fraction of the series' mean, 0 to 1", 0.0)
    for key in ("seed", "shift_to_year", "window_minutes"):
        if key in options and (isinstance(options[key], bool)
                               or not isinstance(options[key], int)):
            raise ConfigError(f"{where}.{key}: {options[key]!r} must be a whole number")
    if "years" in options and (not isinstance(options["years"], list) or not all(
            isinstance(y, int) and not isinstance(y, bool) for y in options["years"])):
        raise ConfigError(f"{where}.years: {options['years']!r} must be a list of years")
    return CarbonSettings(
        source=str(source), options=MappingProxyType(options),
        averages=_table(data.get("averages"), f"{where}.averages", "gCO2e/kWh >= 0", 0.0,
                        False),
        timeout_s=_number(data.get("timeout_s", 5.0), f"{where}.timeout_s", "seconds > 0", 0.0,
                          strict=True),
        cache_ttl_s=_number(data.get("cache_ttl_s", 300.0), f"{where}.cache_ttl_s",
                            "seconds >= 0", 0.0))


def build_source(settings: CarbonSettings) -> Any:
    """The configured carbon source (a :class:`providers.carbon.base.CarbonSource`), or None
    when none is configured. Reads CSV files; a web source makes no call until asked."""
    from providers.carbon.apis import WEB_SOURCES
    from providers.carbon.base import CarbonDataError
    from providers.carbon.csv import CsvCarbonSource

    opts = dict(settings.options)
    try:
        if not settings.source:
            return None
        if settings.source == "csv":
            shift = opts.pop("shift_to_year", None)
            common = {k: opts[k] for k in ("column", "forecast_error", "seed") if k in opts}
            src = CsvCarbonSource.from_files(opts["files"], **common) if opts.get("files") \
                else CsvCarbonSource.from_dir(opts["dir"], years=opts.get("years"), **common)
            return src.shifted(shift) if shift is not None else src
        url = opts.pop("url", None)
        return WEB_SOURCES[settings.source](
            **({"base_url": url} if url else {}), **opts, timeout_s=settings.timeout_s,
            cache_ttl_s=settings.cache_ttl_s, averages=dict(settings.averages))
    except CarbonDataError as e:
        raise ConfigError(f"config carbon: {e}") from None
