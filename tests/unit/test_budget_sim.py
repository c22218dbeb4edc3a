"""Budgets in the simulator (broker/sim/ledger.py): the cycle's budget step, the reservation
and the ledger run there as in production; ``budget_overruns`` is in the report."""

from __future__ import annotations

from typing import Any

import pytest

from broker.errors import ConfigError
from broker.sim.cluster import cluster_from_data
from broker.sim.engine import Simulation
from tests.unit.test_sim_cloud import JOBS, cluster

# "hi" (team vision, 1 h, limit 2 h) bursts to a $3.06/h p3.2xlarge; the budget step expects
# 3.06 x (210 s mean boot + 2 h + 300 s idle tail) = $6.55; it costs about $3.4 (1 h + boot +
# idle)


def with_budgets(budgets: Any) -> Any:
    """test_sim_cloud's tiny cluster, with a budgets section."""
    return cluster_from_data({"name": "tiny", "nodes": [{"prefix": "n", "gpus": "4xV100-16GB"}],
                              "cloud": {"idle_timeout_s": 300, "sites": [{
                                  "provider": "aws", "region": "us-east-1",
                                  "zones": ["us-east-1c"], "instance_types": ["p3.2xlarge"],
                                  "markets": ["ondemand"], "boot_s": [120, 300]}]},
                              "budgets": budgets}, "tiny.yaml")


@pytest.mark.parametrize("cap, bursts", [(6.5, 0), (7.0, 1)])
def test_a_hard_cap_decides_the_burst_and_is_never_passed(cap: float, bursts: int) -> None:
    sim = Simulation(with_budgets({"vision": {"amount": cap}}), JOBS, "spillway")
    res = sim.run()
    m = res.metrics
    hi = next(r for r in res.records if r.id == "hi")
    assert (m["bursts"], m["budget_overruns"], m["jobs_lost"]) == (bursts, 0, 0)
    assert m["budget_spend_usd"]["vision"] == pytest.approx(m["cloud_cost_usd"], abs=0.01)
    if bursts:
        assert 3.0 < m["cloud_cost_usd"] < cap
    else:  # it waited for the on-prem node, free after 10 h
        assert hi.first_start_s is not None and hi.first_start_s >= 10 * 3600


def test_without_budgets_the_key_is_there_and_zero() -> None:
    m = Simulation(cluster(), JOBS, "spillway").run().metrics
    assert m["budget_overruns"] == 0 and "budget_spend_usd" not in m and m["bursts"] == 1


def test_a_cluster_files_budgets_are_checked() -> None:
    for budgets, words in (({"vision": {"amount": 5, "window": "year"}}, "budgets.vision.window"),
                           ({"vision": {"amt": 5}}, "unknown keys ['amt']"),
                           ({"vision": 5}, "budgets.vision: must be a mapping")):
        with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
            with_budgets(budgets)
