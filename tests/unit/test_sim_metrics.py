"""Simulator metrics: hand-computed tiny cases."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from broker.sim.metrics import compute_metrics, jain_index, percentile, summary_table
from broker.sim.types import JobRecord, Sample, SimResult


def rec(
    id: str,
    submit: float,
    start: float | None,
    duration: float,
    *,
    end: float | str | None = "auto",
    team: str = "a",
    cls: str = "normal",
    sla: float = 100.0,
    gpus: int = 1,
    infeasible: bool = False,
    preemptions: int = 0,
    lost_gpu_s: float = 0.0,
) -> JobRecord:
    if end == "auto":
        end_s = None if start is None else start + duration
    else:
        assert not isinstance(end, str)
        end_s = end
    return JobRecord(
        id=id, team=team, priority=cls, gpus=gpus, submit_s=submit, duration_s=duration,
        sla_s=sla, first_start_s=start, end_s=end_s, preemptions=preemptions,
        lost_gpu_s=lost_gpu_s, infeasible=infeasible,
    )


def steps(*points: tuple[float, int, int]) -> list[Sample]:
    return [Sample(t=t, busy_gpus=b, queued_jobs=q, queued_gpus=q) for t, b, q in points]


def run(records: list[JobRecord], samples: list[Sample] | None = None, cap: int = 4,
        **kw: Any) -> dict[str, Any]:
    result = SimResult("p", cap, records, samples if samples is not None else [], **kw)
    return compute_metrics(result, wall_s=1.25, invariant_violations=0)


# --------------------------------------------------------------------------- utilization


@pytest.mark.parametrize(
    ("samples", "cap", "util", "busy_util", "horizon"),
    [
        # 2 GPUs busy for 10 s, then 4 for 10 s, capacity 4 over 20 s: (20 + 40) / 80.
        (steps((0, 2, 0), (10, 4, 0), (20, 0, 0)), 4, 0.75, 0.0, 20.0),
        # Queue non-empty only over [10, 20) with 4 busy: busy util 40 / 40.
        (steps((0, 2, 0), (10, 4, 3), (20, 0, 0)), 4, 0.75, 1.0, 20.0),
        # Queued over [0, 10) with 1 busy, and [20, 30) with 3 busy: (10 + 30) / (4 * 20).
        (steps((0, 1, 2), (10, 4, 0), (20, 3, 1), (30, 0, 0)), 4, (10 + 40 + 30) / 120, 0.5, 30.0),
        # The last sample's values don't count: it only closes the horizon.
        (steps((5, 4, 0), (15, 8, 9)), 8, 0.5, 0.0, 10.0),
        # Two samples at the same instant: the zero-length interval adds nothing.
        (steps((0, 8, 1), (0, 2, 1), (10, 0, 0)), 4, 0.5, 0.5, 10.0),
        # One sample or none: no horizon, no utilisation.
        (steps((0, 4, 1)), 4, 0.0, 0.0, 0.0),
        ([], 4, 0.0, 0.0, 0.0),
    ],
)
def test_utilization(samples: list[Sample], cap: int, util: float, busy_util: float,
                     horizon: float) -> None:
    m = run([], samples, cap)
    assert m["utilization"] == pytest.approx(util, abs=1e-4)
    assert m["busy_utilization"] == pytest.approx(busy_util, abs=1e-4)
    assert m["horizon_s"] == horizon


def test_queue_max() -> None:
    m = run([], steps((0, 0, 2), (1, 0, 7), (2, 0, 3)))
    assert m["queue_max_jobs"] == 7
    assert m["queue_max_gpus"] == 7


# --------------------------------------------------------------------------- percentiles


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([], 50, None),
        ([7.0], 99, 7.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),  # rank 1.5
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        ([0.0, 10.0], 95, 9.5),  # rank 0.95
        ([float(i) for i in range(101)], 99, 99.0),
        ([0.0, 10.0, 20.0, 30.0, 40.0], 95, 38.0),  # rank 3.8
    ],
)
def test_percentile_linear(values: list[float], p: float, expected: float | None) -> None:
    assert percentile(values, p) == (None if expected is None else pytest.approx(expected))


def test_wait_stats() -> None:
    records = [rec(f"j{i}", 0, w, 100) for i, w in enumerate([0.0, 10.0, 20.0, 30.0, 40.0])]
    m = run(records)
    assert (m["wait_mean_s"], m["wait_p50_s"], m["wait_p95_s"], m["wait_p99_s"]) == (
        20.0, 20.0, 38.0, 39.6)
    assert m["wait_max_s"] == 40.0
    assert m["jct_mean_s"] == 120.0


# --------------------------------------------------------------------------- slowdown


@pytest.mark.parametrize(
    ("wait", "duration", "expected"),
    [
        (0.0, 100.0, 1.0),  # no wait
        (100.0, 100.0, 2.0),
        (300.0, 100.0, 4.0),
        (20.0, 5.0, 2.5),  # short job: (20 + 5) / 10
        (0.0, 5.0, 1.0),  # (0 + 5) / 10 = 0.5, bounded below by 1
        (0.0, 0.0, 1.0),
        (15.0, 10.0, 2.5),
    ],
)
def test_bounded_slowdown(wait: float, duration: float, expected: float) -> None:
    m = run([rec("j", 50.0, 50.0 + wait, duration)])
    assert m["bounded_slowdown_mean"] == pytest.approx(expected)


def test_slowdown_only_over_finished() -> None:
    m = run([
        rec("done", 0, 100, 100),  # slowdown 2
        rec("running", 0, 900, 100, end=None),  # started, not finished: waits only
    ])
    assert m["bounded_slowdown_mean"] == 2.0
    assert m["wait_mean_s"] == 500.0
    assert m["finished"] == 1 and m["started"] == 2 and m["unfinished"] == 1
    assert m["jct_mean_s"] == 200.0


# --------------------------------------------------------------------------- fairness


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], None),
        ([3.0], 1.0),
        ([2.0, 2.0, 2.0], 1.0),
        ([5.0, 0.0, 0.0, 0.0], 0.25),  # one takes all: 1/n
        ([1.0, 0.0], 0.5),
        ([1.0, 3.0], 16 / 20),
        ([0.0, 0.0], 1.0),
    ],
)
def test_jain_index(values: list[float], expected: float | None) -> None:
    got = jain_index(values)
    assert got == (None if expected is None else pytest.approx(expected))


def test_jain_over_team_slowdowns() -> None:
    equal = run([
        rec("a1", 0, 100, 100, team="a"), rec("b1", 0, 100, 100, team="b"),
        rec("c1", 0, 50, 100, team="c"), rec("c2", 0, 150, 100, team="c"),  # mean 2 too
    ])
    assert equal["jain_fairness"] == 1.0
    unequal = run([
        rec("a1", 0, 0, 100, team="a"),  # slowdown 1
        rec("b1", 0, 200, 100, team="b"),  # slowdown 3
        rec("c1", 0, None, 100, team="c"),  # no finished job: not a team for Jain
    ])
    assert unequal["jain_fairness"] == pytest.approx(16 / 20)
    assert run([])["jain_fairness"] is None


# --------------------------------------------------------------------------- infeasible


def test_infeasible_excluded() -> None:
    m = run([
        rec("ok", 0, 10, 100, sla=5),  # wait 10 > sla 5: a miss
        rec("ok2", 0, 0, 100, sla=5),
        rec("never", 0, None, 100, sla=5, infeasible=True),
        rec("weird", 0, 1000, 100, sla=5, infeasible=True),  # ignored even with times
    ], steps((0, 0, 0), (10_000, 0, 0)))
    assert (m["jobs"], m["infeasible"], m["finished"], m["unfinished"]) == (4, 2, 2, 0)
    assert m["wait_mean_s"] == 5.0
    assert m["wait_p99_s"] == pytest.approx(9.9)
    assert m["sla_attainment"] == 0.5
    assert m["per_team"]["a"]["jobs"] == 4
    assert m["per_team"]["a"]["wait_mean_s"] == 5.0


# --------------------------------------------------------------------------- SLA


def test_sla_by_class_and_unfinished() -> None:
    records = [
        rec("h1", 0, 50, 10, cls="high", sla=60),  # hit
        rec("h2", 0, 70, 10, cls="high", sla=60),  # miss
        rec("h3", 900, None, 10, cls="high", sla=60),  # waited 100 > 60 at the end: miss
        rec("h4", 980, None, 10, cls="high", sla=60),  # waited 20 <= 60: not counted
        rec("l1", 0, 500, 10, cls="low", sla=600),  # hit
        rec("l2", 0, 600, 10, cls="low", sla=600),  # exactly the SLA: hit
        rec("l3", 0, 900, 10, cls="low", sla=600, end=None),  # started, unfinished: miss
    ]
    m = run(records, steps((0, 1, 1), (1000, 0, 0)))
    assert m["sla_attainment_by_class"] == {"high": round(1 / 3, 4), "low": round(2 / 3, 4)}
    assert m["sla_attainment"] == round(3 / 6, 4)
    assert m["per_class"]["high"]["sla_attainment"] == round(1 / 3, 4)
    assert m["per_class"]["high"]["jobs"] == 4
    assert m["per_class"]["high"]["wait_mean_s"] == 60.0
    assert m["unfinished"] == 3
    assert m["started"] == 5


def test_unfinished_never_started_without_samples_uses_latest_record_time() -> None:
    m = run([
        rec("a", 0, 0, 500, sla=10),  # ends at 500: the horizon's end
        rec("b", 100, None, 10, sla=10),  # waited 400 by then: miss
    ])
    assert m["sla_attainment"] == 0.5


def test_empty() -> None:
    m = run([])
    assert m["jobs"] == 0
    assert m["wait_mean_s"] is None and m["wait_p95_s"] is None
    assert m["sla_attainment"] is None and m["bounded_slowdown_mean"] is None
    assert m["per_team"] == {} and m["per_class"] == {}
    json.dumps(m)


# --------------------------------------------------------------------------- teams, totals


def test_per_team_and_preemptions() -> None:
    m = run([
        rec("a1", 0, 100, 3600, team="a", gpus=4, preemptions=2, lost_gpu_s=7200),
        rec("a2", 0, 300, 1800, team="a", gpus=2, end=None),  # not finished: no gpu_hours
        rec("b1", 0, 0, 7200, team="b", gpus=1, preemptions=1, lost_gpu_s=1800),
    ])
    a, b = m["per_team"]["a"], m["per_team"]["b"]
    assert a == {"jobs": 2, "wait_mean_s": 200.0, "wait_p95_s": 290.0,
                 "bounded_slowdown_mean": round(3700 / 3600, 4), "gpu_hours": 4.0,
                 "preemptions": 2}
    assert b["gpu_hours"] == 2.0 and b["bounded_slowdown_mean"] == 1.0
    assert m["preemptions"] == 3
    assert m["gpu_hours_lost_to_preemption"] == 2.5


def test_extra_meta_rounding_and_json() -> None:
    result = SimResult("drf", 8, [rec("a", 0, 1 / 3, 10)], steps((0, 1, 0), (3, 0, 0)),
                       meta={"trace": "philly", "window": (0.0, 86400.0), "nan": math.nan})
    m = compute_metrics(result, wall_s=0.123456, invariant_violations=2,
                        extra={"seed": 7, "load_scale": 1.5})
    assert m["policy"] == "drf"
    assert m["invariant_violations"] == 2
    assert m["wall_s"] == 0.123
    assert m["seed"] == 7 and m["load_scale"] == 1.5
    assert m["meta"] == {"trace": "philly", "window": [0.0, 86400.0], "nan": None}
    assert m["wait_mean_s"] == 0.3
    assert m["utilization"] == round(1 / 8, 4)
    json.loads(json.dumps(m, allow_nan=False))


def test_sixty_thousand_records() -> None:
    """A two-month run's size: every record counted, the mean wait exact (how fast this is is
    `spillway simulate`'s wall_s, not a timed assertion here)."""
    records = [rec(f"j{i}", i, i + (i % 97), 60 + i % 500, team=f"t{i % 40}",
                   cls=("high", "normal", "low")[i % 3]) for i in range(60_000)]
    samples = [Sample(float(i), i % 64, i % 5, i % 7) for i in range(200_000)]
    m = run(records, samples, cap=64)
    assert m["finished"] == 60_000
    assert m["wait_mean_s"] == pytest.approx(sum(i % 97 for i in range(60_000)) / 60_000,
                                             abs=0.05)  # (rounded to 0.1 s)


# --------------------------------------------------------------------------- table


def test_summary_table() -> None:
    fast = run([rec("a", 0, 30, 100)], steps((0, 2, 1), (10, 0, 0)))
    slow = dict(run([rec("a", 0, 7200, 100)]), policy="fair-share-long-name")
    empty = dict(run([]), policy="empty")
    table = summary_table([fast, slow, empty])
    lines = table.splitlines()
    assert len(lines) == 5
    assert len({len(line) for line in lines[:2]}) == 1  # header and rule line up
    assert lines[0].startswith("policy") and "busy util" in lines[0] and "Jain" in lines[0]
    assert lines[2].startswith("p ") and "30s" in lines[2] and "50.0%" in lines[2]
    assert lines[3].startswith("fair-share-long-name") and "2.00h" in lines[3]
    assert lines[4].startswith("empty") and " - " in lines[4]
