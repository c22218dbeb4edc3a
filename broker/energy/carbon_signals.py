"""Carbon signals for snapshots: what ``Snapshot.carbon`` and ``Snapshot.carbon_forecast`` hold.

One :class:`CarbonSignals` sits beside a scheduler's snapshot builder (broker/cycle/snapshots.py)
and
beside the simulator's: both put the signals into their snapshots through :meth:`dress`, the
one function that does so.

- **Where from**: a :class:`~providers.carbon.base.CarbonSource` (production:
  ``build_source(config.carbon)``; the simulator: its CSV series moved onto the trace's year),
  asked through :func:`providers.carbon.base.signals` for each zone: the intensity now and the
  forecast steps over ``horizon_s``.
- **Which zones**: those of the snapshot's nodes' sites (on-prem sites from ``energy.sites``'
  ``carbon_zone``, cloud sites from the region table), of its offers, and any given up front.
- **Off the hot path**: the signals are cached and fetched again at most every ``refresh_s``
  seconds. With ``background=True`` (a scheduler) the fetch runs in a daemon thread and a cycle
  only reads what the last fetch left: a slow web source never stalls a cycle (the first
  cycles after a start may have no forecast yet, and then nothing is deferred). With
  ``background=False`` (the simulator, tests) it is fetched in line at the snapshot's time, so
  runs are deterministic.
- **Failures**: a source falls back by itself (last known value, yearly average, with a
  warning; providers/carbon/http.py); a zone it still cannot answer is left out. Anything else
  a fetch raises is logged and the last signals are kept: a cycle never breaks on carbon.
- **Time**: ``offset`` is the epoch second of the snapshot's ``now == 0`` (the simulator's
  trace origin; 0 in production). Forecast steps are returned in snapshot time.
- **Sites**: the snapshot's ``sites`` gain the nodes' sites with their carbon zone, which the
  ``carbon`` defer policy reads (policies/carbon/defer.py ``zone_of``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from broker.cycle.plan import Snapshot
from broker.model import Site
from providers.carbon.averages import yearly_average
from providers.carbon.base import CarbonError, CarbonSource, signals
from providers.catalog.zones import site_zone

log = logging.getLogger("spillway.carbon")

Forecasts = dict[str, tuple[tuple[float, float], ...]]


class AliasedSource:
    """A source that answers zone ``z`` with the series of ``alias(z)`` (the simulator's
    stand-ins for zones its series do not cover; broker/sim/energy.py ``stand_in``)."""

    def __init__(self, inner: CarbonSource, alias: Callable[[str], str]) -> None:
        self.inner, self.alias = inner, alias
        self.name = f"{inner.name} (stand-ins)"

    def intensity(self, zone: str, at: float) -> float:
        return self.inner.intensity(self.alias(zone), at)

    def forecast(self, zone: str, start: float, end: float) -> list[tuple[float, float]]:
        return self.inner.forecast(self.alias(zone), start, end)


class CarbonSignals:
    """The cached carbon signals of a scheduler or a simulation (see the module's doc)."""

    def __init__(self, source: CarbonSource, *, onprem_zones: Mapping[str, str] | None = None,
                 zones: Iterable[str] = (), horizon_s: float = 2 * 86400.0,
                 refresh_s: float = 900.0, offset: float = 0.0, background: bool = True,
                 clock: Callable[[], float] = time.time) -> None:
        if not (horizon_s > 0 and refresh_s >= 0):
            raise ValueError(f"carbon signals: horizon_s {horizon_s!r} must be > 0 and "
                             f"refresh_s {refresh_s!r} >= 0")
        self.source = source
        self.onprem_zones = dict(onprem_zones or {})
        self.zones = set(zones) - {""}
        self.horizon_s, self.refresh_s, self.offset = horizon_s, refresh_s, offset
        self.background, self.clock = background, clock
        self.now_g: dict[str, float] = {}
        self.forecasts: Forecasts = {}
        self.fetched_at: float | None = None  # snapshot time of the last fetch
        self.fetched_zones: frozenset[str] = frozenset()
        self.fetches = self.failures = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # -- the zones a snapshot needs -----------------------------------------------------

    def zone_of(self, site: str) -> str:
        return site_zone(site, self.onprem_zones)

    def wanted(self, snap: Snapshot) -> frozenset[str]:
        sites = {n.site for n in snap.nodes} | {str(s) for s in snap.sites}
        found = {self.zone_of(s) for s in sites} | {o.carbon_zone for o in snap.offers}
        found |= {s.carbon_zone for s in snap.sites}
        return frozenset((found | self.zones) - {""})

    # -- fetching ------------------------------------------------------------------------

    def _stale(self, now: float, zones: frozenset[str]) -> bool:
        return (self.fetched_at is None or now - self.fetched_at >= self.refresh_s
                or now < self.fetched_at or not zones <= self.fetched_zones)

    def fetch(self, now: float, zones: frozenset[str]) -> None:
        """Ask the source now (snapshot time ``now``); keep the last signals if it fails."""
        at = now + self.offset
        try:
            now_g, ahead = signals(self.source, zones, at, self.horizon_s)
        except (CarbonError, ValueError, OSError, RuntimeError) as e:
            # (the sources fall back by themselves; this is the last guard)
            self.failures += 1
            log.warning("carbon signals from %s failed (%s); keeping the last ones",
                        getattr(self.source, "name", "source"), e)
            with self._lock:
                self.fetched_at = now  # try again after refresh_s, not at every cycle
            return
        moved = {z: tuple((t - self.offset, g) for t, g in steps) for z, steps in ahead.items()}
        with self._lock:
            self.now_g.update(now_g)
            self.forecasts.update(moved)
            self.fetched_at, self.fetched_zones = now, zones
            self.fetches += 1

    def _fetch_in_background(self, now: float, zones: frozenset[str]) -> None:
        if self._thread is not None and self._thread.is_alive():
            return  # one fetch at a time; the cycle goes on with what it has

        def run() -> None:
            try:
                self.fetch(now, zones)
            except Exception:
                log.exception("carbon signals: the fetch failed")

        self._thread = threading.Thread(target=run, name="carbon-signals", daemon=True)
        self._thread.start()

    def wait_idle(self, timeout_s: float) -> bool:
        """True once no background fetch is running (tests; a scheduler never waits)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        return thread is None or not thread.is_alive()

    # -- what a snapshot carries ----------------------------------------------------------

    def current(self, now: float, zones: frozenset[str]) -> tuple[dict[str, float], Forecasts]:
        """Per zone: the intensity at ``now`` and the forecast steps from the step holding
        at ``now`` (fetched now if stale and not in the background)."""
        if self._stale(now, zones):
            if self.background:
                self._fetch_in_background(now, zones)
            else:
                self.fetch(now, zones)
        with self._lock:
            forecasts, now_g = dict(self.forecasts), dict(self.now_g)
        out: Forecasts = {}
        carbon: dict[str, float] = {}
        for zone in zones:
            steps = forecasts.get(zone)
            if not steps:
                continue
            first = 0
            while first + 1 < len(steps) and steps[first + 1][0] <= now:
                first += 1
            out[zone] = steps[first:]
            carbon[zone] = steps[first][1] if steps[first][0] <= now else now_g.get(
                zone, steps[first][1])
        return carbon, out

    def dress(self, snap: Snapshot) -> Snapshot:
        """``snap`` with its carbon signals and its nodes' sites with their carbon zones.
        Never raises for the source's sake: without signals, the snapshot is unchanged."""
        zones = self.wanted(snap)
        if not zones:
            return snap
        carbon, forecast = self.current(snap.now, zones)
        for zone in zones:  # a zone the source knows nothing of: its yearly average, if any
            if zone not in carbon and zone not in forecast and zone not in snap.carbon:
                average = yearly_average(zone)
                if average is not None:
                    carbon[zone] = average
        have = {str(s): s for s in snap.sites}
        sites = list(snap.sites)
        for name in sorted({n.site for n in snap.nodes} - set(have)):
            try:
                sites.append(Site.parse(name, self.zone_of(name)))
            except ValueError:
                continue  # a node's site that is not a site id: nothing to attach a zone to
        sites = [s if s.carbon_zone else _with_zone(s, self.zone_of(str(s))) for s in sites]
        return replace(snap, sites=tuple(sites), carbon={**snap.carbon, **carbon},
                       carbon_forecast={**snap.carbon_forecast, **forecast})


def _with_zone(site: Site, zone: str) -> Site:
    return replace(site, carbon_zone=zone) if zone else site


def from_config(config: Any, *, background: bool = True) -> CarbonSignals | None:
    """The signals a scheduler reads: ``build_source(config.carbon)`` (None when no source is
    configured), on-prem zones from ``energy.sites``, fetched again at most every
    ``carbon.cache_ttl_s`` seconds (at least a minute), over the next two days."""
    from broker.config.energy import build_source

    source = build_source(config.carbon)
    if source is None:
        return None
    return CarbonSignals(source, onprem_zones=config.energy.zones(),
                         refresh_s=max(60.0, float(config.carbon.cache_ttl_s)),
                         background=background)
