"""``spillway simulate``: load a cluster and a trace, replay it under one or more policies."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.errors import ConfigError
from broker.model import parse_time
from broker.sim.cluster import Cluster, load_cluster
from broker.sim.engine import Simulation
from broker.sim.trace import busiest_window, load_trace, offered_load_gpus, scale_for
from broker.sim.types import SimResult, Trace
from policies.registry import BUNDLES, bundle


@dataclass(frozen=True)
class SimRequest:
    trace: str = "philly"
    fmt: str | None = None
    cluster: str = "examples/clusters/seed-160.yaml"
    policies: tuple[str, ...] = ("spillway",)
    start: str | None = None  # ISO 8601 or epoch seconds
    end: str | None = None
    busiest_days: float | None = None  # pick the busiest window of this many days
    load_scale: float | None = None
    target_load: float | None = None  # or: scale so offered load = this x capacity
    seed: int = 0
    check: bool = True


def _time(value: str | None, what: str) -> float | None:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as e:
        raise ConfigError(f"{what}: {e}") from None


def prepare(req: SimRequest) -> tuple[Cluster, Trace, dict[str, Any]]:
    """The cluster and the windowed, scaled trace a request describes."""
    if req.load_scale is not None and req.target_load is not None:
        raise ConfigError("--load-scale and --target-load: give one, not both")
    cluster = load_cluster(req.cluster)
    known = {*BUNDLES, *cluster.policies}
    unknown = [p for p in req.policies if p not in known]
    if unknown or not req.policies:
        raise ConfigError(f"--policy {','.join(unknown) or '(none)'}: unknown; allowed: "
                          f"{', '.join(sorted(known))} (comma-separated for several; the "
                          "cluster file's policies: builds more)")
    kw: dict[str, Any] = {"fmt": req.fmt, "seed": req.seed, "classes": cluster.classes,
                          "max_gpus_per_node": cluster.max_gpus_per_node}
    start, end = _time(req.start, "--from"), _time(req.end, "--to")
    meta: dict[str, Any] = {}
    if req.busiest_days is not None:
        if start is not None or end is not None:
            raise ConfigError("--busiest-days picks the window itself: drop --from/--to")
        whole = load_trace(req.trace, start=None, end=None, **kw)
        lo, hi, load = busiest_window(whole, req.busiest_days)
        start, end = whole.origin + lo, whole.origin + hi
        meta["busiest_window_offered_gpus"] = round(load, 1)
    trace = load_trace(req.trace, start=start, end=end, **kw)
    offered = offered_load_gpus(trace)
    scale = req.load_scale if req.load_scale is not None else 1.0
    if req.target_load is not None:
        if not (req.target_load > 0 and math.isfinite(req.target_load)):
            raise ConfigError(f"--target-load {req.target_load}: must be a number > 0 "
                              "(1.1 = 110% of the cluster's GPUs)")
        scale = scale_for(trace, cluster.capacity_gpus, req.target_load, offered_gpus=offered)
    if scale != 1.0:
        trace = load_trace(req.trace, start=start, end=end, load_scale=scale, **kw)
    meta.update({"window_start": start, "window_end": end, "load_scale": round(scale, 4),
                 "offered_gpus_as_recorded": round(offered, 1),
                 "offered_load": round(offered * scale / cluster.capacity_gpus, 3),
                 "capacity_gpus": cluster.capacity_gpus, "seed": req.seed})
    return cluster, trace, meta


def _run(req: SimRequest, policy: str,
         prepared: tuple[Cluster, Trace, dict[str, Any]]) -> SimResult:
    cluster, trace, meta = prepared
    result = Simulation(cluster, trace, bundle(policy, cluster.policies),
                        check_invariants=req.check).run()
    result.meta = {**result.meta, **meta}
    result.metrics["meta"] = result.meta
    return result


def _one(args: tuple[SimRequest, str]) -> SimResult:
    req, policy = args
    return _run(req, policy, prepare(req))  # in a worker process: load its own copy


def simulate(req: SimRequest, workers: int | None = None) -> list[SimResult]:
    """Run every policy of the request (in parallel processes when there are several)."""
    prepared = prepare(req)  # fails fast, in this process, on bad input
    jobs = [(req, p) for p in req.policies]
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    if workers <= 1 or len(jobs) == 1:
        return [_run(req, p, prepared) for p in req.policies]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_one, jobs))


def write_json(results: Sequence[SimResult], path: str | Path) -> None:
    data: Any = results[0].metrics if len(results) == 1 else {
        "runs": [r.metrics for r in results]}
    Path(path).write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
