"""The carbon defer policy: the window arithmetic, the plan, and the policy in a cycle."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.config.core import DEFAULT_CLASSES, parse_classes
from broker.cycle.scheduler import run_cycle
from broker.errors import ConfigError
from broker.model import Allocation, Attempt, PriorityClass, Site
from broker.model.state import EvictionKind, JobState
from policies.carbon.defer import plan
from policies.carbon.window import (
    cleanest_slots,
    cleanest_start,
    runs_of,
    slot_means,
    smoothed,
)
from policies.registry import PolicySet
from tests.builders import job, node, snapshot

H = 3600.0


@pytest.mark.parametrize(("steps", "start", "slots", "step", "want"), [
    ([(0, 10), (1, 20), (2, 30)], 0, 3, 1, [10, 20, 30]),  # aligned
    ([(0, 10), (1, 20), (2, 30)], 0.5, 2, 1, [15, 25]),  # half of each
    ([(0, 10), (2, 30)], 0, 2, 2, [10, 30]),
    ([(5, 7)], 0, 2, 1, [7, 7]),  # before the first step: its value
    ([(0, 1), (1, 3)], 0, 1, 2, [2]),  # one slot over two steps
    ([(0, 4)], 0, 3, 1, [4, 4, 4]),  # after the last step: the last value
])
def test_slot_means(steps: list[tuple[float, float]], start: float, slots: int, step: float,
                    want: list[float]) -> None:
    assert slot_means(steps, start, slots, step) == pytest.approx(want)


@pytest.mark.parametrize(("means", "k", "latest", "want"), [
    ([5, 1, 1, 5], 2, 2, (1, 2)),
    ([1, 1, 5, 5], 2, 2, (0, 2)),  # already the best: start now
    ([5, 5, 1, 1], 2, 1, (1, 6)),  # the best start is past the latest allowed
    ([3, 3, 3], 1, 2, (0, 3)),  # ties: the earliest
])
def test_cleanest_start(means: list[float], k: int, latest: int, want: tuple[int, float]
                        ) -> None:
    assert cleanest_start(means, k, latest) == want


@pytest.mark.parametrize(("means", "k", "start_by", "want"), [
    ([9, 1, 9, 1, 9], 2, None, [1, 3]),  # pauses through the peak between
    ([1, 9, 1, 9], 2, None, [0, 2]),
    ([9, 8, 1, 1], 2, 1, [1, 2]),  # must start by slot 1: its cleanest slot up to then
    ([2, 2, 2], 2, None, [0, 1]),  # ties: the earliest
])
def test_cleanest_slots(means: list[float], k: int, start_by: int | None, want: list[int]
                        ) -> None:
    assert cleanest_slots(means, k, start_by) == want


def test_runs_and_smoothing() -> None:
    assert runs_of([1, 2, 4, 6, 7]) == [(1, 3), (4, 5), (6, 8)]
    assert smoothed([0, 3, 0, 3], 1) == pytest.approx([1.5, 1, 2, 1.5])
    assert smoothed([1, 2], 0) == [1, 2]


# a day of hourly intensity: dirty until 06:00, clean 06:00-10:00, dirty again
DAY = [(h * H, 100.0 if 6 <= h < 10 else 400.0) for h in range(24)]


@pytest.mark.parametrize(("now", "work", "end", "start_by", "interruptible", "runs"), [
    # waits for the clean stretch, which fits before the deadline
    (0, 2 * H, 24 * H, 22 * H, False, [(6 * H, 8 * H)]),
    # the deadline comes first: starts when it still ends in time, as clean as it can
    (0, 2 * H, 7 * H, 5 * H, False, [(5 * H, 7 * H)]),
    # the SLA (start by 03:00) keeps it from waiting for the valley: the earliest it may
    (0, 2 * H, 24 * H, 3 * H, False, [(0, 2 * H)]),
    # longer than the clean stretch: the valley in the middle of its run
    (0, 6 * H, 24 * H, 18 * H, False, [(4 * H, 10 * H)]),
    # interruptible: the clean hours, then the earliest dirty ones
    (0, 5 * H, 24 * H, 19 * H, True, [(0, H), (6 * H, 10 * H)]),
    # already clean: runs now
    (6 * H, 2 * H, 24 * H, 22 * H, False, [(6 * H, 8 * H)]),
])
def test_plan(now: float, work: float, end: float, start_by: float, interruptible: bool,
              runs: list[tuple[float, float]]) -> None:
    d = plan(DAY, now, work, end, start_by, interruptible, step=H)
    assert d is not None
    assert list(d.runs) == runs
    assert d.runs[-1][1] <= end and d.start_at <= start_by
    assert sum(b - a for a, b in d.runs) == work


@pytest.mark.parametrize(("now", "work", "end"), [
    (0, 10 * H, 5 * H),  # cannot finish even now
    (0, 2 * H, 2 * H),  # must start now
])
def test_no_choice(now: float, work: float, end: float) -> None:
    assert plan(DAY, now, work, end, end - work, False, step=H) is None


def test_a_later_cycle_keeps_the_rest_of_the_plan() -> None:
    """Re-deciding inside a plan, with the same forecast and the work left, gives the same
    rest of the plan: the bench may follow a plan instead of re-deciding every cycle."""
    wavy = [(h * H, 200 + 150 * ((h * 7) % 5) - 20 * (h % 3)) for h in range(48)]
    d = plan(wavy, 0, 9 * H, 40 * H, 31 * H, True, step=H)
    assert d is not None and len(d.runs) > 1
    done = d.runs[0][1] - d.runs[0][0]
    later = plan(wavy, d.runs[0][1], 9 * H - done, 40 * H, 40 * H, True, step=H)
    assert later is not None and later.runs == d.runs[1:]


# --- the policy in a cycle ---------------------------------------------------------------

NOW = 0.0
FLEX = (*DEFAULT_CLASSES, PriorityClass("flex", 150, 12 * H, flexible=True))


def _cycle(**spec: object) -> tuple[object, object]:
    priority = str(spec.pop("priority", "normal"))
    j = job("j", 1, priority=priority, submitted=NOW, time_limit=2 * H, **spec)
    snap = replace(snapshot([node("n", 1)], [j], now=NOW), classes=FLEX,
                   sites=(Site(carbon_zone="DE"),), carbon_forecast={"DE": tuple(DAY)},
                   settings={"carbon": {"step_s": H}})
    return run_cycle(snap, PolicySet(defer="carbon")), j


@pytest.mark.parametrize(("spec", "deferred"), [
    ({"deadline": 24 * H, "priority": "low"}, True),  # a deadline: waits for 06:00
    ({"deadline": 8 * H, "priority": "low"}, True),  # just in time: 06:00-08:00
    ({"deadline": 24 * H}, False),  # normal's 4 h SLA ends before the clean hours
    ({"priority": "flex"}, True),  # a flexible class: waits within its 12 h SLA
    ({}, False),  # neither deadline nor flexible: starts now
    ({"deadline": 2 * H, "priority": "low"}, False),  # no slack: starts now
])
def test_the_cycle_defers_deferrable_jobs(spec: dict[str, object], deferred: bool) -> None:
    plan_, _ = _cycle(**spec)
    started = [s.job_id for s in plan_.starts]  # type: ignore[attr-defined]
    assert (started == []) is deferred
    if deferred:
        why = plan_.pending["j"]  # type: ignore[attr-defined]
        assert why.code == "DeferredForCarbon"
        assert "until 1970-01-01" in why.message and "gCO2e/kWh" in why.message
        assert plan_.wake_at is not None and plan_.wake_at > NOW  # type: ignore[attr-defined]


def test_the_cycle_wakes_when_the_window_opens() -> None:
    plan_, _ = _cycle(deadline=24 * H, priority="low")
    assert plan_.wake_at == 6 * H  # type: ignore[attr-defined]
    assert "until 1970-01-01 06:00 UTC (in 6.0h)" in plan_.pending["j"].message  # type: ignore[attr-defined]


def test_no_forecast_no_deferral() -> None:
    j = job("j", 1, submitted=NOW, time_limit=2 * H, deadline=24 * H)
    plan_ = run_cycle(snapshot([node("n", 1)], [j], now=NOW), PolicySet(defer="carbon"))
    assert [s.job_id for s in plan_.starts] == ["j"]


@pytest.mark.parametrize(("value", "ok"), [(True, True), (False, True), ("yes", False)])
def test_the_flexible_class_setting(value: object, ok: bool) -> None:
    raw = [{"name": "flex", "rank": 10, "sla_s": "12h", "flexible": value}]
    if ok:
        assert parse_classes(raw)[0].flexible is value
    else:
        with pytest.raises(ConfigError, match=r"classes\[0\].flexible: 'yes' must be true or"):
            parse_classes(raw)


def _running(start: float, now: float, deadline: float) -> object:
    """A checkpointed deadline job on node n, running since ``start``, 4 h of work."""
    alloc = (Allocation("n", ("GPU-n-0",)),)
    j = job("r", 1, priority="low", submitted=start, state=JobState.RUNNING,
            allocations=alloc, time_limit=4 * H, deadline=deadline,
            checkpoint_dir="/ckpt")
    j = replace(j, started_at=start, attempts=(Attempt(1, alloc, start),))
    snap = replace(snapshot([node("n", 1)], [], [j], now=now), classes=FLEX,
                   sites=(Site(carbon_zone="DE"),), carbon_forecast={"DE": tuple(DAY)},
                   settings={"carbon": {"step_s": H}})
    return run_cycle(snap, PolicySet(defer="carbon"))


@pytest.mark.parametrize(("start", "now", "deadline", "paused", "wake"), [
    # ran 04:00-05:00, 3 h left, clean 06:00-10:00 ahead: pauses now, wakes at 06:00
    (4 * H, 5 * H, 24 * H, True, 6 * H),
    # in the clean hours: keeps running (nothing to wake for: no pause ahead)
    (6 * H, 7 * H, 24 * H, False, None),
    # 3 h left and the deadline at 08:00: no slack, it keeps running
    (4 * H, 5 * H, 8 * H, False, None),
    # ran 03:00-05:00, 2 h left before a 09:00 deadline: waits for 06:00-08:00
    (3 * H, 5 * H, 9 * H, True, 6 * H),
])
def test_a_running_checkpointed_job_pauses_through_a_dirty_peak(
        start: float, now: float, deadline: float, paused: bool, wake: float | None) -> None:
    plan_ = _running(start, now, deadline)
    kinds = [p.kind for p in plan_.preemptions]  # type: ignore[attr-defined]
    assert kinds == ([EvictionKind.CARBON] if paused else [])
    assert plan_.wake_at == wake  # type: ignore[attr-defined]
    if paused:
        assert "pausing for cleaner power in DE until" in \
            plan_.preemptions[0].reason  # type: ignore[attr-defined]


def test_a_plan_that_must_have_started_already_is_none() -> None:
    """A deadline job of unknown runtime and no time limit: its latest start is -inf (it
    overflowed the slot arithmetic; issue 36's property test found it)."""
    steps = [(h * H, 100.0 + h) for h in range(48)]
    assert plan(steps, 0.0, 5 * H, 40 * H, float("-inf"), True, step=H) is None
    assert plan(steps, 0.0, 5 * H, 40 * H, -1.0, True, step=H) is None
    assert plan(steps, 0.0, 5 * H, 40 * H, float("inf"), True, step=H) is not None
