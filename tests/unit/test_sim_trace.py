"""Workload traces: the packaged Philly trace, the generic CSV format, derivations, windows,
load scaling and offered load."""

from __future__ import annotations

import gzip
import math
from collections import Counter
from pathlib import Path

import pytest

from broker.config.core import PriorityClass
from broker.errors import ConfigError
from broker.model import parse_time
from broker.sim.trace import (
    USUAL_LIMITS_S,
    TraceError,
    busiest_window,
    derived_class,
    derived_time_limit,
    gang_shape,
    load_trace,
    offered_load_gpus,
    round_limit,
    scale_for,
)
from broker.sim.types import Trace, TraceJob

PHILLY_ROWS = 52_849
WEEK = 7 * 86400.0


@pytest.fixture(scope="module")
def philly() -> Trace:
    return load_trace("philly")


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------------------------------------
# Gangs and derivations


@pytest.mark.parametrize(("total", "per_node", "expected"), [
    (1, 8, (1, 1)),
    (8, 8, (1, 8)),
    (12, 8, (2, 6)),
    (16, 8, (2, 8)),
    (24, 8, (3, 8)),
    (32, 8, (4, 8)),
    (128, 8, (16, 8)),
    (10, 8, (2, 5)),
    (9, 8, (3, 3)),
    (7, 4, (7, 1)),
    (6, 4, (2, 3)),
    (5, 1, (5, 1)),
])
def test_gang_shape(total: int, per_node: int, expected: tuple[int, int]) -> None:
    nodes, gpus = gang_shape(total, per_node)
    assert (nodes, gpus) == expected
    assert nodes * gpus == total and gpus <= per_node


@pytest.mark.parametrize(("seconds", "limit"), [
    (1, 3600), (3600, 3600), (3601, 7200), (5 * 3600, 8 * 3600), (13 * 3600, 86400),
    (50 * 3600, 72 * 3600), (4 * 86400, WEEK), (WEEK + 1, 2 * WEEK), (20 * 86400, 3 * WEEK),
])
def test_round_limit(seconds: float, limit: float) -> None:
    assert round_limit(seconds) == limit


@pytest.mark.parametrize("duration", [1.0, 59.0, 1144.0, 3600.0, 11_266.0, 254_884.0, 4.6e6])
def test_derived_limit_is_a_usual_value_at_least_the_duration(duration: float) -> None:
    for job in range(50):
        limit = derived_time_limit(duration, f"philly-{job:06d}", seed=0)
        assert limit >= duration
        assert limit in USUAL_LIMITS_S or (limit > WEEK and limit % WEEK == 0)
        assert limit <= round_limit(duration * 5)


def test_derived_limit_is_deterministic_and_depends_on_the_seed() -> None:
    ids = [f"philly-{i:06d}" for i in range(200)]
    first = [derived_time_limit(1000.0, i, seed=0) for i in ids]
    assert first == [derived_time_limit(1000.0, i, seed=0) for i in ids]
    assert first != [derived_time_limit(1000.0, i, seed=1) for i in ids]
    assert len(set(first)) > 1  # the factor varies by job: 1000 s x [1, 5] spans 1 h and 2 h


def test_derived_class_uses_only_existing_names() -> None:
    two = (PriorityClass("high", 300, 60), PriorityClass("low", 100, 60))
    picks = Counter(derived_class(f"j{i}", 0, two) for i in range(2000))
    assert set(picks) == {"high", "low"}
    assert picks["low"] / 2000 == pytest.approx(0.75, abs=0.04)  # 30 / (10 + 30)
    odd = (PriorityClass("gold", 3, 60), PriorityClass("silver", 2, 60),
           PriorityClass("bronze", 1, 60))
    assert {derived_class(f"j{i}", 0, odd) for i in range(100)} == {"silver"}


# ---------------------------------------------------------------------------------------------
# Philly


def test_philly_loads_every_row() -> None:
    trace = load_trace("philly")
    assert len(trace.jobs) == PHILLY_ROWS  # no row has duration <= 0
    assert trace.origin == parse_time("2017-09-04T10:30:41Z")
    assert trace.jobs[0].submit_s == 0.0


