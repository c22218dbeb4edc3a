"""The dispatch bench's turnaround figures, from jobs' histories."""

from __future__ import annotations

from types import SimpleNamespace

from broker.bench.suite import _turnaround


def job(gpu: str, starting: float, running: float | None, end: float) -> SimpleNamespace:
    steps = [("PENDING", starting - 1), ("STARTING", starting)]
    if running is not None:
        steps.append(("RUNNING", running))
    history = [SimpleNamespace(state=SimpleNamespace(value=s), time=t) for s, t in steps]
    return SimpleNamespace(history=history, finished_at=end,
                           allocations=[SimpleNamespace(node_id="n1", gpu_ids=(gpu,))])


def test_turnaround_splits_a_gpus_time_into_start_run_and_free() -> None:
    jobs = [job("g0", 10.0, 10.030, 10.040),  # 30 ms to run, 10 ms running
            job("g0", 10.100, 10.150, 10.160),  # free 60 ms after the first
            job("g1", 10.0, 10.040, 10.060),
            job("g1", 10.100, None, 10.120)]  # ended before its RUNNING was written
    got = _turnaround(jobs)
    assert got["starting_to_running_p50_ms"] == 35.0  # 30, 50, 40, 20
    assert got["running_to_end_p50_ms"] == 10.0  # 10, 10, 20, 0
    assert got["gpu_free_gap_p50_ms"] == 50.0  # 60 (g0), 40 (g1)
    assert got["starts_per_cycle"] == 2.0  # two cycles: 10.0 and 10.1


def test_turnaround_of_nothing() -> None:
    assert _turnaround([]) == {"starting_to_running_p50_ms": 0.0, "running_to_end_p50_ms": 0.0,
                               "gpu_free_gap_p50_ms": 0.0, "starts_per_cycle": 0.0}
