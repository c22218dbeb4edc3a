"""``spillway simulate``: load a cluster and a trace, replay it under one or more policies."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import queue
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.errors import ConfigError
from broker.model import parse_time
from broker.sim.cluster import DEFAULT_CLUSTER, Cluster, load_cluster
from broker.sim.energy import SimEnergy
from broker.sim.engine import Progress, ProgressFn, Simulation
from broker.sim.trace import busiest_window, load_trace, offered_load_gpus, scale_for
from broker.sim.types import SimResult, Trace
from policies.registry import BUNDLES, bundle


@dataclass(frozen=True)
class SimRequest:
    trace: str = "philly"
    fmt: str | None = None
    cluster: str = DEFAULT_CLUSTER  # a shipped cluster's name, or a YAML file
    policies: tuple[str, ...] = ("spillway",)
    start: str | None = None  # ISO 8601 or epoch seconds
    end: str | None = None
    busiest_days: float | None = None  # pick the busiest window of this many days
    load_scale: float | None = None
    target_load: float | None = None  # or: scale so offered load = this x capacity
    seed: int = 0
    check: bool = True
    carbon: bool = True  # carbon_kg and cost_per_gpu_hour (broker/sim/energy.py)
    lower_bound: bool = False  # the lower_bound section (broker/sim/lower_bound_sim.py)
    lower_bound_slot_s: float = 900.0
    lower_bound_no_pause: bool = False  # also the bound in which unstopped jobs run whole
    oracle_runtimes: bool = False  # every estimate is the job's true runtime (an experiment)


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
    if req.lower_bound:
        _check_lower_bound(req)
    if req.busiest_days is not None:
        if not (req.busiest_days > 0 and math.isfinite(req.busiest_days)):
            raise ConfigError(f"--busiest-days {req.busiest_days:g}: must be a number of days "
                              "> 0 (2 = the busiest two days of the trace)")
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


def _run(req: SimRequest, policy: str, prepared: tuple[Cluster, Trace, dict[str, Any]],
         progress: ProgressFn | None = None) -> SimResult:
    cluster, trace, meta = prepared
    energy = SimEnergy.for_trace(trace.origin) if req.carbon else None
    result = Simulation(cluster, trace, bundle(policy, cluster.policies),
                        check_invariants=req.check, progress=progress, seed=req.seed,
                        energy=energy, oracle_runtimes=req.oracle_runtimes).run()
    if req.oracle_runtimes:
        meta = {**meta, "oracle_runtimes": True}
    result.meta = {**result.meta, **meta, "trace_origin": trace.origin,
                   "last_submit_s": trace.jobs[-1].submit_s if trace.jobs else 0.0}
    result.metrics["meta"] = result.meta
    if req.lower_bound:
        from broker.sim.lower_bound_sim import lower_bound_section

        result.metrics["lower_bound"] = lower_bound_section(
            cluster, trace, result, req.seed, energy, req.lower_bound_slot_s,
            no_pause=req.lower_bound_no_pause)
    return result


def _check_lower_bound(req: SimRequest) -> None:
    slot = req.lower_bound_slot_s
    if not (slot > 0 and math.isfinite(slot)):
        raise ConfigError(f"--lower-bound-slot {slot!r}: must be seconds > 0 (900 = 15 min)")
    try:
        import scipy.optimize  # noqa: F401
    except ImportError:
        raise ConfigError("--lower-bound needs scipy: pip install 'spillway[sim]'") from None


_PROGRESS_QUEUE: Any = None  # in a worker process: where its runs report their progress


def _init_worker(progress_queue: Any) -> None:
    global _PROGRESS_QUEUE
    _PROGRESS_QUEUE = progress_queue


def _one(args: tuple[SimRequest, str]) -> SimResult:
    req, policy = args
    q = _PROGRESS_QUEUE
    # in a worker process: load its own copy
    return _run(req, policy, prepare(req), None if q is None else q.put)


def simulate(req: SimRequest, workers: int | None = None,
             progress: ProgressFn | None = None) -> list[SimResult]:
    """Run every policy of the request (in parallel processes when there are several).
    ``progress``, if given, is called in this process a few times a second per run."""
    prepared = prepare(req)  # fails fast, in this process, on bad input
    jobs = [(req, p) for p in req.policies]
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    if workers <= 1 or len(jobs) == 1:
        return [_run(req, p, prepared, progress) for p in req.policies]
    ctx = multiprocessing.get_context()
    reports: Any = ctx.Queue() if progress is not None else None
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(reports,)) as pool:
        futures = [pool.submit(_one, job) for job in jobs]
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=0.1 if progress else None,
                              return_when=FIRST_COMPLETED)
            _drain(reports, progress)
        results = [f.result() for f in futures]
    _drain(reports, progress)
    return results


def _drain(reports: Any, progress: ProgressFn | None) -> None:
    if reports is None or progress is None:
        return
    while True:
        try:
            item: Progress = reports.get_nowait()
        except queue.Empty:
            return
        progress(item)


def write_json(results: Sequence[SimResult], path: str | Path) -> None:
    data: Any = results[0].metrics if len(results) == 1 else {
        "runs": [r.metrics for r in results]}
    Path(path).write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
