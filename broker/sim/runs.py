"""The simulated processes and the events of the simulator's clock: the event kinds, one
attempt's simulated run (:class:`SimRun`) and the oracle that knows every job's true runtime
(:class:`TrueRuntimes`). Shared by the engine (broker/sim/engine.py) and its cloud side
(broker/sim/cloudrun.py), which import nothing of each other's but this.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.model import Job

ARRIVE, END, STOP, WAKE = 0, 1, 2, 3  # event kinds; at one instant ends go before arrivals
# (cloud instances' events, broker/sim/cloudrun.py, are kinds 4 and up)


@dataclass
class SimRun:
    """A simulated process: one attempt of one job."""

    attempt: int
    started: float
    end_at: float
    rate: float  # work (trace seconds) done per second on these GPUs
    killed: bool  # ends at its time limit, not on its own
    gpus: int
    nodes: tuple[str, ...] = ()
    model: str = ""  # the GPU model and the site it runs on (carbon and cost accounting)
    site: str = "onprem"


class TrueRuntimes:
    """An oracle in the runtime predictor's place (``--oracle-runtimes``): every job's
    estimate is its true runtime, so the policies plan as if users' estimates were exact. A
    running attempt's is its simulated run (start to end, its time limit included); a queued
    job's, the trace seconds it has left (on the trace's own GPU speed). Only for measuring
    what runtime knowledge is worth: no real scheduler has it."""

    def __init__(self, runs: Mapping[str, SimRun], work_left: Mapping[str, float]) -> None:
        self.runs, self.work_left = runs, work_left  # (the simulation's own, kept up to date)
        self.observed = 0

    @property
    def version(self) -> int:  # a queued job's estimate changes only when it is stopped
        return self.observed

    def observe(self, keys: tuple[Any, ...], runtime_s: float) -> None:
        del keys, runtime_s
        self.observed += 1

    def estimate(self, job: Job, quantile: float | None = None) -> float:
        del quantile
        run = self.runs.get(job.id)
        if run is not None and run.attempt == job.attempt:
            return run.end_at - run.started
        left = self.work_left.get(job.id, math.inf)
        limit = job.spec.time_limit
        return min(left, limit) if limit else left
