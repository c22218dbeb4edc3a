"""The job state machine: every edge of the table, and every pair that is not one."""

from __future__ import annotations

from itertools import product

import pytest

from broker.errors import InvalidTransition
from broker.model import HistoryEntry, Job, JobSpec
from broker.model.state import ACTIVE, TERMINAL, TRANSITIONS, JobState, can_move

S = JobState

# The design's table, written out independently of broker/model/state.py.
EDGES: set[tuple[JobState, JobState]] = {
    (S.PENDING, S.STARTING), (S.PENDING, S.CANCELLED), (S.PENDING, S.FAILED),
    (S.STARTING, S.RUNNING), (S.STARTING, S.FAILED), (S.STARTING, S.STOPPING),
    (S.STARTING, S.LOST), (S.STARTING, S.SUCCEEDED),
    (S.RUNNING, S.SUCCEEDED), (S.RUNNING, S.FAILED), (S.RUNNING, S.STOPPING),
    (S.RUNNING, S.LOST),
    (S.STOPPING, S.CANCELLED), (S.STOPPING, S.PREEMPTED), (S.STOPPING, S.SUCCEEDED),
    (S.STOPPING, S.FAILED), (S.STOPPING, S.LOST),
    (S.PREEMPTED, S.PENDING), (S.PREEMPTED, S.FAILED),
    (S.LOST, S.PENDING), (S.LOST, S.FAILED),
}
NON_EDGES = sorted(set(product(JobState, JobState)) - EDGES, key=lambda p: (p[0].value,
                                                                             p[1].value))


def job_in(state: JobState, attempt: int = 1) -> Job:
    return Job(id="j-1", spec=JobSpec(command=["true"]), state=state, submitted_at=0.0,
               attempt=attempt,
               history=(HistoryEntry(state, 0.0, "setup", attempt),))


def test_the_table_is_the_designed_one() -> None:
    assert set(TRANSITIONS) == set(JobState)
    assert {(a, b) for a, nxt in TRANSITIONS.items() for b in nxt} == EDGES


@pytest.mark.parametrize(("src", "dst"), sorted(EDGES, key=lambda p: (p[0].value, p[1].value)),
                         ids=lambda s: s.value)
def test_a_legal_edge_moves_and_records_history(src: JobState, dst: JobState) -> None:
    job = job_in(src, attempt=3)
    assert can_move(src, dst)
    new = job.with_state(dst, 42.5, "because", exit_code=7)
    assert new.state is dst
    assert new.exit_code == 7
    assert new.history == (*job.history, HistoryEntry(dst, 42.5, "because", 3))
    assert (new.id, new.spec, new.attempt, new.version) == (job.id, job.spec, 3, job.version)
    assert job.state is src and len(job.history) == 1  # the original is untouched


@pytest.mark.parametrize(("src", "dst"), NON_EDGES, ids=lambda s: s.value)
def test_every_other_pair_is_refused(src: JobState, dst: JobState) -> None:
    job = job_in(src)
    assert not can_move(src, dst)
    with pytest.raises(InvalidTransition) as err:
        job.with_state(dst, 1.0, "nope")
    assert (err.value.job_id, err.value.src, err.value.dst) == ("j-1", src.value, dst.value)
    assert f"{src.value} -> {dst.value}" in str(err.value)


def test_history_records_a_changed_attempt() -> None:
    job = job_in(S.PREEMPTED, attempt=1)
    new = job.with_state(S.PENDING, 5.0, "Requeued", attempt=2)
    assert new.attempt == 2
    assert new.history[-1] == HistoryEntry(S.PENDING, 5.0, "Requeued", 2)


def test_a_chain_of_moves_keeps_the_whole_history() -> None:
    job = job_in(S.PENDING)
    for t, (dst, why) in enumerate([(S.STARTING, "placed"), (S.RUNNING, "started"),
                                    (S.STOPPING, "preempt"), (S.PREEMPTED, "stopped")], 1):
        job = job.with_state(dst, float(t), why)
    job = job.with_state(S.PENDING, 5.0, "requeued", attempt=2)
    assert [(h.state, h.time, h.reason, h.attempt) for h in job.history] == [
        (S.PENDING, 0.0, "setup", 1), (S.STARTING, 1.0, "placed", 1),
        (S.RUNNING, 2.0, "started", 1), (S.STOPPING, 3.0, "preempt", 1),
        (S.PREEMPTED, 4.0, "stopped", 1), (S.PENDING, 5.0, "requeued", 2),
    ]


@pytest.mark.parametrize("state", sorted(TERMINAL, key=lambda s: s.value), ids=str)
def test_terminal_states_have_no_exits(state: JobState) -> None:
    assert TRANSITIONS[state] == frozenset()
    for dst in JobState:
        with pytest.raises(InvalidTransition):
            job_in(state).with_state(dst, 1.0, "after the end")


def test_terminal_and_active_sets() -> None:
    assert frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED}) == TERMINAL
    assert frozenset({S.STARTING, S.RUNNING, S.STOPPING}) == ACTIVE
    assert not TERMINAL & ACTIVE


def test_every_state_is_reachable_and_can_end() -> None:
    seen, todo = {S.PENDING}, [S.PENDING]
    while todo:
        for nxt in TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(JobState)
    for state in JobState:  # from every state some path reaches a terminal state
        reach, todo = {state}, [state]
        while todo:
            for nxt in TRANSITIONS[todo.pop()] - reach:
                reach.add(nxt)
                todo.append(nxt)
        assert reach & TERMINAL, state


def test_states_print_as_their_value() -> None:
    assert [str(s) for s in JobState] == [s.value for s in JobState]