def test_philly_jobs(philly: Trace) -> None:
    jobs = philly.jobs
    assert [j.submit_s for j in jobs] == sorted(j.submit_s for j in jobs)
    assert len({j.id for j in jobs}) == PHILLY_ROWS
    by_id = {j.id: j for j in jobs}
    first = by_id["philly-000000"]  # the first data row: 2017-10-09 07:01:55,66.0,1,66.0,11cb48
    assert first.duration_s == 66.0 and first.total_gpus == 1 and first.team == "vc-11cb48"
    assert first.submit_s == parse_time("2017-10-09T07:01:55Z") - philly.origin
    assert all(j.team.startswith("vc-") for j in jobs)
    assert len({j.team for j in jobs}) == 12
    assert all(j.time_limit_s >= j.duration_s for j in jobs)
    assert all(j.gpu_type is None and j.preemptible is None for j in jobs)
    gangs = [j for j in jobs if j.nodes > 1]
    assert len(gangs) == 99  # 65 x 16 + 23 x 32 + 7 x 12 + 4 x 24 GPUs
    assert {(j.nodes, j.gpus) for j in gangs} == {(2, 8), (4, 8), (2, 6), (3, 8)}
    assert any("99 jobs split into gangs" in n for n in philly.notes)
    assert any("time limits derived for 52849 jobs" in n for n in philly.notes)


def test_philly_class_shares(philly: Trace) -> None:
    counts = Counter(j.priority for j in philly.jobs)
    for name, share in (("critical", 0.02), ("high", 0.10), ("normal", 0.58), ("low", 0.30)):
        assert counts[name] / PHILLY_ROWS == pytest.approx(share, abs=0.01), name


def test_philly_limits_are_modal(philly: Trace) -> None:
    limits = Counter(j.time_limit_s for j in philly.jobs)
    top = sum(c for _, c in limits.most_common(5))
    assert top / PHILLY_ROWS > 0.9


def test_same_seed_same_trace_other_seed_other_draws(philly: Trace) -> None:
    again = load_trace("philly")
    assert again.jobs == philly.jobs
    other = load_trace("philly", seed=7)
    assert [j.priority for j in other.jobs] != [j.priority for j in philly.jobs]
    assert [j.time_limit_s for j in other.jobs] != [j.time_limit_s for j in philly.jobs]


def test_window_keeps_start_le_submit_lt_end(philly: Trace) -> None:
    start = parse_time("2017-10-01T00:00:00Z")
    end = parse_time("2017-10-08T00:00:00Z")
    week = load_trace("philly", start=start, end=end)
    expected = [j for j in philly.jobs if start <= philly.origin + j.submit_s < end]
    assert len(week.jobs) == len(expected) > 0
    assert week.origin == philly.origin + expected[0].submit_s
    assert week.jobs[0].submit_s == 0.0
    # limits and classes do not depend on the window
    by_id = {j.id: j for j in philly.jobs}
    assert all(j.priority == by_id[j.id].priority for j in week.jobs)
    assert all(j.time_limit_s == by_id[j.id].time_limit_s for j in week.jobs)
    assert any(n.startswith("window [2017-10-01T00:00:00Z, 2017-10-08T00:00:00Z)")
               for n in week.notes)


def test_empty_window_is_an_error() -> None:
    with pytest.raises(TraceError, match="no job was submitted in the window"):
        load_trace("philly", start=parse_time("2030-01-01"), end=parse_time("2030-02-01"))


@pytest.mark.parametrize("scale", [0.5, 2.0, 0.3])
def test_load_scale_divides_the_gaps(scale: float) -> None:
    start, end = parse_time("2017-10-02"), parse_time("2017-10-03")
    base = load_trace("philly", start=start, end=end)
    scaled = load_trace("philly", start=start, end=end, load_scale=scale)
    assert [j.id for j in scaled.jobs] == [j.id for j in base.jobs]
    for a, b in zip(base.jobs, scaled.jobs):
        assert b.submit_s == pytest.approx(a.submit_s / scale)
        assert (b.duration_s, b.time_limit_s, b.priority) == (a.duration_s, a.time_limit_s,
                                                              a.priority)
    assert scaled.origin == base.origin
    assert offered_load_gpus(scaled) == pytest.approx(offered_load_gpus(base) * scale)
    assert any(f"load scale {scale:g}" in n for n in scaled.notes)


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan])
def test_bad_load_scale(bad: float) -> None:
    with pytest.raises(TraceError, match="load scale"):
        load_trace("philly", load_scale=bad)


