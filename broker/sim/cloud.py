"""Simulated clouds: a cluster file's ``cloud`` section, and the instances a run rents.

::

    cloud:
      catalog: null                # the offer catalog (providers/catalog); null: the shipped one
      spot_traces: DIR             # availability traces (default: the shared data folder's
                                   # spot_availability_cantbelate/availability/1-node; a
                                   # folder or file that is absent: no interruptions, noted)
      idle_timeout_s: 300          # an idle cloud node is released after this long
      sites:                       # one entry per provider region
        - provider: aws
          region: us-east-1
          zones: [us-east-1a, us-east-1c]      # spot zones kept (on-demand is regional)
          instance_types: [p3.2xlarge, p3.16xlarge]
          markets: [spot, ondemand]            # default: both
          quota_gpus: 64                       # GPUs rented at once in the region
          boot_s: [120, 300]                   # boot + agent registration, uniform in range
          notice_s: 120                        # spot interruption notice (AWS 2 min, GCP 30 s)
          availability: {us-east-1a: aws-02-15-2023/us-east-1a_v100_1.json}

Offers and prices come from the catalog. A spot zone's availability replays its trace (one
sample every ``gap_seconds``; 1 = no spot), from the trace's start at simulated time 0 plus
``seed`` x 7 days, wrapping around. A spot offer is listed ``available: False`` while its zone
has no spot (a launch there fails: the policies fail over); an instance running in a zone when
its availability drops gets the notice, and is gone ``notice_s`` later. Each offer's
``interruption_rate_per_hour`` is its trace's (interruptions per available hour).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from types import MappingProxyType
from typing import Any

from broker.cloud.spot_signals import Feed
from broker.cycle.plan import Launch
from broker.errors import ConfigError
from broker.model import Gpu, Instance, InstanceState, Node, NodeState, Offer

SITE_KEYS = ("provider", "region", "zones", "instance_types", "markets", "quota_gpus",
             "boot_s", "notice_s", "availability")
CLOUD_KEYS = ("catalog", "spot_traces", "idle_timeout_s", "sites")
WEEK = 7 * 86400.0


@dataclass(frozen=True)
class CloudSite:
    provider: str
    region: str
    zones: tuple[str, ...] = ()
    instance_types: tuple[str, ...] = ()
    markets: tuple[str, ...] = ("spot", "ondemand")
    quota_gpus: float | None = None
    boot_s: tuple[float, float] = (120.0, 300.0)
    notice_s: float = 120.0
    availability: Mapping[str, str] = field(default_factory=dict)  # zone -> trace file


@dataclass(frozen=True)
class CloudSpec:
    sites: tuple[CloudSite, ...]
    catalog: str | None = None
    spot_traces: str | None = None
    idle_timeout_s: float = 300.0


def _strs(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise ConfigError(f"{where}: must be a list of names, e.g. [us-east-1a]")
    return tuple(raw)


def _num(raw: Any, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not raw >= 0 \
            or not math.isfinite(raw):
        raise ConfigError(f"{where}: {raw!r} is not allowed; use a number >= 0")
    return float(raw)


def parse_cloud(raw: Any, where: str, base: Path | None = None) -> CloudSpec | None:
    """The ``cloud`` section (None when absent); ConfigError naming the key otherwise."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping with {', '.join(CLOUD_KEYS)}")
    unknown = sorted(str(k) for k in raw if k not in CLOUD_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; allowed: {', '.join(CLOUD_KEYS)}")
    sites_raw = raw.get("sites")
    if not isinstance(sites_raw, list) or not sites_raw:
        raise ConfigError(f"{where}.sites: is required, a list such as [{{provider: aws, "
                          "region: us-east-1}]")
    traces = raw.get("spot_traces")
    if traces is None:
        from providers.catalog.spot import DEFAULT_TRACES

        traces = str(DEFAULT_TRACES / "availability" / "1-node")
    elif base is not None and not Path(traces).is_absolute():
        traces = str((base / traces).resolve())
    return CloudSpec(tuple(_site(s, f"{where}.sites[{i}]") for i, s in enumerate(sites_raw)),
                     raw.get("catalog"), traces,
                     _num(raw.get("idle_timeout_s", 300.0), f"{where}.idle_timeout_s"))


def _site(raw: Any, where: str) -> CloudSite:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping with {', '.join(SITE_KEYS)}")
    unknown = sorted(str(k) for k in raw if k not in SITE_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; allowed: {', '.join(SITE_KEYS)}")
    for key in ("provider", "region"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ConfigError(f"{where}.{key}: is required, a name such as aws / us-east-1")
    markets = _strs(raw.get("markets", ["spot", "ondemand"]), f"{where}.markets")
    if not markets or any(m not in ("spot", "ondemand") for m in markets):
        raise ConfigError(f"{where}.markets: {list(markets)} is not allowed; use spot and/or "
                          "ondemand")
    boot = raw.get("boot_s", [120, 300])
    if not isinstance(boot, list) or len(boot) != 2:
        raise ConfigError(f"{where}.boot_s: {boot!r} is not allowed; use [low, high] seconds")
    lo, hi = (_num(b, f"{where}.boot_s") for b in boot)
    if hi < lo:
        raise ConfigError(f"{where}.boot_s: [{lo:g}, {hi:g}]: the low end is above the high")
    avail = raw.get("availability") or {}
    if not isinstance(avail, Mapping):
        raise ConfigError(f"{where}.availability: must map a zone to a trace file")
    quota = raw.get("quota_gpus")
    return CloudSite(raw["provider"], raw["region"], _strs(raw.get("zones"), f"{where}.zones"),
                     _strs(raw.get("instance_types"), f"{where}.instance_types"), markets,
                     None if quota is None else _num(quota, f"{where}.quota_gpus"), (lo, hi),
                     _num(raw.get("notice_s", 120.0), f"{where}.notice_s"),
                     MappingProxyType({str(k): str(v) for k, v in avail.items()}))


# ------------------------------------------------------------------------------------- runtime


@dataclass
class _Zone:
    available: tuple[bool, ...]
    gap_s: float
    offset_s: float
    rate_per_hour: float

    def up(self, t: float) -> bool:
        return self.available[int((t + self.offset_s) // self.gap_s) % len(self.available)]

    def next_down(self, t: float, horizon: float = 400 * 86400.0) -> float:
        """The first time >= t the zone has no spot (inf if never within the horizon)."""
        i = int((t + self.offset_s) // self.gap_s)
        n = len(self.available)
        for k in range(i, i + min(n, int(horizon // self.gap_s) + 1)):
            if not self.available[k % n]:
                return max(t, k * self.gap_s - self.offset_s)
        return math.inf


@dataclass
class SimInstance:
    record: Instance
    offer: Offer
    site: CloudSite
    ready_at: float
    node: Node | None = None
    busy: int = 0  # GPUs held by jobs
    idle_since: float = 0.0
    busy_gpu_s: float = 0.0
    busy_mark: float = 0.0
    idle_s: float = 0.0
    low_since: float | None = None  # under half busy since (None: at least half busy)
    for_jobs: frozenset[str] = frozenset()  # the jobs it was launched for


class Clouds:
    """The rented instances of one run, their nodes, interruptions and cost."""

    def __init__(self, spec: CloudSpec, seed: int = 0) -> None:
        from providers.catalog import load_catalog  # (the simulator's only provider import)

        self.spec, self.rng = spec, random.Random(seed)
        catalog = load_catalog(spec.catalog)
        self.notes: list[str] = []
        self.zones: dict[tuple[str, str], _Zone] = {}
        self._missing: set[tuple[str, str]] = set()  # zones whose trace was not found
        self.base_offers: list[tuple[Offer, CloudSite]] = []
        for site in spec.sites:
            self._load_site(site, catalog, seed)
        self.instances: dict[str, SimInstance] = {}
        # those not yet ended, in launch order: what records() walks each cycle (two months
        # launch tens of thousands of instances; a cycle sees the few dozen alive)
        self._live: dict[str, SimInstance] = {}
        self.launches = self.failed_launches = self.interruptions = 0
        self._offers_at: tuple[float, tuple[Offer, ...]] | None = None

    def _load_site(self, site: CloudSite, catalog: Any, seed: int) -> None:
        from providers.base import Resources

        for o in catalog.offers(site.provider, Resources(gpu_count=1)):
            if o.region != site.region or o.market.value not in site.markets:
                continue
            if site.instance_types and o.instance_type not in site.instance_types:
                continue
            if o.zone and site.zones and o.zone not in site.zones:
                continue
            extra = {**o.extra, "boot_s": sum(site.boot_s) / 2,
                     "region_quota_gpus": site.quota_gpus, "notice_s": site.notice_s}
            if o.market.value == "spot":
                zone = self._zone(site, o.zone, seed)
                extra["interruption_rate_per_hour"] = zone.rate_per_hour if zone else 0.0
            self.base_offers.append((replace(o, extra=extra), site))
        if not any(s is site for _, s in self.base_offers):
            raise ConfigError(f"cloud site {site.provider}:{site.region}: the catalog has no "
                              f"offer for instance types {list(site.instance_types)} there")

    def _zone(self, site: CloudSite, zone: str, seed: int) -> _Zone | None:
        key = (site.provider, zone)
        if key in self.zones:
            return self.zones[key]
        rel = site.availability.get(zone)
        folder = self.spec.spot_traces
        if rel is None or folder is None or not (Path(folder) / rel).is_file():
            if rel is not None and key not in self._missing:  # (one note per zone)
                self._missing.add(key)
                self.notes.append(f"spot trace {rel} for {site.provider}:{zone} not found "
                                  f"under {folder}: spot is always there, no interruptions")
            return None
        doc = json.loads((Path(folder) / rel).read_text(encoding="utf-8"))
        avail = tuple(not bool(v) for v in doc["data"])
        gap = float(doc["metadata"]["gap_seconds"])
        flips = sum(a and not b for a, b in pairwise(avail))
        held_h = sum(avail) * gap / 3600
        z = self.zones[key] = _Zone(avail, gap, seed * WEEK, flips / held_h if held_h else 0.0)
        return z

    # -- what the cycle sees ------------------------------------------------------------

    def offers(self, now: float) -> tuple[Offer, ...]:
        """The offers, spot ones marked unavailable while their zone has none."""
        if self._offers_at is not None and self._offers_at[0] == now:
            return self._offers_at[1]
        out = []
        for o, site in self.base_offers:
            z = self.zones.get((site.provider, o.zone)) if o.market.value == "spot" else None
            up = z is None or z.up(now)
            out.append(o if up else replace(o, extra={**o.extra, "available": False}))
        self._offers_at = (now, tuple(out))
        return self._offers_at[1]

    def feed(self, key: str) -> Feed | None:
        """The replayed availability of spot zone ``provider:zone`` (broker/cloud/spot_signals.py),
        None for a zone without a trace."""
        provider, _, zone = key.partition(":")
        z = self.zones.get((provider, zone))
        return None if z is None else Feed(z.gap_s, (-z.offset_s) % z.gap_s, z.up)

    def records(self) -> tuple[Instance, ...]:
        """The instances not ended, in launch order (those found ended leave the live set)."""
        out = []
        for pid, inst in list(self._live.items()):
            if inst.record.ended:
                del self._live[pid]
            else:
                out.append(inst.record)
        return tuple(out)

    # -- lifecycle ------------------------------------------------------------------------

    def launch(self, launch: Launch, now: float) -> list[SimInstance]:
        """Start the instances of a launch; those that will boot (the caller schedules them).
        A request id seen before is not launched again (idempotent, as providers are)."""
        by_id = {o.id: (o, s) for o, s in self.base_offers}
        if launch.offer_id not in by_id:
            return []
        offer, site = by_id[launch.offer_id]
        out = []
        for k in range(launch.count):
            pid = f"{launch.request_id}-{k}"
            if pid in self.instances:
                continue
            rec = Instance(launch.request_id, offer.id, provider_id=pid, requested_at=now,
                           price_per_hour=offer.price_per_hour, for_jobs=launch.for_jobs)
            z = self.zones.get((site.provider, offer.zone)) if offer.market.value == "spot" \
                else None
            self.launches += 1
            if z is not None and not z.up(now):
                self.failed_launches += 1
                rec = rec.moved(InstanceState.FAILED, now, "no spot capacity in the zone")
                self.instances[pid] = SimInstance(rec, offer, site, now)
                continue
            boot = self.rng.uniform(*site.boot_s)
            rec = rec.moved(InstanceState.BOOTING, now, "accepted")
            inst = self.instances[pid] = SimInstance(rec, offer, site, now + boot,
                                                     for_jobs=frozenset(launch.for_jobs))
            self._live[pid] = inst
            out.append(inst)
        return out

    def boot(self, pid: str, now: float) -> SimInstance | None:
        inst = self.instances.get(pid)
        if inst is None or inst.record.state is not InstanceState.BOOTING:
            return None
        o = inst.offer
        node_id = f"{o.provider}-{pid.removeprefix('burst-')}"
        gpus = tuple(Gpu(f"GPU-{node_id}-{i}", i, o.gpu_model, o.gpu_memory_gb)
                     for i in range(o.gpu_count))
        inst.node = Node(node_id, gpus, site=o.site.id, hostname=node_id,
                         state=NodeState.READY, labels={"instance": pid})
        inst.record = inst.record.moved(InstanceState.READY, now, "agent registered",
                                        node_id=node_id)
        inst.idle_since = inst.busy_mark = inst.low_since = now
        return inst

    def next_interruption(self, inst: SimInstance, now: float) -> float:
        z = self.zones.get((inst.site.provider, inst.offer.zone)) \
            if inst.offer.market.value == "spot" else None
        return math.inf if z is None else z.next_down(now)

    def job_moved(self, inst: SimInstance, gpus: int, now: float) -> None:
        """``gpus`` (+ started, - left) on the instance's node at ``now``."""
        if inst.busy > 0:
            inst.busy_gpu_s += inst.busy * (now - inst.busy_mark)
        elif inst.node is not None:
            inst.idle_s += now - inst.busy_mark
        inst.busy_mark = now
        inst.busy += gpus
        if inst.busy == 0:
            inst.idle_since = now

    def end(self, inst: SimInstance, now: float, reason: str,
            to: InstanceState = InstanceState.TERMINATED) -> None:
        if inst.record.ended:
            return
        if inst.record.state is InstanceState.READY and to is InstanceState.TERMINATED \
                and reason.startswith("spot"):
            inst.record = inst.record.moved(InstanceState.DRAINING, now, reason)
        self.job_moved(inst, 0, now)
        inst.record = inst.record.moved(to, now, reason)

    # -- what it cost -----------------------------------------------------------------------

    def metrics(self, horizon: float) -> dict[str, Any]:
        cost = gpu_h = idle_h = 0.0
        sites: dict[str, dict[str, float]] = {}
        for inst in self.instances.values():
            end = inst.record.ended_at if inst.record.ended_at is not None else horizon
            hours = max(0.0, end - inst.record.requested_at) / 3600
            c = inst.offer.price_per_hour * hours
            busy = inst.busy_gpu_s / 3600
            idle = inst.idle_s / 3600 + max(0.0, (inst.ready_at if inst.node else end)
                                            - inst.record.requested_at) / 3600
            cost, gpu_h, idle_h = cost + c, gpu_h + hours * inst.offer.gpu_count, idle_h + idle
            s = sites.setdefault(inst.offer.site.id, {"gpu_hours": 0.0, "busy_gpu_hours": 0.0,
                                                      "cost_usd": 0.0, "instances": 0})
            s["gpu_hours"] += hours * inst.offer.gpu_count
            s["busy_gpu_hours"] += busy
            s["cost_usd"] += c
            s["instances"] += 1
        for s in sites.values():
            s["utilization"] = s["busy_gpu_hours"] / s["gpu_hours"] if s["gpu_hours"] else 0.0
            for k in ("gpu_hours", "busy_gpu_hours", "cost_usd", "utilization"):
                s[k] = round(s[k], 4 if k == "utilization" else 2)
        return {"cloud_cost_usd": round(cost, 2), "cloud_gpu_hours": round(gpu_h, 2),
                "idle_instance_hours": round(idle_h, 2), "bursts": self.launches,
                "failed_launches": self.failed_launches,
                "spot_interruptions": self.interruptions, "sites": dict(sorted(sites.items())),
                "cloud_notes": list(self.notes)}
