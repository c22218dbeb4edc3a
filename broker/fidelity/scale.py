"""Time scaling: a trace window and its configuration with every duration divided by K.

A one-hour job becomes a 3.6-second job at K = 1000; so do the gaps between arrivals, the
time limits, the classes' SLAs, ``grace_s``, ``min_runtime_s``, the fair-share half-life and
every policy setting measured in seconds (the ``*_s`` keys each policy declares). What is
scaled is the workload and the policy's view of time; the machinery's own timings
(``heartbeat_s``, ``cycle_s``, ``lease_ttl_s``, ...) are the real system's and stay as they
are: how much they matter at a given K is what the fidelity run measures.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from broker.config.core import CLUSTER_CONFIG_KEYS, Config
from broker.errors import ConfigError
from broker.model import Node
from broker.sim.carbon_metrics import SIM_ONLY_SETTINGS
from broker.sim.cluster import Cluster
from broker.sim.types import Trace
from policies.registry import declared_settings


def check_k(k: float) -> float:
    if not (isinstance(k, (int, float)) and math.isfinite(k) and k >= 1):
        raise ConfigError(f"--time-scale {k!r}: must be a number >= 1 (100 runs a one-hour "
                          "job in 36 s)")
    return float(k)


def scale_trace(trace: Trace, k: float) -> Trace:
    """Every arrival time, duration and time limit divided by ``k``."""
    jobs = tuple(replace(j, submit_s=j.submit_s / k, duration_s=j.duration_s / k,
                         time_limit_s=j.time_limit_s / k) for j in trace.jobs)
    return replace(trace, jobs=jobs, notes=(*trace.notes, f"time scale {k:g}: every duration "
                                            f"and arrival gap divided by {k:g}"))


def _scaled_section(values: Mapping[str, Any], given: Mapping[str, Any], k: float
                    ) -> dict[str, Any]:
    out = dict(given)
    for key, default in values.items():
        value = given.get(key, default)
        if key.endswith("_s") and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            out[key] = value / k
    return out


def scale_cluster(cluster: Cluster, k: float) -> Cluster:
    """The classes' SLAs, the three configuration durations and every policy's ``*_s``
    settings (given in the cluster file, else their declared defaults) divided by ``k``."""
    settings: dict[str, Any] = dict(cluster.settings)
    base = Config()
    for key in CLUSTER_CONFIG_KEYS:
        settings[key] = float(settings.get(key, getattr(base, key))) / k
    for name, declared in declared_settings().items():
        given = settings.get(name) or {}
        settings[name] = _scaled_section(declared, given, k)
    classes = tuple(replace(c, sla_s=c.sla_s / k) for c in cluster.classes)
    return replace(cluster, classes=classes, settings=MappingProxyType(settings))


def inventory_text(node: Node) -> str:
    """The ``--gpus`` text of a worker with the node's GPUs (``8xV100-32GB``)."""
    if any(g.mig_profile is not None or g.mig_enabled for g in node.gpus):
        raise ConfigError(f"--cluster: node {node.id} has MIG GPUs; the fidelity run starts "
                          "agents with --gpus COUNTxMODEL, which has no MIG: use a cluster "
                          "without MIG layouts")
    counts = Counter(g.model for g in node.gpus)
    return ",".join(f"{n}x{model}" for model, n in counts.items())


def real_config(cluster: Cluster, policy: str) -> dict[str, Any]:
    """The configuration file of the real system for a (scaled) cluster and a policy."""
    own = {k: v for k, v in cluster.settings.items() if k in CLUSTER_CONFIG_KEYS}
    return {
        "policy": policy,
        "classes": [{"name": c.name, "rank": c.rank, "sla_s": c.sla_s,
                     "may_preempt": c.may_preempt, "preemptible": c.preemptible,
                     "may_burst": c.may_burst, "spot_allowed": c.spot_allowed}
                    for c in cluster.classes],
        "teams": [{"name": t.name, "weight": t.weight, "quota_gpus": t.quota_gpus}
                  for t in cluster.teams],
        "policy_settings": {k: v for k, v in cluster.settings.items()
                            if k not in CLUSTER_CONFIG_KEYS and k not in SIM_ONLY_SETTINGS},
        "metrics_port": 0,
        "agent_metrics_port": 0,
        **own,
    }