def test_philly_file_path_is_sniffed(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp,duration,num_gpus,gpu_time,cluster\n"
                 "2017-10-01 00:00:10,100.0,1,100.0,abc\n"
                 "2017-10-01 00:00:00,0.0,2,0.0,abc\n"
                 "2017-10-01 00:00:05,50.0,16,800.0,def\n", "mini.csv")
    trace = load_trace(path)
    assert [j.id for j in trace.jobs] == ["philly-000002", "philly-000000"]
    assert trace.jobs[0].nodes == 2 and trace.jobs[0].team == "vc-def"
    assert trace.jobs[1].submit_s == 5.0
    assert any("1 jobs dropped (duration <= 0)" in n for n in trace.notes)


# ---------------------------------------------------------------------------------------------
# Generic CSV

CSV = """submit_time,duration_s,num_gpus,id,team,gpu_type,priority,time_limit_s,preemptible,name
2026-01-01T00:00:00Z,3600,4,a,vision,a100,high,7200,yes,train-a
2026-01-01T00:10:00Z,600,1,b,,,,,,
2026-01-01T00:05:00+00:00,100,12,c,nlp,H100-80GB,low,50,false,
"""


def test_generic_csv(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, CSV))
    assert [j.id for j in trace.jobs] == ["a", "c", "b"]
    a, c, b = trace.jobs
    assert a == TraceJob(id="a", submit_s=0.0, duration_s=3600, gpus=4, nodes=1, team="vision",
                         priority="high", time_limit_s=7200, gpu_type="A100", preemptible=True,
                         name="train-a")
    assert (c.submit_s, c.nodes, c.gpus, c.gpu_type, c.preemptible) == (300, 2, 6, "H100-80GB",
                                                                        False)
    assert c.time_limit_s == 50  # shorter than the duration: kept, the simulator kills it
    assert b.team == "default" and b.priority in {"critical", "high", "normal", "low"}
    assert b.time_limit_s == derived_time_limit(600, "b", 0) and b.name is None
    assert trace.origin == parse_time("2026-01-01T00:00:00Z")
    assert any("time limits derived for 1 jobs" in n for n in trace.notes)
    assert any("classes drawn for 1 jobs" in n for n in trace.notes)


def test_generic_csv_relative_seconds_default_ids_and_gzip(tmp_path: Path) -> None:
    text = "num_gpus,duration_s,submit_time\n1,10,30\n2,20,0\n"
    path = tmp_path / "rel.csv.gz"
    path.write_bytes(gzip.compress(text.encode()))
    trace = load_trace(str(path), start=0, end=31)
    assert [(j.id, j.submit_s) for j in trace.jobs] == [("job-000001", 0.0), ("job-000000", 30.0)]
    assert trace.origin == 0.0
    assert load_trace(str(path), "csv", start=10).jobs[0].id == "job-000000"


@pytest.mark.parametrize(("text", "pattern"), [
    ("submit_time,duration_s\n0,10\n",
     r"line 1, column num_gpus: required column 'num_gpus' is missing"),
    ("submit_time,duration_s,num_gpus,colour\n0,10,1,red\n",
     r"line 1, column colour: unknown column 'colour'; allowed: submit_time"),
    ("submit_time,duration_s,num_gpus\n0,10,1\n5,ten,1\n",
     r"line 3, column duration_s: 'ten' is not a number"),
    ("submit_time,duration_s,num_gpus\n0,-5,1\n",
     r"line 2, column duration_s: -5 must be > 0 seconds"),
    ("submit_time,duration_s,num_gpus\n0,10,1.5\n",
     r"line 2, column num_gpus: '1.5' is not allowed; use a whole number >= 1"),
    ("submit_time,duration_s,num_gpus\n0,10,0\n",
     r"line 2, column num_gpus"),
    ("submit_time,duration_s,num_gpus\nyesterday,10,1\n",
     r"line 2, column submit_time: 'yesterday' is not an ISO 8601 time"),
    ("submit_time,duration_s,num_gpus,priority\n0,10,1,urgent\n",
     r"line 2, column priority: 'urgent' is not a class of the simulated cluster; allowed: "
     r"critical, high, normal, low"),
    ("submit_time,duration_s,num_gpus,gpu_type\n0,10,1,V200\n",
     r"line 2, column gpu_type: 'V200' is not a known GPU family or model; allowed: K80"),
    ("submit_time,duration_s,num_gpus,time_limit_s\n0,10,1,0\n",
     r"line 2, column time_limit_s: 0 must be > 0 seconds"),
    ("submit_time,duration_s,num_gpus,preemptible\n0,10,1,maybe\n",
     r"line 2, column preemptible: 'maybe' is not allowed; use true/false"),
    ("submit_time,duration_s,num_gpus,id\n0,10,1,x\n1,10,1,x\n",
     r"line 3, column id: 'x' repeats the id of line 2"),
    ("submit_time,duration_s,num_gpus\n0,10\n",
     r"line 2: has 2 fields; the header has 3"),
    ("", r"the file is empty; a header row is required"),
    ("when,how_long\n1,2\n", r"line 1: the header 'when,how_long' is neither"),
])
def test_csv_errors(tmp_path: Path, text: str, pattern: str) -> None:
    path = write(tmp_path, text, "bad.csv")
    with pytest.raises(TraceError, match=pattern) as info:
        load_trace(path)
    assert str(info.value).startswith(path)
    assert isinstance(info.value, ConfigError)


