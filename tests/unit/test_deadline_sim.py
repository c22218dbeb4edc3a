"""The deadline rule in the cluster (policies/burst/deadline.py), fed by the spot signals
(broker/cloud/spot_signals.py), through the simulator (broker/bench/deadline_sim.py): one job with a
deadline on a one-job cluster, against the standalone replay of the same rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.bench.deadline import Setup, load, ours, replay
from broker.bench.deadline_sim import one
from broker.cloud.spot_signals import Feed, SpotSignals
from broker.cycle.plan import Snapshot
from broker.model import Market, Offer
from policies.burst.spot_deadline import DeadlineRule

TRACES = Path(__file__).resolve().parents[3] / "shared/data/spot_availability_cantbelate" \
    / "availability/1-node"
S = Setup()  # 48 h of work, 52 h deadline, 0.2 h changeover, $0.918 against $3.06
BASE = (S.work_h + S.changeover_h) * S.ondemand_price
GAP = 195.0


def _offer(market: Market, available: bool = True) -> Offer:
    zone = "us-east-1a" if market is Market.SPOT else ""
    return Offer("aws", "us-east-1", zone, "p3.2xlarge", "V100-16GB", 1, 16.0, market, 1.0,
                 extra={} if available else {"available": False})


def _snap(now: float, *offers: Offer) -> Snapshot:
    return Snapshot(now, (), (), (), {}, (), offers=offers)


def test_signals_hold_what_the_offers_showed_between_snapshots() -> None:
    sig = SpotSignals(step_s=100.0)
    assert sig.dress(_snap(0.0)).spot_markets == {}  # no spot offer: unchanged
    snap = sig.dress(_snap(0.0, _offer(Market.SPOT), _offer(Market.ONDEMAND)))
    m = snap.spot_markets["aws:us-east-1a"]
    assert (m.i, m.up, m.next_s) == (1, True, 100.0)
    # 350 s later spot is gone: the steps at 100 and 200 held "up", the one at 300 sees it
    m = sig.dress(_snap(350.0, _offer(Market.SPOT, available=False))).spot_markets[
        "aws:us-east-1a"]
    assert (m.i, m.up, m.age, m.next_s) == (4, False, 1, 400.0)
    assert m.share() == pytest.approx(0.75)


def test_signals_read_a_replayed_zone_at_each_step() -> None:
    avail = [True, False, False, True]
    sig = SpotSignals(feeds=lambda key: Feed(GAP, 0.0, lambda t: avail[int(t // GAP) % 4]))
    m = sig.dress(_snap(3 * GAP + 1, _offer(Market.SPOT))).spot_markets["aws:us-east-1a"]
    assert (m.i, m.up, m.age) == (4, True, 1)
    assert m.share() == pytest.approx(0.5)


def test_spot_all_along_costs_spot_and_one_changeover() -> None:
    r = one("x/us-east-1a_v100_1.json", (True,) * 2000, GAP, 0, S)
    assert r["met"] and r["bursts"] == 1 and r["interruptions"] == 0
    assert r["cost"] / BASE == pytest.approx(S.spot_price / S.ondemand_price, abs=1e-3)


def test_a_market_never_seen_up_sends_it_to_on_demand_at_once() -> None:
    r = one("x/us-east-1a_v100_1.json", (False,) * 2000, GAP, 0, S)
    assert r["met"] and r["bursts"] == 1 and r["jobs_lost"] == 0
    assert r["cost"] / BASE == pytest.approx(1.0, abs=1e-3)
    assert r["end_h"] == pytest.approx(S.work_h + S.changeover_h, abs=0.01)


def test_spot_gone_for_good_waits_while_the_slack_allows_then_on_demand_in_time() -> None:
    seen = DeadlineRule().market(GAP / 3600.0)
    for i in range(3000):  # a week of 2-hour runs and 1-hour gaps, then no spot at all
        seen.observe(i % 55 < 37)
    s = Setup(deadline_h=70.0)  # 22 h of slack: spot up 2/3 of the time is worth a wait
    r = one("x/us-east-1a_v100_1.json", (False,) * 2000, GAP, 0, s, seen)
    assert r["met"] and r["bursts"] == 1 and r["jobs_lost"] == 0
    assert r["end_h"] > s.work_h + s.changeover_h + 1  # it waited for spot first


def test_flaky_spot_never_misses() -> None:
    pattern = (True,) * 9 + (False,) * 3 + (True,) * 2 + (False,) * 11
    r = one("x/us-east-1a_v100_1.json", pattern * 100, GAP, 0, S)
    assert r["met"] and r["jobs_lost"] == 0 and r["interruptions"] > 0


# (trace, start step): each start of the experiment's grid for its trace (200 starts)
STARTS = [("aws-02-15-2023/us-east-1a_v100_1.json", 0),
          ("aws-02-15-2023/us-east-1c_v100_1.json", 3839),
          ("aws-02-15-2023/us-west-2b_v100_1.json", 3839),
          ("aws-10-26-2022/us-west-2a_v100_1.json", 716)]


@pytest.mark.skipif(not TRACES.is_dir(), reason="the Can't Be Late traces are not here")
@pytest.mark.parametrize(("name", "start"), STARTS)
def test_the_simulated_cluster_agrees_with_the_replay(name: str, start: int) -> None:
    """Same decisions at the same steps; the cluster's changeover is 2 s longer (the job's
    stop) and it pays a 2 s notice per interruption, so the cost may differ a little."""
    traces = {n: (a, g) for n, a, g in load(TRACES)}
    avail, gap = traces[name]
    rule = DeadlineRule()
    market = rule.market(gap / 3600.0)
    for j in range(start):
        market.observe(avail[j])
    cost, met = replay(avail, gap, start, S, ours(rule, S), market.copy())
    r = one(name, avail, gap, start, S, market)
    assert met and r["met"] and r["jobs_lost"] == 0
    assert r["cost"] / BASE == pytest.approx(cost / BASE, abs=0.01)


@pytest.mark.skipif(not TRACES.is_dir(), reason="the Can't Be Late traces are not here")
def test_the_bench_command_runs_through_the_simulator() -> None:
    import json

    from tests.conftest import run_cli

    code, out, _ = run_cli("redis://127.0.0.1:1/0", "bench", "spot-deadline", "--traces",
                           str(TRACES), "--starts", "1", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["through"] == "simulator" and doc["runs"] == 11
    assert doc["deadline_misses"] == 0 and doc["jobs_lost"] == 0 and doc["missed"] == []
    assert set(doc["per_trace"]) == {n for n, _, _ in load(TRACES)}
    assert all({"spillway", "replay", "greedy"} <= set(r) for r in doc["per_trace"].values())
    assert 0 < doc["cost_vs_ondemand"] <= 1.1 and "cost_vs_ondemand" in doc["replay"]
