"""Grid carbon intensity: where (which grid zone) and when electricity is cleanest.

- :mod:`providers.carbon.base`: the :class:`CarbonSource` interface (intensity for a zone at a
  time, a forecast over a window) and the helpers over forecast steps, both defined in
  :mod:`broker.energy.steps` (below the policies) and re-exported; the errors; ``signals``;
- :mod:`providers.carbon.csv`: :class:`CsvCarbonSource`, series read from the CSV formats in
  ``../shared/data/carbon_*`` (Electricity Maps hourly downloads, "Let's Wait Awhile" files),
  with a year shift for the simulator and a perfect or noisy forecast.

docs/carbon.md describes the sources, the zone table and the energy model.
"""

from providers.carbon.base import (
    CarbonDataError,
    CarbonError,
    CarbonSource,
    mean_intensity,
    signals,
)
from providers.carbon.csv import CsvCarbonSource, Series, year_offset

__all__ = [
    "CarbonDataError",
    "CarbonError",
    "CarbonSource",
    "CsvCarbonSource",
    "Series",
    "mean_intensity",
    "signals",
    "year_offset",
]
