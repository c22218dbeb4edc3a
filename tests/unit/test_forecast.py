"""The on-prem start forecast (policies/burst/forecast.py): the one-sweep forecast of a whole queue
(``onprem_starts``, what the burst phase's early spot rule reads) and the kept sweep of the
burst loop (``QueueForecast``, with jobs leaving the queue as it goes) give every job the same
start as asking for it alone (``onprem_start``)."""

from __future__ import annotations

import math
import random
from typing import Any

from broker.cycle.scheduler import run_cycle
from policies.burst.forecast import QueueForecast, onprem_start, onprem_starts
from policies.cycle import Cycle
from policies.registry import PolicySet, register
from tests.builders import node
from tests.unit.test_preemption import NOW, pending, running, snap

SEEN: list[tuple[str, float, float]] = []


@register("burst", "test-forecast-both")
def _both(cycle: Cycle) -> None:
    batch = onprem_starts(cycle, cycle.blocked)
    for pos, job in enumerate(cycle.blocked):
        SEEN.append((job.id, batch[job.id], onprem_start(cycle, job, cycle.blocked[:pos])))


LEAVE: list[list[int]] = []  # per blocked position: those that join ``leaving`` after it


@register("burst", "test-forecast-leaving")
def _leaving(cycle: Cycle) -> None:
    kept, leaving = QueueForecast(cycle, cycle.blocked), set[str]()
    for pos, job in enumerate(cycle.blocked):
        SEEN.append((job.id, kept.start(pos, leaving),
                     onprem_start(cycle, job, cycle.blocked[:pos], leaving)))
        leaving.update(cycle.blocked[i].id for i in LEAVE[pos] if i < len(cycle.blocked))


def forecasts(queue: list[Any], active: list[Any], nodes: list[Any],
              burst: str = "test-forecast-both") -> list[Any]:
    SEEN.clear()
    run_cycle(snap(nodes, queue, active), PolicySet(burst=burst, name="t"), NOW)
    return list(SEEN)


def test_the_sweep_matches_one_forecast_per_job() -> None:
    nodes = [node("a", 4), node("b", 4, "H100-80GB")]
    active = [running("r1", 2, started=NOW - 100, time_limit=3000, priority="normal"),
              running("r2", 2, first=2, started=NOW - 100, time_limit=9000, priority="normal"),
              running("h", 4, on="b", started=NOW - 100, time_limit=5000, priority="normal")]
    queue = [pending(f"p{i}", n, priority="normal", time_limit=t, gpu_types=g)
             for i, (n, t, g) in enumerate([(2, 4000, ()), (4, 2000, ("H100",)), (1, 600, ()),
                                            (3, 1000, ()), (4, 500, ()), (2, 100, ("H100",))])]
    seen = forecasts(queue, active, nodes)
    assert len(seen) == len(queue)
    for job_id, batch, alone in seen:
        assert batch == alone or (math.isinf(batch) and math.isinf(alone)), job_id
    starts = {j: b for j, b, _ in seen}
    assert NOW < starts["p0"] < starts["p2"] and starts["p1"] < starts["p5"]


def test_the_kept_sweep_matches_one_forecast_per_job_as_jobs_leave() -> None:
    """Random queues on a two-model cluster; after each job, the job itself, a job ahead of it
    (one the sweep has counted: it starts again) or one behind it may leave."""
    rng = random.Random(7)
    nodes = [node("a", 8), node("b", 4, "H100-80GB")]
    checked = 0
    for _ in range(40):
        active = [running("r1", 3, started=NOW - 50, time_limit=rng.choice([600, 4000]),
                          priority="normal"),
                  running("h", 2, on="b", started=NOW - 50, time_limit=rng.choice([300, 7000]),
                          priority="normal")]
        n = rng.randint(3, 12)
        queue = [pending(f"p{i}", rng.randint(1, 8), priority="normal",
                         time_limit=rng.choice([100, 900, 3600, 20000]),
                         gpu_types=rng.choice([(), (), ("H100",)])) for i in range(n)]
        LEAVE[:] = [[i for i in range(n) if rng.random() < (0.3 if i == pos else 0.05)]
                    for pos in range(n)]
        seen = forecasts(queue, active, nodes, burst="test-forecast-leaving")
        assert len(seen) <= n  # (the jobs this cycle did not start)
        for job_id, kept, alone in seen:
            assert kept == alone or (math.isinf(kept) and math.isinf(alone)), job_id
            checked += math.isfinite(alone)
    assert checked > 100  # most forecasts are finite: the comparison is not of infinities


ASKED: list[str] = []


@register("burst", "test-forecast-asks")
def _asks(cycle: Cycle) -> None:
    """Forecast the queue with every runtime estimate the forecast asks counted."""
    estimate = cycle.estimate

    def counting(job: Any) -> float:
        ASKED.append(job.id)
        return estimate(job)

    cycle.estimate = counting  # type: ignore[method-assign]
    onprem_starts(cycle, cycle.blocked)


def test_the_sweep_asks_the_estimate_of_every_job_it_passes() -> None:
    """The predictor keeps a job's estimate for REFRESH runtimes after its first ask
    (policies/order/predictor.py), so the jobs a cycle asks about move later estimates and plans.
    The sweeps ask every job of the queue, the last ones too (no job behind them needs
    them), as the one loop per set of kinds did before commit 16bb7f9."""
    nodes = [node("a", 4), node("b", 4, "H100-80GB")]
    active = [running("r1", 4, started=NOW - 100, time_limit=3000, priority="normal"),
              running("h", 4, on="b", started=NOW - 100, time_limit=5000, priority="normal")]
    queue = [pending("p0", 2, priority="normal", time_limit=4000, gpu_types=("H100",)),
             pending("p1", 4, priority="normal", time_limit=2000),
             pending("p2", 1, priority="normal", time_limit=600)]
    ASKED.clear()
    run_cycle(snap(nodes, queue, active), PolicySet(burst="test-forecast-asks", name="t"), NOW)
    assert set(ASKED) == {"p0", "p1", "p2"}, ASKED  # (all three wait: every GPU is held)
