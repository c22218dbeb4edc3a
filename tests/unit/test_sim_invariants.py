"""The simulator's invariant checker notices each kind of breach it is there for."""

from __future__ import annotations

from dataclasses import replace

from broker.cycle.plan import Applied, Plan
from broker.model import Allocation, HistoryEntry
from broker.model.state import JobState
from broker.sim.invariants import InvariantChecker
from broker.store.memory import MemoryStore
from tests.builders import job, node


def _store_with_running() -> tuple[MemoryStore, object]:
    store = MemoryStore()
    store.heartbeat(node("a", 4), 1e9, 0.0)
    j = job("j1", 2)
    store.submit(j.spec, 0.0, "j1")
    return store, j


def _start(store: MemoryStore, job_id: str, gpus: tuple[str, ...]) -> object:
    from broker.cycle.plan import Start

    cur = store.get(job_id)
    applied = store.apply(Plan(starts=(Start(job_id, cur.attempt, cur.version,
                                             (Allocation("a", gpus),)),)), 1.0)
    return applied


def test_a_clean_start_passes() -> None:
    store, _ = _store_with_running()
    applied = _start(store, "j1", ("GPU-a-0", "GPU-a-1"))
    checker = InvariantChecker(store)
    checker.after_cycle(1.0, Plan(), applied)  # type: ignore[arg-type]
    assert checker.violations == []


def test_a_gpu_handed_to_a_second_job_is_caught() -> None:
    store, _ = _store_with_running()
    applied = _start(store, "j1", ("GPU-a-0", "GPU-a-1"))
    # corrupt the store: a second active job claims to hold j1's GPU
    twin = replace(store.get("j1"), id="j2", allocations=(Allocation("a", ("GPU-a-0",)),))
    store._jobs["j2"] = twin
    store._active["j2"] = None
    checker = InvariantChecker(store)
    checker.after_cycle(1.0, Plan(), applied)  # type: ignore[arg-type]
    assert any("claimed" in v for v in checker.violations)


def test_a_partial_gang_and_an_illegal_transition_are_caught() -> None:
    store, _ = _store_with_running()
    applied = _start(store, "j1", ("GPU-a-0", "GPU-a-1"))
    started = applied.started[0]  # type: ignore[attr-defined]
    half = replace(started, allocations=(Allocation("a", ("GPU-a-0",)),))
    bad = replace(started, history=(*started.history,
                                    HistoryEntry(JobState.PENDING, 2.0, "x", 1),
                                    HistoryEntry(JobState.SUCCEEDED, 3.0, "x", 1)))
    checker = InvariantChecker(store)
    checker.after_cycle(1.0, Plan(), Applied(started=(half,)))
    assert any("started partly" in v for v in checker.violations)
    checker.check_finished(3.0, bad)
    assert any("illegal" in v for v in checker.violations)
