"""Spot with a deadline (policies/burst/spot_deadline.py) and its replay (broker/bench/deadline.py):
one row per rule, the last safe moment to wait, and replays that can never miss the deadline
(a table of patterns, and hypothesis over random availability)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.bench.deadline import Setup, greedy, ours, replay, run
from broker.errors import ConfigError
from policies.burst.spot_deadline import DeadlineRule, Mode, SpotMarket

R = DeadlineRule()  # changeover 0.2 h, reserve 2 changeovers, $0.918 against $3.06
WAIT, S, OD = Mode.IDLE, Mode.SPOT, Mode.ONDEMAND
STEP = 0.1  # hours


def _market(up: int, down: int, hours: float = 48.0, then: list[bool] | None = None
            ) -> SpotMarket:
    """A market that has seen ``up`` steps of spot then ``down`` without, over and over for
    ``hours``, then the steps ``then``."""
    m = R.market(STEP)
    for i in range(round(hours / STEP)):
        m.observe(i % (up + down) < up)
    for u in then or []:
        m.observe(u)
    return m


LONG_RUNS = _market(40, 10, then=[False] * 5 + [True])  # 4 h runs, 1 h gaps; a run begins
SHORT_RUNS = _market(2, 8, then=[True])  # 0.2 h runs, 0.8 h gaps
QUICK_GAPS = _market(1, 1, then=[True, False])  # every gap ends after one step
LONG_GAPS = _market(2, 60, hours=168, then=[True, False])  # 6 h gaps, a week of them
FLAKY = _market(3, 3, then=[True, False])

# (mode, slack h, spot up, work left h, time left h, market, expected)
ROWS = {
    "on spot and still up: stay": (S, 0.3, True, 10, 10.3, SHORT_RUNS, S),
    "waiting, spot up, slack covers two changeovers: spot": (WAIT, 0.4, True, 10, 10.4,
                                                             SHORT_RUNS, S),
    "waiting, spot up, too little slack for a later changeover: on-demand": (
        WAIT, 0.35, True, 10, 10.35, LONG_RUNS, OD),
    "on-demand, spot up, runs seen are long: back to spot": (OD, 6.0, True, 30, 36,
                                                             LONG_RUNS, S),
    "on-demand, spot up, runs seen too short to pay two changeovers: stay": (
        OD, 6.0, True, 30, 36, SHORT_RUNS, OD),
    "no spot, slack near the reserve: on-demand": (WAIT, 0.45, False, 10, 10.45, QUICK_GAPS,
                                                   OD),
    "no spot, plenty expected: wait": (WAIT, 20, False, 48, 68, LONG_RUNS, WAIT),
    "no spot, too little expected, gaps are long: on-demand": (WAIT, 4, False, 48, 52,
                                                               LONG_GAPS, OD),
    "no spot, too little expected, but gaps end at once: wait a step": (
        WAIT, 4, False, 48, 52, QUICK_GAPS, WAIT),
    "on on-demand, gaps end at once: stay (the changeover is paid)": (OD, 4, False, 48, 52,
                                                                       QUICK_GAPS, OD),
    "on on-demand, spot expected barely enough: stay (hysteresis)": (OD, 4, False, 40, 44,
                                                                     FLAKY, OD),
}


@pytest.mark.parametrize(("mode", "slack", "up", "left", "time_left", "market", "want"),
                         list(ROWS.values()), ids=list(ROWS))
def test_the_rule(mode: Mode, slack: float, up: bool, left: float, time_left: float,
                  market: SpotMarket, want: Mode) -> None:
    assert R.decide(mode, slack, STEP, up, left, time_left, market.copy()) is want


# (reserve changeovers, slack h, step h, must run on-demand now): the job waits one more
# step only if the slack after it still holds the reserve, and never less than one changeover
BOUNDARY = [
    (2.0, 0.55, 0.1, False), (2.0, 0.51, 0.1, False), (2.0, 0.49, 0.1, True),
    (2.0, 0.45, 0.1, True), (2.0, 0.415, 0.01, False), (2.0, 0.405, 0.01, True),
    (1.0, 0.31, 0.1, False), (1.0, 0.29, 0.1, True),
    (0.0, 0.31, 0.1, False), (0.0, 0.29, 0.1, True),  # never below one changeover
    (2.0, 5.0, 4.5, False), (2.0, 5.0, 4.7, True),
]


@pytest.mark.parametrize(("reserve", "slack", "step", "must"), BOUNDARY)
def test_the_last_safe_moment_to_wait(reserve: float, slack: float, step: float,
                                      must: bool) -> None:
    rule = DeadlineRule(reserve_changeovers=reserve)
    assert rule.must_run(slack, step) is must
    # whatever the market promises, past that moment the job runs on-demand
    if must:
        assert rule.decide(WAIT, slack, step, False, 1.0, 1.0 + slack,
                           QUICK_GAPS.copy()) is OD


def test_return_age_rises_as_the_slack_shrinks() -> None:
    """Scarce slack goes to the spot runs likely to be long: the age a run must reach
    before the job leaves on-demand for it never falls as the slack shrinks."""
    m = R.market(STEP)
    for _ in range(25):  # spot runs of 1, 2, 4, ... 32 steps (heavy-tailed), gaps of 4
        for k in (1, 2, 4, 8, 16, 32):
            for u in [True] * k + [False] * 4:
                m.observe(u)
    ages = [R.return_age(slack, 40.0, m) for slack in (20.0, 8.0, 4.0, 2.0, 1.0, 0.5)]
    assert ages == sorted(ages) and ages[0] < ages[-1]


def test_a_market_sees_only_its_history() -> None:
    m = SpotMarket(0.5, window_h=2.0, history_h=5.0)
    for u in [True] * 3 + [False] * 2 + [True] * 20:
        m.observe(u)
    assert m.share() == 1.0 and m.age_h() == 10.0
    st_ = m.stats()
    assert st_.mean_up_h == pytest.approx(1.0)  # the 1.5 h run left the 5 h history
    with pytest.raises(ValueError, match="step_h"):
        SpotMarket(0.0)


def _fresh(gap_s: float) -> SpotMarket:
    return R.market(gap_s / 3600)


@pytest.mark.parametrize("pattern", ["always", "never", "flaky", "late"])
@pytest.mark.parametrize("deadline", [52.0, 70.0])
def test_a_replay_never_misses_and_costs_between_spot_and_ondemand(pattern: str,
                                                                    deadline: float) -> None:
    n = 3000  # 600 s steps: 500 h
    avail = {"always": [True] * n, "never": [False] * n,
             "flaky": [(i // 7) % 3 != 0 for i in range(n)],
             "late": [i > 300 for i in range(n)]}[pattern]
    s = Setup(deadline_h=deadline)
    for decide in (ours(R, s), greedy(s.changeover_h)):
        cost, ok = replay(avail, 600, 0, s, decide, _fresh(600))
        assert ok
        assert s.work_h * s.spot_price <= cost <= (s.work_h + 4) * s.ondemand_price
    if pattern == "always":
        cost, _ = replay(avail, 600, 0, s, ours(R, s), _fresh(600))
        assert cost == pytest.approx((s.work_h + s.changeover_h) * s.spot_price)


@settings(max_examples=150, deadline=None)
@given(runs=st.lists(st.tuples(st.booleans(), st.integers(1, 30)), min_size=1, max_size=40),
       seen=st.integers(0, 400), gap_s=st.sampled_from([195.0, 600.0]),
       work=st.floats(0.5, 10.0), extra=st.floats(0.0, 10.0),
       changeover=st.sampled_from([0.05, 0.2, 0.5]), reserve=st.sampled_from([0.0, 1.0, 2.0]))
def test_no_availability_makes_the_rule_miss(runs: list[tuple[bool, int]], seen: int,
                                             gap_s: float, work: float, extra: float,
                                             changeover: float, reserve: float) -> None:
    """Whatever spot does (before the start and after it), a deadline that holds the work
    and one changeover is met."""
    avail = [up for up, k in runs for _ in range(k)]
    s = Setup(work_h=work, deadline_h=work + changeover + extra, changeover_h=changeover)
    rule = DeadlineRule(changeover_h=changeover, reserve_changeovers=reserve)
    market = rule.market(gap_s / 3600)
    for i in range(seen):
        market.observe(avail[i % len(avail)])
    start = seen % len(avail)
    cost, ok = replay(avail, gap_s, start, s, ours(rule, s), market)
    assert ok
    assert cost <= (s.deadline_h + changeover) * s.ondemand_price
    assert not math.isnan(cost)


def test_the_bench_reads_the_traces_and_reports_its_keys(tmp_path: Path) -> None:
    folder = tmp_path / "aws-02-15-2023"
    folder.mkdir()
    data = [0 if (i // 20) % 4 else 1 for i in range(2000)]
    (folder / "us-east-1a_v100_1.json").write_text(
        json.dumps({"metadata": {"gap_seconds": 600}, "data": data}))
    out = run(tmp_path, Setup(starts=5))
    assert set(out) >= {"cost_vs_ondemand", "deadline_misses", "per_trace"}
    assert out["deadline_misses"] == 0 and 0 < out["cost_vs_ondemand"] < 1
    assert list(out["per_trace"]) == ["aws-02-15-2023/us-east-1a_v100_1.json"]
    with pytest.raises(ConfigError, match="no such folder"):
        run(tmp_path / "absent", Setup())
    (folder / "us-east-1a_v100_1.json").write_text(json.dumps({"metadata": {}, "data": data}))
    with pytest.raises(ConfigError, match=r"metadata\.gap_seconds > 0"):
        run(tmp_path, Setup(starts=5))