def test_missing_file_and_bad_format(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace file"):
        load_trace(str(tmp_path / "nope.csv"))
    with pytest.raises(TraceError, match="allowed: philly, csv"):
        load_trace("philly", "swf")


def test_priority_must_exist_in_the_given_classes(tmp_path: Path) -> None:
    path = write(tmp_path, "submit_time,duration_s,num_gpus,priority\n0,10,1,gold\n")
    with pytest.raises(TraceError, match="allowed: critical, high, normal, low"):
        load_trace(path)
    gold = (PriorityClass("gold", 1, 60),)
    assert load_trace(path, classes=gold).jobs[0].priority == "gold"
    assert load_trace("philly", classes=gold, end=parse_time("2017-09-05")).jobs[0].priority \
        == "gold"


# ---------------------------------------------------------------------------------------------
# Offered load


def synthetic(jobs: list[tuple[float, int, float]]) -> Trace:
    """(submit_s, total gpus, duration_s) -> a Trace."""
    return Trace(name="synthetic", origin=1_000_000.0, jobs=tuple(
        TraceJob(id=f"j{i}", submit_s=s, duration_s=d, gpus=g, nodes=1, team="t",
                 priority="normal", time_limit_s=d) for i, (s, g, d) in enumerate(jobs)))


def test_offered_load_and_busiest_window() -> None:
    day = 86400.0
    trace = synthetic([
        (0.0, 1, day),           # day 0: 1 GPU-day
        (1.5 * day, 4, day),     # day 1: 4 GPU-days
        (2.2 * day, 8, day),     # day 2: 8 GPU-days
        (3.9 * day, 1, day),     # day 3: 1 GPU-day
        (6.0 * day, 2, day),     # day 6: 2 GPU-days
    ])
    assert offered_load_gpus(trace) == pytest.approx(16 / 6)
    assert busiest_window(trace, days=1) == (2 * day, 3 * day, pytest.approx(8.0))
    assert busiest_window(trace, days=2) == (day, 3 * day, pytest.approx(6.0))
    # [0, 3), [1, 4) and [1.5, 4.5) all hold 13 GPU-days: the earliest wins
    assert busiest_window(trace, days=3, step_s=day / 2) == (0.0, 3 * day, pytest.approx(13 / 3))
    assert busiest_window(trace, days=1, step_s=day / 2) == (
        1.5 * day, 2.5 * day, pytest.approx(12.0))
    # a trace shorter than the window: one window from its start
    assert busiest_window(trace, days=30) == (0.0, 30 * day, pytest.approx(16 / 30))
    assert busiest_window(synthetic([]), days=1) == (0.0, day, 0.0)


def test_scale_for() -> None:
    day = 86400.0
    trace = synthetic([(0.0, 10, day), (day, 10, day)])  # 20 GPU-days over 1 day: 20 GPUs
    assert offered_load_gpus(trace) == pytest.approx(20.0)
    assert scale_for(trace, 160, 0.9) == pytest.approx(7.2)
    assert scale_for(trace, 160, 1.1, offered_gpus=40.0) == pytest.approx(4.4)
    with pytest.raises(ValueError):
        scale_for(synthetic([(0.0, 1, 10.0)]), 160, 0.9)


def test_philly_busiest_window(philly: Trace) -> None:
    start, end, load = busiest_window(philly, days=14)
    assert end - start == 14 * 86400
    assert load >= offered_load_gpus(philly) > 0
    assert start % 86400 == 0  # steps of a day from the first job
