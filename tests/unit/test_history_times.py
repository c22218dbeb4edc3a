"""Every history entry carries the ``now`` of the call that made the transition.

Through the MemoryStore's public calls only (submit, apply(plan), report, cancel, heartbeat,
expire); each step uses its own odd time, so an entry stamped with another step's time (or
the submission time, or the wall clock) fails. Reason texts are not asserted.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker.cycle.plan import Plan, Preempt, Start
from broker.model import Allocation, Gpu, Job, JobSpec, Node
from broker.model.state import TERMINAL, JobState
from broker.store import BaseStore, MemoryStore
from broker.store.events import Exited, Started, StartFailed

S = JobState
T0 = 1_000.0
NODE = Node("n1", tuple(Gpu(f"n1-g{i}", i, "A100-80GB", 80.0) for i in range(2)),
            hostname="n1", cpus=8, memory_gb=64, incarnation="i1")


def start(store: BaseStore, job_id: str, gpu: str, now: float) -> None:
    j = store.get(job_id)
    applied = store.apply(Plan(starts=(Start(j.id, j.attempt, j.version,
                                             (Allocation("n1", (gpu,), 0),)),)), now)
    assert [x.id for x in applied.started] == [job_id]


def report(event: object) -> Callable[[BaseStore, str, float], object]:
    def step(store: BaseStore, job_id: str, now: float) -> object:
        return store.report(job_id, store.get(job_id).attempt, event, now)  # type: ignore[arg-type]
    return step


def starts_on(gpu: str) -> Callable[[BaseStore, str, float], object]:
    return lambda store, job_id, now: start(store, job_id, gpu, now)


def preempt(store: BaseStore, job_id: str, now: float) -> object:
    j = store.get(job_id)
    return store.apply(Plan(preemptions=(Preempt(j.id, j.attempt, "make room", 30.0),)), now)


def cancel(store: BaseStore, job_id: str, now: float) -> object:
    return store.cancel(job_id, now)


def lose_node(store: BaseStore, job_id: str, now: float) -> object:
    return store.expire(now)  # the node's lease (1e4 s from T0) is long over


STARTED, EXIT0, EXIT1 = report(Started(0)), report(Exited(0, 0)), report(Exited(0, 1))
KILLED = report(Exited(0, -15, "Signal"))

# (steps after the submission at T0 + 0.5: [(step, now)], history [(state, time, attempt)])
FLOWS = {
    "runs and succeeds": (
        [(starts_on("n1-g0"), T0 + 1.25), (STARTED, T0 + 2.5), (EXIT0, T0 + 7.75)],
        [(S.PENDING, T0 + 0.5, 1), (S.STARTING, T0 + 1.25, 1), (S.RUNNING, T0 + 2.5, 1),
         (S.SUCCEEDED, T0 + 7.75, 1)]),
    "runs and fails": (
        [(starts_on("n1-g0"), T0 + 1.25), (STARTED, T0 + 2.5), (EXIT1, T0 + 3.5)],
        [(S.PENDING, T0 + 0.5, 1), (S.STARTING, T0 + 1.25, 1), (S.RUNNING, T0 + 2.5, 1),
         (S.FAILED, T0 + 3.5, 1)]),
    "fails to start": (
        [(starts_on("n1-g0"), T0 + 1.25), (report(StartFailed(0, "no such file")), T0 + 4.5)],
        [(S.PENDING, T0 + 0.5, 1), (S.STARTING, T0 + 1.25, 1), (S.FAILED, T0 + 4.5, 1)]),
    "cancelled while pending": (
        [(cancel, T0 + 9.5)],
        [(S.PENDING, T0 + 0.5, 1), (S.CANCELLED, T0 + 9.5, 1)]),
    "cancelled while running: stops, then ends at the exit": (
        [(starts_on("n1-g0"), T0 + 1.25), (STARTED, T0 + 2.5), (cancel, T0 + 5.5),
         (KILLED, T0 + 6.25)],
        [(S.PENDING, T0 + 0.5, 1), (S.STARTING, T0 + 1.25, 1), (S.RUNNING, T0 + 2.5, 1),
         (S.STOPPING, T0 + 5.5, 1), (S.CANCELLED, T0 + 6.25, 1)]),
    "preempted, requeued, started again": (
        [(starts_on("n1-g0"), T0 + 1.25), (STARTED, T0 + 2.5), (preempt, T0 + 3.75),
         (report(Exited(0, -15, "Preempted")), T0 + 5.0), (starts_on("n1-g1"), T0 + 6.5),
         (STARTED, T0 + 8.25), (EXIT0, T0 + 11.0)],
        [(S.PENDING, T0 + 0.5, 1), (S.STARTING, T0 + 1.25, 1), (S.RUNNING, T0 + 2.5, 1),
         (S.STOPPING, T0 + 3.75, 1), (S.PREEMPTED, T0 + 5.0, 1), (S.PENDING, T0 + 5.0, 2),
         (S.STARTING, T0 + 6.5, 2), (S.RUNNING, T0 + 8.25, 2), (S.SUCCEEDED, T0 + 11.0, 2)]),
    "its node is lost: requeued at the expiry": (
        [(starts_on("n1-g0"), T0 + 1.25), (STARTED, T0 + 2.5), (lose_node, T0 + 20_000.5)],
        [(S.PENDING, T0 + 0.5, 1), (S.STARTING, T0 + 1.25, 1), (S.RUNNING, T0 + 2.5, 1),
         (S.LOST, T0 + 20_000.5, 1), (S.PENDING, T0 + 20_000.5, 2)]),
}


@pytest.mark.parametrize(("steps", "want"), list(FLOWS.values()), ids=list(FLOWS))
def test_history_times_are_the_callers_now(
        steps: list[tuple[Callable[[BaseStore, str, float], object], float]],
        want: list[tuple[JobState, float, int]]) -> None:
    store = MemoryStore()
    store.heartbeat(NODE, 1e4, T0)
    job_id = store.submit(JobSpec(command=["python", "train.py"]), T0 + 0.5).id
    for step, now in steps:
        step(store, job_id, now)
    got: Job = store.get(job_id)
    assert [(h.state, h.time, h.attempt) for h in got.history] == want
    # the attempts' and the job's own times come from the same calls
    starting = [(h.time, h.attempt) for h in got.history if h.state is S.STARTING]
    assert [(a.started_at, a.number) for a in got.attempts] == starting
    if got.state in TERMINAL:
        assert got.finished_at == want[-1][1]
    else:
        assert got.finished_at is None
