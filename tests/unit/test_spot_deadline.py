"""Spot with a deadline (policies/spot_deadline.py) and its replay (broker/deadline_bench.py):
one row per rule, and replays that can never miss the deadline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.deadline_bench import Setup, greedy, ours, replay, run
from broker.errors import ConfigError
from policies.spot_deadline import DeadlineRule, Mode

R = DeadlineRule()  # changeover 0.2 h, reserve 2 changeovers
WAIT, S, OD = Mode.IDLE, Mode.SPOT, Mode.ONDEMAND

# (mode, slack h, spot up, work left h, time left h, recent availability, expected)
ROWS = {
    "on spot and still up: stay": (S, 0.3, True, 10, 10.3, 0.5, S),
    "spot up, slack covers two changeovers: take it": (WAIT, 0.4, True, 10, 10.4, 0.5, S),
    "spot up, too little slack for a later changeover: on-demand": (WAIT, 0.35, True, 10, 10.35,
                                                                    0.9, OD),
    "on on-demand, spot up, enough slack: back to spot": (OD, 1.0, True, 10, 11, 0.5, S),
    "no spot, slack near the reserve: on-demand": (WAIT, 0.45, False, 10, 10.45, 1.0, OD),
    "no spot, plenty expected: wait": (WAIT, 20, False, 48, 68, 0.9, WAIT),
    "no spot, too little expected: on-demand": (WAIT, 4, False, 48, 52, 0.2, OD),
    "on on-demand, spot expected barely enough: stay (hysteresis)": (OD, 4, False, 40, 44,
                                                                     0.85, OD),
}


@pytest.mark.parametrize(("mode", "slack", "up", "left", "time_left", "avail", "want"),
                         list(ROWS.values()), ids=list(ROWS))
def test_the_rule(mode: Mode, slack: float, up: bool, left: float, time_left: float,
                  avail: float, want: Mode) -> None:
    assert R.decide(mode, slack, 0.1, up, left, time_left, avail) is want


def _seen(avail: list[bool]) -> list[int]:
    seen = [0]
    for a in avail + avail:
        seen.append(seen[-1] + a)
    return seen


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
        cost, ok = replay(avail, 600, 0, s, decide, _seen(avail), 36)
        assert ok
        assert s.work_h * s.spot_price <= cost <= (s.work_h + 4) * s.ondemand_price
    if pattern == "always":
        cost, _ = replay(avail, 600, 0, s, ours(R, s), _seen(avail), 36)
        assert cost == pytest.approx((s.work_h + s.changeover_h) * s.spot_price)


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
