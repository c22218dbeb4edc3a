"""A slow scenario: three days of the shipped Philly trace on seed-160, every policy.

It replays the real trace through the production cycle (about 20 s on one core) and checks
what must hold for any load: no invariant breaks, every feasible job finishes, and the
policies rank as they should on mean wait (fcfs worst, spillway best). The full comparisons
(two busiest weeks, two months) are in docs/results.md and the issue notes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.sim.run import SimRequest, simulate

pytestmark = pytest.mark.slow

CLUSTER = str(Path(__file__).resolve().parents[2] / "examples" / "clusters" / "seed-160.yaml")


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, object]]:
    req = SimRequest(trace="philly", cluster=CLUSTER, policies=("fcfs", "slurm-like", "spillway"),
                     start="2017-10-16T00:00:00", end="2017-10-19T00:00:00", target_load=1.0)
    return {r.policy: r.metrics for r in simulate(req, workers=1)}


def test_no_invariant_breaks_and_every_job_finishes(results: dict[str, dict[str, object]]
                                                    ) -> None:
    for policy, m in results.items():
        assert m["invariant_violations"] == 0, (policy, m.get("invariant_examples"))
        assert m["unfinished"] == 0, policy
        assert m["jobs"] == results["fcfs"]["jobs"]


def test_backfill_and_ordering_pay_off(results: dict[str, dict[str, object]]) -> None:
    wait = {p: float(m["wait_mean_s"]) for p, m in results.items()}  # type: ignore[arg-type]
    assert wait["spillway"] < wait["slurm-like"] < wait["fcfs"], wait
    assert float(results["spillway"]["preemptions"]) > 0  # type: ignore[arg-type]
    assert results["slurm-like"]["preemptions"] == 0
