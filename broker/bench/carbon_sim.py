"""The carbon-shift scenario through the simulator: ``spillway bench carbon-shift --through-sim``.

The same jobs as :mod:`broker.bench.carbon`, submitted to the simulator
(:class:`broker.sim.engine.Simulation`: the in-memory store, ``run_cycle`` at every event) with
the ``carbon`` defer policy and the job's deadline in its spec. Every snapshot carries the
zone's forecast in half-hour steps (from one step before now, for the policy's smoothing, to
ten days ahead). Jobs that wait are deferred by the cycle (``DeferredForCarbon``); checkpointed
ones are also paused (eviction kind ``carbon``) and resumed. Stops take no time here (the
paper's jobs checkpoint instantly). Emissions are the true series over the simulator's run
pieces. The cluster has a GPU for every job, as the paper's data centre never runs out.

It is slower than the bench's own replay (every cycle re-plans every waiting job), so it is
meant for slices (``--days``); on a slice both give the same emissions (tests).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from broker.cycle.plan import Snapshot
from broker.model import Gpu, Node, NodeState, PriorityClass, Site
from broker.sim.cluster import Cluster
from broker.sim.engine import Simulation
from broker.sim.types import Trace, TraceJob
from policies.registry import PolicySet

STEP = 1800.0
HORIZON_STEPS = 10 * 48  # ten days of half hours: past the longest window of the scenario
POLICY = PolicySet(order="fifo", reserve="easy", evict=(), burst="none", defer="carbon",
                   estimate="limit", name="carbon")


class _WithForecast:
    """A snapshot builder that adds the zone's site and forecast to every snapshot."""

    def __init__(self, inner: Any, zone: str, forecast: Sequence[float]) -> None:
        self.inner, self.zone, self.forecast = inner, zone, forecast
        self.memory = inner.memory

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def build(self, now: float) -> Snapshot:
        snap = self.inner.build(now)
        first = max(0, int(now // STEP) - 1)
        last = min(len(self.forecast), first + HORIZON_STEPS)
        steps = tuple((k * STEP, float(self.forecast[k])) for k in range(first, last))
        return replace(snap, sites=(Site(carbon_zone=self.zone),),
                       carbon_forecast={self.zone: steps})


class CarbonSimulation(Simulation):
    """The simulator with deadlines (and checkpoints, when the jobs are interruptible)."""

    def __init__(self, cluster: Cluster, trace: Trace, deadlines: dict[str, float],
                 interruptible: bool, zone: str, forecast: Sequence[float]) -> None:
        super().__init__(cluster, trace, POLICY, stop_delay_s=0.0, check_invariants=False)
        self.deadlines, self.interruptible = deadlines, interruptible
        self.snapshots = _WithForecast(self.snapshots, zone, forecast)  # type: ignore[assignment]

    def _spec(self, tj: TraceJob) -> Any:
        spec = super()._spec(tj)
        return spec.model_copy(update={
            "deadline": self.deadlines[tj.id],
            "checkpoint_dir": "/checkpoints" if self.interruptible else None})


def _cluster(jobs: int, forecast_error: float) -> Cluster:
    nodes = []
    for n in range(max(1, math.ceil(jobs / 8))):
        gpus = tuple(Gpu(f"GPU-c{n}-{i}", i, "A100-80GB", 80.0) for i in range(8))
        nodes.append(Node(f"c{n}", gpus, site="onprem", state=NodeState.READY,
                          lease_expires=1e15))
    # no SLA gets in the way: the deadlines bound the wait, as in the paper
    batch = PriorityClass("batch", 100, 60 * 86400.0, preemptible=True)
    return Cluster("carbon-shift", tuple(nodes), classes=(batch,),
                   settings={"carbon": {"step_s": STEP, "forecast_error": forecast_error}})


def simulate(true: Any, forecast: Any, zone: str, jobs: Sequence[tuple[float, float]],
             deadlines: Sequence[float], interruptible: bool, forecast_error: float,
             t0: float) -> tuple[float, float, int, int, int]:
    """(baseline, shifted emissions, jobs deferred, pauses, deadline misses), in intensity x
    half-hours;
    times in ``jobs`` and ``deadlines`` are unix seconds, the series start at ``t0``."""
    tjs = tuple(TraceJob(f"lwa-{i:05d}", submit - t0, work, 1, 1, "ml", "batch", work)
                for i, (submit, work) in enumerate(jobs))
    due = {tj.id: d - t0 for tj, d in zip(tjs, deadlines)}
    sim = CarbonSimulation(_cluster(len(tjs), forecast_error), Trace("lets-wait-awhile", t0,
                                                                     tjs),
                           due, interruptible, zone, forecast)
    result = sim.run()
    base = sum(float(true[int(tj.submit_s // STEP):int((tj.submit_s + tj.duration_s) // STEP)]
                     .sum()) for tj in tjs)
    shifted = sum(float(true[int(p.start_s // STEP):int(p.end_s // STEP)].sum())
                  for p in sim.pieces)
    unfinished = [r.id for r in result.records if r.end_s is None]
    if unfinished:
        raise RuntimeError(f"{len(unfinished)} job(s) did not finish, e.g. {unfinished[0]}")
    deferred = sum(1 for r in result.records
                   if r.first_start_s is not None and r.first_start_s > r.submit_s)
    pauses = sum(r.preemptions for r in result.records)
    misses = sum(1 for r in result.records if r.end_s is not None and r.end_s > due[r.id])
    return base, shifted, deferred, pauses, misses
