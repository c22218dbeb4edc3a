"""A slow scenario: carbon-aware deferral end to end, the busiest 2 days of Philly on
``seed-160-burst-carbon.yaml`` (seed 0, 110% load), the carbon-blind ``spillway`` against
``spillway-carbon`` (docs/carbon.md has the 14-day figures and the commands).

It drives the whole bundle through the simulator (carbon waits at admission, low-power waits,
pauses, the carbon order, easy-deadline, aligned-carbon, the forecast in every snapshot) and
checks what the issue asks of it on this window: the flexible jobs emit at least 20% less
than in the blind run, at no more than 5% extra cost, with no deadline missed, no job lost
and no class's SLA attainment below the blind run's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.sim.run import SimRequest, simulate

pytestmark = pytest.mark.slow

CLUSTER = str(Path(__file__).resolve().parents[2] / "examples" / "clusters"
              / "seed-160-burst-carbon.yaml")


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    req = SimRequest(trace="philly", cluster=CLUSTER, policies=("spillway", "spillway-carbon"),
                     busiest_days=2, target_load=1.1, seed=0)
    return {r.policy: r.metrics for r in simulate(req, workers=1)}


def _cost(m: dict[str, Any]) -> float:
    return float(m["carbon"]["onprem_cost_usd"]) + float(m["cloud_cost_usd"])


def test_every_job_finishes_and_no_invariant_breaks(results: dict[str, dict[str, Any]]
                                                     ) -> None:
    for policy, m in results.items():
        assert m["invariant_violations"] == 0, (policy, m.get("invariant_examples"))
        assert m["unfinished"] == 0 and m["jobs_lost"] == 0 and m["jobs_failed"] == 0, policy
    assert results["spillway-carbon"]["deadline_misses"] == 0


def test_flexible_work_emits_less_at_no_more_cost_and_no_lost_sla(
        results: dict[str, dict[str, Any]]) -> None:
    blind, green = results["spillway"], results["spillway-carbon"]
    kg = {p: float(m["carbon"]["by_class_kg"]["low"]) for p, m in results.items()}
    assert kg["spillway-carbon"] <= 0.8 * kg["spillway"], kg
    assert _cost(green) <= 1.05 * _cost(blind), (_cost(green), _cost(blind))
    for cls, got in green["sla_attainment_by_class"].items():
        assert got >= blind["sla_attainment_by_class"][cls], cls
    # flexible work on the low-power GPUs: the whole run takes less energy too
    assert float(green["carbon"]["energy_kwh"]) < float(blind["carbon"]["energy_kwh"])
