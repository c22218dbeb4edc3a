"""Carbon intensity as step functions: the source interface the energy model reads, and the
integral and mean of forecast steps.

A *zone* is an Electricity Maps zone key ("DE", "GB", "FR", "US-CAL-CISO", ...): the grid a
site draws from. Intensities are grams of CO2-equivalent per kWh of electricity consumed
(gCO2e/kWh), times are unix seconds (UTC).

A forecast is a list of *steps* ``(t, g)``: the intensity is ``g`` from ``t`` until the next
step's ``t`` (the last step lasts until the window's end). The first step starts at the
window's start, so the steps cover ``[start, end)`` with no gap.

These pieces are pure and sit below the policies (which read the energy model); the sources
themselves (CSV series, web APIs) live in :mod:`providers.carbon`, which re-exports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class CarbonSource(Protocol):
    """Where carbon intensity comes from: a CSV series, or a web API (with a fallback)."""

    name: str

    def intensity(self, zone: str, at: float) -> float:
        """gCO2e/kWh in ``zone`` at unix time ``at``."""
        ...

    def forecast(self, zone: str, start: float, end: float) -> list[tuple[float, float]]:
        """(unix time, gCO2e/kWh) steps covering ``[start, end)``, the first at ``start``."""
        ...


def integrate(steps: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """The integral of a step function over ``[start, end)``, in (value x seconds).

    ``steps`` are ``(t, value)`` sorted by time; each value holds until the next step. Time
    before the first step takes the first step's value (a forecast starts at its window)."""
    if end <= start or not steps:
        return 0.0
    total = 0.0
    for i, (t, value) in enumerate(steps):
        seg_start = start if i == 0 else max(start, t)
        seg_end = steps[i + 1][0] if i + 1 < len(steps) else end
        seg_end = min(seg_end, end)
        if seg_end > seg_start:
            total += value * (seg_end - seg_start)
    return total


def mean_intensity(source: CarbonSource, zone: str, start: float, end: float) -> float:
    """The time-weighted mean intensity of ``zone`` over ``[start, end)``, from the source's
    forecast (for past windows, what the source knows of them); the point value when the
    window is empty."""
    if end <= start:
        return source.intensity(zone, start)
    return integrate(source.forecast(zone, start, end), start, end) / (end - start)
