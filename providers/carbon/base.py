"""The carbon-intensity source interface, its errors, and helpers over forecast steps.

The interface and the pure step helpers (:class:`CarbonSource`, :func:`integrate`,
:func:`mean_intensity`) live in :mod:`broker.energy.steps`, below the policies; they are
re-exported here, where the sources are.

A *zone* is an Electricity Maps zone key ("DE", "GB", "FR", "US-CAL-CISO", ...): the grid a
site draws from (see :mod:`providers.catalog.zones` for cloud regions). Intensities are grams of
CO2-equivalent per kWh of electricity consumed (gCO2e/kWh), times are unix seconds (UTC).

A forecast is a list of *steps* ``(t, g)``: the intensity is ``g`` from ``t`` until the next
step's ``t`` (the last step lasts until the window's end). The first step starts at the
window's start, so the steps cover ``[start, end)`` with no gap.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from broker.energy.steps import CarbonSource, integrate, mean_intensity

__all__ = ["CarbonDataError", "CarbonError", "CarbonSource", "integrate", "mean_intensity",
           "signals"]

log = logging.getLogger("spillway.carbon")


class CarbonError(Exception):
    """A carbon-intensity source could not answer."""


class CarbonDataError(CarbonError, ValueError):
    """Bad or missing carbon data: an unknown zone, a time outside a series, a malformed file."""


def signals(source: CarbonSource, zones: Iterable[str], now: float, horizon_s: float
            ) -> tuple[dict[str, float], dict[str, tuple[tuple[float, float], ...]]]:
    """What a snapshot carries (``Snapshot.carbon``, ``Snapshot.carbon_forecast``): per zone,
    the intensity now and the forecast steps over ``[now, now + horizon_s)``. A zone the
    source cannot answer (after its own fallbacks) is left out, with a warning."""
    now_g: dict[str, float] = {}
    ahead: dict[str, tuple[tuple[float, float], ...]] = {}
    for zone in sorted(set(zones) - {""}):
        try:
            now_g[zone] = source.intensity(zone, now)
            ahead[zone] = tuple(source.forecast(zone, now, now + horizon_s))
        except CarbonError as e:
            log.warning("no carbon signal for zone %s from %s: %s", zone, source.name, e)
    return now_g, ahead
