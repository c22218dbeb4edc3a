"""The on-prem start forecast (policies/forecast.py): the one-sweep forecast of a whole queue
(``onprem_starts``, what the burst phase's early spot rule reads) gives every job the same
start as asking for it alone (``onprem_start``)."""

from __future__ import annotations

import math
from typing import Any

from broker.scheduler import run_cycle
from policies.cycle import Cycle
from policies.forecast import onprem_start, onprem_starts
from policies.registry import PolicySet, register
from tests.builders import node
from tests.unit.test_preemption import NOW, pending, running, snap

SEEN: list[tuple[str, float, float]] = []


@register("burst", "test-forecast-both")
def _both(cycle: Cycle) -> None:
    batch = onprem_starts(cycle, cycle.blocked)
    for pos, job in enumerate(cycle.blocked):
        SEEN.append((job.id, batch[job.id], onprem_start(cycle, job, cycle.blocked[:pos])))


def forecasts(queue: list[Any], active: list[Any], nodes: list[Any]) -> list[Any]:
    SEEN.clear()
    run_cycle(snap(nodes, queue, active), PolicySet(burst="test-forecast-both", name="t"), NOW)
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
