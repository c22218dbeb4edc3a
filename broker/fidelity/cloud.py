"""Cloud sites in the fidelity run: the cluster file's cloud sites as local providers on the
real side, the simulator's cloud model on the other, and the figures compared.

The simulator's offers for the cluster's cloud sites (the catalog's offers there, with their
prices) become one ``local`` provider each (providers/local.py: a rented machine is a
``spillway worker`` process group started after a boot delay), with the same site, instance
type, GPUs and price, and the ``extra`` the policies read (``boot_s``, ``region_quota_gpus``,
``interruption_rate_per_hour``). A provider with one offer keeps its name, so both worlds have
the same offer ids; a provider with several gets ``<provider>-<n>`` names (their ids then
differ, and each one's ``region_quota_gpus`` is its own pool: a gap, documented).

Scaled by K as everything else: the boot time, the spot notice and the idle timeout. The
local provider boots every machine in one fixed delay, so both worlds boot in the middle of
the site's ``boot_s`` range. Spot interruptions are off in both (each site's availability
traces are dropped; the offers' interruption rate is 0): the local provider has no notices.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from broker.model import Instance, InstanceState, Offer
from broker.model.state import JobState
from broker.sim.cloud import Clouds, CloudSpec
from broker.sim.cluster import Cluster

CLUSTER_NAME = "fidelity"  # the real run's cluster_name (it tags every machine)
CLOUD_KEYS = ("cloud_cost_usd", "bursts", "cloud_gpu_hours")
_MEM = re.compile(r"-\d+GB$")
_EXTRA = ("boot_s", "region_quota_gpus", "notice_s", "interruption_rate_per_hour")


def scale_cloud(cluster: Cluster, k: float) -> Cluster:
    """The cloud section with its durations divided by ``k``, each site's boot time fixed at
    the middle of its range, and spot interruptions off (no availability traces)."""
    spec = cluster.cloud
    if spec is None:
        return cluster
    sites = []
    for s in spec.sites:
        mid = (s.boot_s[0] + s.boot_s[1]) / 2 / k
        sites.append(replace(s, boot_s=(mid, mid), notice_s=s.notice_s / k,
                             availability=MappingProxyType({})))
    return replace(cluster, cloud=CloudSpec(tuple(sites), spec.catalog, spec.spot_traces,
                                            spec.idle_timeout_s / k))


def sim_offers(spec: CloudSpec) -> list[Offer]:
    """The simulator's offers for these sites (as its ``Clouds`` lists them)."""
    return [o for o, _ in Clouds(spec, 0).base_offers]


def _names(offers: list[Offer]) -> list[str]:
    count = Counter(o.provider for o in offers)
    seen: Counter[str] = Counter()
    out = []
    for o in offers:
        seen[o.provider] += 1
        out.append(o.provider if count[o.provider] == 1 else f"{o.provider}-{seen[o.provider]}")
    return out


