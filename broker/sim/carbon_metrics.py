"""The simulator's carbon signals and its carbon and deadline figures.

- :func:`sim_signals`: the :class:`~broker.energy.carbon_signals.CarbonSignals` a simulation's
  snapshots go through (the same :meth:`~broker.energy.carbon_signals.CarbonSignals.dress` as a
  scheduler's): the run's carbon series (broker/sim/energy.py: the shipped Electricity Maps
  2022 series moved onto the trace's year), a zone they lack answered by its stand-in (as the
  accounting does), fetched in line every 15 simulated minutes over the next seven days, a
  perfect forecast (the series itself).
- :func:`carbon_by_class`: ``carbon.by_class_kg``, emissions of each class's runs.
- :func:`deadline_metrics`: ``deadline_jobs`` (jobs with a deadline) and ``deadline_misses``
  (those that finished after it, or never finished).
- :func:`sim_deadline`: deadlines for a trace that has none. A cluster file's
  ``settings: {sim_deadlines: {factor: K}}`` gives every job of a ``flexible`` class the
  deadline submit + its class SLA + K x its time limit (K = 0, the default: no deadlines): it
  may start as late as its SLA allows, and then take K times its limit to finish (a user
  knows a limit, not the runtime; with K = 2 a job may run in half the hours that follow).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from broker.energy.carbon_signals import AliasedSource, CarbonSignals
from broker.sim.energy import RunPiece, SimEnergy, stand_in
from policies.registry import declare_settings
from providers.catalog.zones import carbon_zone

DEADLINE_DEFAULTS = {"factor": 0.0}
declare_settings("sim_deadlines", DEADLINE_DEFAULTS)
#: Settings only the simulator reads: a real scheduler's configuration does not take them.
SIM_ONLY_SETTINGS = frozenset({"sim_deadlines"})
REFRESH_S = 900.0
HORIZON_S = 7 * 86400.0  # a perfect forecast of the whole window of a long job


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


def sim_deadline(settings: Mapping[str, Any], cls: Any, submit_s: float, limit_s: float
                 ) -> float | None:
    """A simulated job's deadline (see the module's doc); None: it has none."""
    factor = float(settings.get("sim_deadlines", {}).get("factor", 0.0))
    if factor <= 0 or cls is None or not cls.flexible:
        return None
    return submit_s + cls.sla_s + factor * limit_s
