"""Static yearly average carbon intensity per zone: the last fallback of a web source.

Used when a source fails and has no last known value for the zone (a warning says so). The
figures are the yearly means of the measured series that Spillway's benchmarks read, so the
fallback and the simulator agree; override or extend them with ``carbon.averages`` in the
configuration (docs/carbon.md). A zone missing here has no static fallback: the source's error
is raised.

Sources
-------
[EM22] Electricity Maps, hourly carbon intensity 2022, "direct" (operational) column, mean of
       the 8,760 hours (``../shared/data/carbon_electricitymaps_hourly_2021_2023``: yearly
       downloads via github.com/umassos/decarbonization-potential; ODbL 1.0, "Electricity Maps").
[LWA]  Wiesner et al., "Let's Wait Awhile", Middleware'21: 2020 intensity from ENTSO-E
       production data x IPCC 2011 life-cycle emission factors, mean of each file (2020 and
       ten days either side; ``../shared/data/carbon_letswaitawhile_2020``;
       github.com/dos-group/lets-wait-awhile).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

YEARLY_AVERAGES: Mapping[str, tuple[float, str]] = MappingProxyType({
    "US-CAL-CISO": (195.0, "EM22"),
    "ES": (167.0, "EM22"),
    "NO": (13.0, "EM22"),
    "BR": (60.0, "EM22"),
    "DE": (315.0, "LWA"),
    "GB": (218.0, "LWA"),
    "FR": (57.0, "LWA"),
})


def yearly_average(zone: str, overrides: Mapping[str, float] | None = None) -> float | None:
    """The static yearly average of ``zone`` (gCO2e/kWh): the override, else the table;
    None when neither knows the zone."""
    if overrides and zone in overrides:
        return float(overrides[zone])
    entry = YEARLY_AVERAGES.get(zone)
    return entry[0] if entry else None
