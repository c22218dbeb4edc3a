"""The simulator's carbon signals and its carbon and deadline figures.

- :func:`sim_signals`: the :class:`~broker.carbon_signals.CarbonSignals` a simulation's
  snapshots go through (the same :meth:`~broker.carbon_signals.CarbonSignals.dress` as a
  scheduler's): the run's carbon series (broker/energy_sim.py: the shipped Electricity Maps
  2022 series moved onto the trace's year), a zone they lack answered by its stand-in (as the
  accounting does), fetched in line every 15 simulated minutes over the next two days, a
  perfect forecast (the series itself).
- :func:`carbon_by_class`: ``carbon.by_class_kg``, emissions of each class's runs.
- :func:`deadline_metrics`: ``deadline_jobs`` (jobs with a deadline) and ``deadline_misses``
  (those that finished after it, or never finished).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from broker.carbon_signals import AliasedSource, CarbonSignals
from broker.energy_sim import RunPiece, SimEnergy, stand_in
from providers.catalog.zones import carbon_zone

REFRESH_S = 900.0
HORIZON_S = 2 * 86400.0


def sim_signals(energy: SimEnergy | None, cluster: Any) -> CarbonSignals | None:
    """The carbon signals of a simulation with carbon accounting (None without)."""
    if energy is None:
        return None
    covered = energy.zones
    source = AliasedSource(energy.source, lambda z: stand_in(z, covered))
    cloud = getattr(cluster, "cloud", None)
    zones = {carbon_zone(s.provider, s.region) for s in (cloud.sites if cloud else ())}
    zones |= set(energy.onprem_zones.values())
    return CarbonSignals(source, onprem_zones=energy.onprem_zones, zones=zones,
                         horizon_s=HORIZON_S, refresh_s=REFRESH_S, offset=energy.origin,
                         background=False)


def carbon_by_class(energy: SimEnergy, pieces: Sequence[RunPiece], classes: Sequence[str]
                    ) -> dict[str, float]:
    """kgCO2e of the runs of each class's jobs (``classes[i]`` is ``pieces[i]``'s)."""
    by: dict[str, list[RunPiece]] = defaultdict(list)
    for piece, cls in zip(pieces, classes):
        by[cls].append(piece)
    return {cls: float(energy.metrics(ps)["carbon_kg"]) for cls, ps in sorted(by.items())}


def deadline_metrics(records: Mapping[str, Any], deadline_of: Callable[[str], float | None]
                     ) -> dict[str, int]:
    """``deadline_jobs`` and ``deadline_misses`` over the run's records."""
    jobs = misses = 0
    for rec in records.values():
        if rec.infeasible:
            continue
        due = deadline_of(rec.id)
        if due is None:
            continue
        jobs += 1
        misses += rec.end_s is None or rec.end_s > due
    return {"deadline_jobs": jobs, "deadline_misses": misses}
