"""The runtime predictor (policies/order/predictor.py): grouped high quantiles, capped at the limit,
memoised per job; and ``expected_end`` of running jobs."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from broker.model import Job
from policies.order.predictor import RuntimePredictor, expected_end
from tests.builders import job

INF = math.inf


def a_job(job_id: str = "q", *, team: str = "t", name: str | None = "x", gpus: int = 1,
          limit: float | None = 3600.0, started: float | None = None, **spec: object) -> Job:
    j = job(job_id, gpus, name=name, time_limit=limit, **spec)
    return replace(j, spec=j.spec.model_copy(update={"team": team}), started_at=started)


def feed(pred: RuntimePredictor, runtimes: list[float], *, team: str = "t", name: str = "x",
         gpus: int = 1, limit: float | None = 3600.0) -> None:
    for r in runtimes:
        pred.observe(RuntimePredictor.keys(team, name, gpus, limit), r)


# -- the groups, from the most to the least specific -----------------------------------------

# (history: [(feed kwargs, runtimes)], query kwargs, predictor kwargs, estimate)
FALLBACK = {
    "same team, name, GPUs and limit": (
        [({}, [100] * 4), ({"name": "y"}, [900] * 4)], {}, {}, 100.0),
    "unknown name: same team, GPUs and limit": (
        [({}, [100] * 4), ({"name": "y", "gpus": 2}, [900] * 4)], {"name": "z"}, {}, 100.0),
    "too few of the same name: same team, GPUs and limit": (
        [({}, [100] * 3), ({"name": "y"}, [900] * 8)], {}, {}, 900.0),
    "unknown GPU count: same team and limit": (
        [({"gpus": 2}, [500] * 4)], {"gpus": 1}, {}, 500.0),
    "unknown team: the limit alone": (
        [({"team": "u"}, [700] * 4)], {"team": "t"}, {}, 700.0),
    "unknown limit, no default: the limit": (
        [({}, [700] * 4)], {"limit": 7200.0}, {}, 7200.0),
    "unknown limit: default_s": (
        [({}, [700] * 4)], {"limit": 7200.0}, {"default_s": 1000.0}, 1000.0),
    "default_s is capped at the limit": (
        [], {"limit": 600.0}, {"default_s": 1000.0}, 600.0),
    "no history and no limit: unknown": ([], {"limit": None}, {}, INF),
    "no limit: grouped by the missing limit": (
        [({"limit": None}, [300] * 4)], {"limit": None}, {}, 300.0),
    "fewer than min_samples anywhere: the limit": ([({}, [100] * 3)], {}, {}, 3600.0),
    "min_samples is a setting": ([({}, [100] * 2)], {}, {"min_samples": 2}, 100.0),
    "a gang counts its total GPUs": (
        [({"gpus": 8}, [400] * 4)], {"gpus": 4, "nodes": 2}, {}, 400.0),
}


@pytest.mark.parametrize(("history", "query", "kw", "want"), list(FALLBACK.values()),
                         ids=list(FALLBACK))
def test_groups_fall_back(history, query, kw, want) -> None:  # type: ignore[no-untyped-def]
    pred = RuntimePredictor(**kw)
    for fkw, runtimes in history:
        feed(pred, runtimes, **fkw)
    assert pred.estimate(a_job(**query)) == want


def test_the_command_names_a_job_without_a_name() -> None:
    pred = RuntimePredictor()
    feed(pred, [100] * 4, name="true")  # the builders' command
    feed(pred, [900] * 4, name="other")
    assert pred.estimate(a_job(name=None)) == 100.0


# -- the quantile, the cap, the window ----------------------------------------------------------

@pytest.mark.parametrize(("quantile", "want"), [
    pytest.param(0.9, 1000.0, id="p90 of 10 is the 10th"),
    pytest.param(0.5, 600.0, id="p50 of 10 is the 6th"),
    pytest.param(0.0, 100.0, id="p0 is the shortest"),
    pytest.param(1.0, 1000.0, id="p100 is the longest"),
])
def test_quantile(quantile: float, want: float) -> None:
    pred = RuntimePredictor(quantile=quantile)
    feed(pred, [700, 100, 1000, 300, 500, 900, 200, 800, 400, 600])  # any order
    assert pred.estimate(a_job()) == want


@pytest.mark.parametrize(("runtimes", "limit", "want"), [
    pytest.param([5000] * 4, 3600.0, 3600.0, id="history above the limit: the limit"),
    pytest.param([3000] * 4, 3600.0, 3000.0, id="history below the limit"),
    pytest.param([3600] * 4, 3600.0, 3600.0, id="history at the limit"),
])
def test_capped_at_the_limit(runtimes: list[float], limit: float, want: float) -> None:
    pred = RuntimePredictor()
    feed(pred, runtimes, limit=limit)
    est = pred.estimate(a_job(limit=limit))
    assert est == want
    assert est <= limit


# (window, runtimes in order, estimate with quantile 0 = the shortest kept)
WINDOW = {
    "all kept while within the window": (4, [100, 900, 900, 900], 100.0),
    "the oldest is evicted": (4, [100, 900, 900, 900, 900], 900.0),
    "evicted by age, not by value": (4, [900, 100, 900, 900, 900], 100.0),
    "a longer window keeps more": (8, [100, 900, 900, 900, 900], 100.0),
    "duplicates evicted one at a time": (3, [100, 100, 900, 900], 100.0),
}


@pytest.mark.parametrize(("window", "runtimes", "want"), list(WINDOW.values()), ids=list(WINDOW))
def test_window_eviction(window: int, runtimes: list[float], want: float) -> None:
    pred = RuntimePredictor(quantile=0.0, window=window, min_samples=1)
    feed(pred, runtimes)
    assert pred.estimate(a_job()) == want


def test_window_keeps_every_group_sorted_and_bounded() -> None:
    pred = RuntimePredictor(window=5)
    runtimes = [(i * 37) % 101 for i in range(200)]
    feed(pred, runtimes)
    # every group the runtimes were filed under exists (else the loop below checks nothing)
    assert set(pred._groups) == set(RuntimePredictor.keys("t", "x", 1, 3600.0))
    for g in pred._groups.values():
        assert len(g.recent) == 5
        assert g.sorted == sorted(g.recent) == sorted(runtimes[-5:])


# -- memoisation ------------------------------------------------------------------------------

def test_memo_refreshes_after_refresh_observations() -> None:
    pred = RuntimePredictor(quantile=0.0, min_samples=1)
    feed(pred, [100])
    q = a_job("q")
    assert pred.estimate(q) == 100.0
    feed(pred, [50] * (RuntimePredictor.REFRESH - 1))
    assert pred.estimate(q) == 100.0  # memoised: fewer than REFRESH new observations
    assert pred.estimate(a_job("other")) == 50.0  # another job sees the history at once
    feed(pred, [50])
    assert pred.estimate(q) == 50.0  # REFRESH observations since: recomputed


def test_memo_is_per_job_id() -> None:
    pred = RuntimePredictor()
    feed(pred, [100] * 4)
    feed(pred, [800] * 4, name="y")
    assert pred.estimate(a_job("j1", name="x")) == 100.0
    assert pred.estimate(a_job("j2", name="y")) == 800.0
    assert pred.observed == 8


# -- expected_end -------------------------------------------------------------------------------

# (started, estimate, limit, now, expected end)
ENDS = {
    "before its estimate: start + estimate": (0.0, 1000.0, 3600.0, 500.0, 1000.0),
    "not started: from now": (None, 300.0, 3600.0, 500.0, 800.0),
    "unknown runtime: never": (0.0, INF, None, 500.0, INF),
    "overran: half as long again": (0.0, 100.0, None, 1000.0, 1500.0),
    "at its estimate: counts as overrun": (0.0, 1000.0, None, 1000.0, 1500.0),
    "overran briefly: at least a minute": (0.0, 10.0, None, 20.0, 80.0),
    "overran: capped at the limit": (0.0, 100.0, 1200.0, 1000.0, 1200.0),
    "overran within a far limit": (0.0, 100.0, 86400.0, 1000.0, 1500.0),
    "past its limit: now, never the past": (0.0, 100.0, 900.0, 1000.0, 1000.0),
}


@pytest.mark.parametrize(("started", "estimate", "limit", "now", "want"), list(ENDS.values()),
                         ids=list(ENDS))
def test_expected_end(started, estimate, limit, now, want) -> None:  # type: ignore[no-untyped-def]
    assert expected_end(a_job(limit=limit, started=started), estimate, now) == want


@pytest.mark.parametrize("limit", [None, 500.0, 2000.0, 10_000.0])
def test_expected_end_of_an_overrun_job_is_ahead_and_within_the_limit(limit: float | None
                                                                      ) -> None:
    start = 1000.0
    for estimate, now in itertools.product([1.0, 60.0, 400.0], [1401.0, 1500.0, 2999.0, 9000.0]):
        end = expected_end(a_job(limit=limit, started=start), estimate, now)
        assert end >= now
        if limit is None or now < start + limit:
            assert end > now
        if limit is not None:
            assert end <= max(now, start + limit)