def local_providers(spec: CloudSpec, state_dir: Path) -> dict[str, dict[str, Any]]:
    """The real run's ``providers:`` section: one local provider per simulator offer."""
    offers = sim_offers(spec)
    out: dict[str, dict[str, Any]] = {}
    for name, o in zip(_names(offers), offers):
        model = o.gpu_model if _MEM.search(o.gpu_model) or not o.gpu_memory_gb \
            else f"{o.gpu_model}-{o.gpu_memory_gb:g}GB"
        boot = float(o.extra.get("boot_s", 0.0))
        quota = o.extra.get("region_quota_gpus")
        out[name] = {
            "kind": "local", "gpus": f"{o.gpu_count}x{model}", "region": o.region,
            "zone": o.zone, "market": o.market.value, "instance_type": o.instance_type,
            "price_per_hour": o.price_per_hour, "boot_delay_s": boot,
            "cpus": float(o.extra.get("vcpus", 8) or 8),
            "memory_gb": float(o.extra.get("memory_gb", 32) or 32),
            "stop_timeout_s": 5.0, "state_dir": str(state_dir),
            "idle_timeout_s": spec.idle_timeout_s,
            "boot_timeout_s": max(120.0, 20 * boot),  # (not modelled: never reached here)
            "cooldown_s": 1.0,
            "max_instances": int(quota // o.gpu_count) if quota else 1000,
            "offer_extra": {key: o.extra[key] for key in _EXTRA
                            if o.extra.get(key) is not None},
        }
    return out


def real_offer_ids(spec: CloudSpec) -> dict[str, Offer]:
    """A real offer id -> the simulator's offer it stands for."""
    offers = sim_offers(spec)
    return {f"{name}:{o.id.split(':', 1)[1]}": o for name, o in zip(_names(offers), offers)}


def job_sites(cluster: Cluster, priority: str) -> list[str]:
    """A job's ``sites``, as the simulator gives them (broker/sim/cloudrun.py): the cloud too
    when its class may burst, spot too when it allows spot."""
    c = next((c for c in cluster.classes if c.name == priority), None)
    if cluster.cloud is None or c is None or not c.may_burst:
        return ["onprem"]
    return ["onprem", "cloud", "spot"] if c.spot_allowed else ["onprem", "cloud"]


def figures(instances: Iterable[Instance], offers: Mapping[str, Offer], origin: float,
            k: float, horizon: float) -> dict[str, float]:
    """Cloud cost, launches and GPU-hours of one world, cut at ``horizon`` (trace seconds;
    times are ``(t - origin) * k``), as the simulator counts them: a machine costs its price
    from its launch request to its end; every launch counts, a failed one included."""
    cost = gpu_h = 0.0
    bursts = 0
    for inst in instances:
        start = (inst.requested_at - origin) * k
        if start > horizon:
            continue
        end = horizon if inst.ended_at is None else min(horizon, (inst.ended_at - origin) * k)
        hours = max(0.0, end - start) / 3600
        o = offers.get(inst.offer_id)
        bursts += 1
        if o is not None:
            cost += o.price_per_hour * hours
            gpu_h += o.gpu_count * hours
    return {"cloud_cost_usd": round(cost, 2), "bursts": bursts,
            "cloud_gpu_hours": round(gpu_h, 2)}


def on_cloud(jobs: Mapping[str, Any], cloud_nodes: set[str], origin: float, k: float,
             horizon: float) -> dict[str, bool]:
    """Trace id -> whether its first attempt (started by the horizon) ran on a cloud node."""
    out = {}
    for tid, job in jobs.items():
        started = any(h.state is JobState.STARTING and (h.time - origin) * k <= horizon
                      for h in job.history)
        if started and job.attempts:
            out[tid] = any(a.node_id in cloud_nodes for a in job.attempts[0].allocations)
    return out


def site_agreement(real: Mapping[str, bool], sim: Mapping[str, bool]) -> dict[str, Any]:
    """Per job: where its first attempt ran (on-prem or cloud) in both worlds."""
    both = sorted(set(real) & set(sim))
    differ = [t for t in both if real[t] != sim[t]]
    return {"compared": len(both), "same_site": len(both) - len(differ),
            "on_cloud_real": sum(real.values()), "on_cloud_sim": sum(sim.values()),
            "cloud_real_only": sum(1 for t in differ if real[t]),
            "cloud_sim_only": sum(1 for t in differ if sim[t]), "differ": differ[:20]}


def measured(instances: Iterable[Instance], registered: Mapping[str, float],
             jobs: Iterable[Any], offers: Mapping[str, Offer], idle_timeout_s: float
             ) -> dict[str, list[float]]:
    """The real run's cloud delays (real seconds), from its instance records, the first
    heartbeat of each cloud node (``registered``: node id -> time), the jobs' histories and
    the offers (real id -> the simulator's, whose ``boot_s`` the machine waited):
    ``launch`` (request -> the provider started the machine), ``register`` (booted -> its
    agent's first heartbeat), ``release`` (idle timeout over -> the machine given back)."""
    launch, register, release = [], [], []
    last_end: dict[str, float] = {}
    for job in jobs:
        for att in job.attempts:
            for a in att.allocations:
                if att.ended_at is not None:
                    last_end[a.node_id] = max(last_end.get(a.node_id, 0.0), att.ended_at)
    for inst in instances:
        booting = next((h.time for h in inst.history if h.state is InstanceState.BOOTING), None)
        if booting is None:
            continue
        launch.append(booting - inst.requested_at)
        reg = registered.get(inst.node_id) if inst.node_id else None
        if reg is not None:
            o = offers.get(inst.offer_id)
            register.append(reg - booting - float(o.extra.get("boot_s", 0.0) if o else 0.0))
            idle_from = max(last_end.get(inst.node_id, reg), reg) + idle_timeout_s
            if inst.ended_at is not None and "idle" in " ".join(h.reason for h in inst.history):
                release.append(inst.ended_at - idle_from)
    return {"launch": launch, "register": register, "release": release}


def stop_machines(providers: Mapping[str, Mapping[str, Any]]) -> int:
    """Terminate every machine the run's local providers left (a service killed before it
    released them); returns how many."""
    from providers.local import LocalProvider

    n = 0
    for name, cfg in providers.items():
        opts = {k: v for k, v in cfg.items() if k in (
            "gpus", "region", "zone", "market", "instance_type", "state_dir")}
        with contextlib.suppress(Exception):
            p = LocalProvider(name, CLUSTER_NAME, **opts, stop_timeout_s=2.0)
            live = [m for m, v in p.instances().items() if v.state is not InstanceState.TERMINATED]
            p.terminate(live)
            n += len(live)
    return n



def cloud_nodes(world: Any) -> set[str]:
    """The cloud nodes of a world: a RealResult's (its records and the nodes seen beating)
    or a simulation's (its instances')."""
    if hasattr(world, "registered"):
        return {i.node_id for i in world.instances if i.node_id} | set(world.registered)
    run = getattr(world, "cloud", None)
    return set() if run is None else {i.record.node_id for i in run.clouds.instances.values()
                                      if i.record.node_id}


def as_cloud(views: Mapping[str, Any], nodes: set[str]) -> dict[str, Any]:
    """Job views with every cloud node named ``cloud``: machines have other names in each
    world (the provider's id, the simulator's), so per job only on-prem vs cloud compares."""
    if not nodes:
        return dict(views)
    return {i: replace(v, nodes=tuple("cloud" if n in nodes else n for n in v.nodes))
            for i, v in views.items()}


def rows(instances: Iterable[Instance], origin: float, k: float) -> list[dict[str, Any]]:
    """Each machine of a world (trace seconds): launch request, ready, end, last reason."""
    def t(x: float | None) -> float | None:
        return None if x is None else round((x - origin) * k, 1)

    return [{"requested": t(i.requested_at), "ready": t(i.ready_at), "ended": t(i.ended_at),
             "state": i.state.value, "reason": i.history[-1].reason if i.history else ""}
            for i in sorted(instances, key=lambda i: i.requested_at)]
