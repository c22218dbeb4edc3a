"""The pure job-record updates in broker/store/transitions.py, table by table."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from broker.cycle.plan import Start
from broker.errors import StaleAttempt
from broker.model import Allocation, Attempt, HistoryEntry, Job, JobSpec, Reason
from broker.model.state import EvictionKind, JobState
from broker.store import transitions as T
from broker.store.events import Exited, JobEvent, Started, StartFailed

S = JobState
NOW = 500.0
ONE = (Allocation("n1", ("g0", "g1"), 0),)
GANG = (Allocation("n1", ("g0",), 0), Allocation("n2", ("g5", "g6"), 1))


def job(state: JobState = S.RUNNING, allocs: tuple[Allocation, ...] = ONE, attempt: int = 1,
        **kw: Any) -> Job:
    placed = state not in (S.PENDING,)
    return Job(
        id="j-1", spec=JobSpec(command=["true"]), state=state, submitted_at=0.0,
        attempt=attempt, version=4,
        history=(HistoryEntry(state, 1.0, "setup", attempt),),
        allocations=allocs if placed else (),
        attempts=(Attempt(attempt, allocs, 10.0),) if placed else (),
        **kw,
    )


def keys(*pairs: str) -> tuple[tuple[str, str], ...]:
    return tuple(tuple(p.split("/")) for p in pairs)  # type: ignore[misc]


# -- small helpers ----------------------------------------------------------------------------


def test_owner_of_and_change_owner() -> None:
    assert T.owner_of("j-1", 3) == "j-1:3"
    assert T.Change(job(attempt=2), 4).owner == "j-1:2"


@pytest.mark.parametrize(("allocs", "ranks", "want"), [
    (ONE, None, keys("n1/g0", "n1/g1")),
    (GANG, None, keys("n1/g0", "n2/g5", "n2/g6")),
    (GANG, {0}, keys("n1/g0")),
    (GANG, {1}, keys("n2/g5", "n2/g6")),
    (GANG, {7}, ()),
    ((), None, ()),
])
def test_keys(allocs: tuple[Allocation, ...], ranks: set[int] | None, want: Any) -> None:
    assert T._keys(allocs, ranks) == want


# -- start ------------------------------------------------------------------------------------


def test_start_claims_the_planned_gpus() -> None:
    pending = replace(job(S.PENDING, attempt=2), pending_reason=Reason("R", "r"), exit_code=9,
                      parts_exited=((0, 9),))
    change = T.start(pending, Start("j-1", 2, 4, GANG), NOW)
    new = change.job
    assert (change.expected_version, change.claim, change.release) == (
        4, keys("n1/g0", "n2/g5", "n2/g6"), ())
    assert (new.state, new.version, new.attempt, new.allocations) == (S.STARTING, 5, 2, GANG)
    assert new.attempts == (Attempt(2, GANG, NOW),)
    assert (new.parts_exited, new.exit_code, new.pending_reason) == ((), None, None)
    assert new.history[-1] == HistoryEntry(S.STARTING, NOW, "Scheduled on n1,n2", 2)


@pytest.mark.parametrize(("state", "planned_attempt"), [
    (S.PENDING, 2), (S.STARTING, 1), (S.RUNNING, 1), (S.CANCELLED, 1),
])
def test_start_refuses_a_moved_job(state: JobState, planned_attempt: int) -> None:
    with pytest.raises(StaleAttempt):
        T.start(job(state), Start("j-1", planned_attempt, 4, ONE), NOW)


# -- check_attempt ----------------------------------------------------------------------------


@pytest.mark.parametrize(("state", "asked", "ok"), [
    *[(s, 1, s in (S.STARTING, S.RUNNING, S.STOPPING)) for s in JobState],
    (S.RUNNING, 2, False),
    (S.RUNNING, 0, False),
])
def test_check_attempt(state: JobState, asked: int, ok: bool) -> None:
    if ok:
        T.check_attempt(job(state), asked)
        return
    with pytest.raises(StaleAttempt) as err:
        T.check_attempt(job(state), asked)
    assert (err.value.attempt, err.value.current, err.value.state) == (asked, 1, state.value)


# -- report -----------------------------------------------------------------------------------

# (case, job, event, expected state or None for "no change", expected fields, released keys)
REPORTS: list[tuple[str, Job, JobEvent, JobState | None, dict[str, Any], Any]] = [
    ("started", job(S.STARTING), Started(0, pid=9), S.RUNNING, {"started_at": NOW}, ()),
    ("started again", job(S.RUNNING), Started(0), None, {}, ()),
    ("started while stopping", job(S.STOPPING, stop_target=S.CANCELLED), Started(0), None, {},
     ()),
    ("exit 0", job(S.RUNNING), Exited(0, 0), S.SUCCEEDED,
     {"exit_code": 0, "finished_at": NOW, "parts_exited": ((0, 0),)}, keys("n1/g0", "n1/g1")),
    ("exit 0 before Started", job(S.STARTING), Exited(0, 0), S.SUCCEEDED, {"exit_code": 0},
     keys("n1/g0", "n1/g1")),
    ("exit non-zero", job(S.RUNNING), Exited(0, 3, "TimeLimit"), S.FAILED,
     {"exit_code": 3, "finished_at": NOW}, keys("n1/g0", "n1/g1")),
    ("start failed", job(S.STARTING), StartFailed(0, "no such file"), S.FAILED,
     {"exit_code": 127}, keys("n1/g0", "n1/g1")),
    ("cancelled", job(S.STOPPING, stop_target=S.CANCELLED), Exited(0, -15), S.CANCELLED,
     {"exit_code": -15, "finished_at": NOW}, keys("n1/g0", "n1/g1")),
    ("cancelled, exited 0", job(S.STOPPING, stop_target=S.CANCELLED), Exited(0, 0), S.CANCELLED,
     {}, keys("n1/g0", "n1/g1")),
    ("preempted", job(S.STOPPING, stop_target=S.PREEMPTED), Exited(0, -15), S.PENDING,
     {"attempt": 2, "allocations": (), "parts_exited": (), "stop_target": None,
      "exit_code": None, "started_at": None, "finished_at": None},
     keys("n1/g0", "n1/g1")),
    ("preempted but exited 0", job(S.STOPPING, stop_target=S.PREEMPTED), Exited(0, 0),
     S.SUCCEEDED, {"exit_code": 0}, keys("n1/g0", "n1/g1")),
    ("gang part ok", job(S.RUNNING, GANG), Exited(1, 0), S.RUNNING,
     {"parts_exited": ((1, 0),), "exit_code": None}, keys("n2/g5", "n2/g6")),
    ("gang part fails", job(S.RUNNING, GANG), Exited(0, 2), S.STOPPING,
     {"stop_target": S.FAILED, "parts_exited": ((0, 2),)}, keys("n1/g0")),
    ("gang part fails while cancelling", job(S.STOPPING, GANG, stop_target=S.CANCELLED),
     Exited(0, 2), S.STOPPING, {"stop_target": S.CANCELLED}, keys("n1/g0")),
    ("gang last part", job(S.STOPPING, GANG, stop_target=S.FAILED, parts_exited=((0, 2),)),
     Exited(1, -15), S.FAILED, {"exit_code": 2, "parts_exited": ((0, 2), (1, -15))},
     keys("n2/g5", "n2/g6")),
    ("gang all ok", job(S.RUNNING, GANG, parts_exited=((1, 0),)), Exited(0, 0), S.SUCCEEDED,
     {"exit_code": 0}, keys("n1/g0")),
    ("gang part again", job(S.RUNNING, GANG, parts_exited=((1, 0),)), Exited(1, 0), None, {},
     ()),
]


@pytest.mark.parametrize(("case", "before", "event", "state", "fields", "released"), REPORTS,
                         ids=[r[0] for r in REPORTS])
def test_report(case: str, before: Job, event: JobEvent, state: JobState | None,
                fields: dict[str, Any], released: Any) -> None:
    change = T.report(before, 1, event, NOW)
    if state is None:
        assert change is None
        return
    assert change is not None
    new = change.job
    assert (new.state, new.version, change.expected_version) == (state, 5, 4)
    for name, value in fields.items():
        assert getattr(new, name) == value, name
    assert change.claim == ()
    assert change.release == released
    assert change.release_owner == ("j-1:1" if released else "")
    if state in (S.SUCCEEDED, S.FAILED, S.CANCELLED) or case == "preempted":
        assert new.attempts[-1].ended_at == NOW


@pytest.mark.parametrize(("case", "before", "attempt"), [
    ("older attempt", job(S.RUNNING, attempt=2), 1),
    ("newer attempt", job(S.RUNNING), 2),
    ("pending", job(S.PENDING), 1),
    ("finished", job(S.SUCCEEDED), 1),
])
def test_report_refuses_stale_attempts(case: str, before: Job, attempt: int) -> None:
    for event in (Started(0), Exited(0, 0), StartFailed(0, "x")):
        with pytest.raises(StaleAttempt):
            T.report(before, attempt, event, NOW)


def test_report_reasons_and_history() -> None:
    failed = T.report(job(S.RUNNING), 1, Exited(0, 3, "TimeLimit"), NOW)
    assert failed is not None and failed.job.history[-1].reason == "TimeLimit (exit 3)"
    sf = T.report(job(S.STARTING), 1, StartFailed(0, "bad"), NOW)
    assert sf is not None and sf.job.history[-1].reason == "StartFailed: bad (exit 127)"
    gang = T.report(job(S.RUNNING, GANG), 1, Exited(1, 4, "Signal"), NOW)
    assert gang is not None and gang.job.history[-1].reason == "Part 1 failed (Signal, exit 4)"
    pre = T.report(job(S.STOPPING, stop_target=S.PREEMPTED), 1, Exited(0, -15), NOW)
    assert pre is not None
    assert [(h.state, h.attempt) for h in pre.job.history[1:]] == [(S.PREEMPTED, 1),
                                                                    (S.PENDING, 2)]
    assert pre.job.attempts[-1].outcome == "PREEMPTED"


# -- _final_state ----------------------------------------------------------------------------


@pytest.mark.parametrize(("state", "target", "code", "want"), [
    (S.RUNNING, None, 0, (S.SUCCEEDED, "Exited 0")),
    (S.RUNNING, None, 1, (S.FAILED, "why (exit 1)")),
    (S.STARTING, None, 0, (S.SUCCEEDED, "Exited 0")),
    (S.STOPPING, S.CANCELLED, 0, (S.CANCELLED, "Cancelled")),
    (S.STOPPING, S.CANCELLED, 9, (S.CANCELLED, "Cancelled")),
    (S.STOPPING, S.PREEMPTED, 9, (S.PREEMPTED, "Preempted")),
    (S.STOPPING, S.PREEMPTED, 0, (S.SUCCEEDED, "Exited 0")),
    (S.STOPPING, S.FAILED, 0, (S.FAILED, "GangPartFailed")),
    (S.STOPPING, S.FAILED, 2, (S.FAILED, "GangPartFailed")),
    (S.RUNNING, S.CANCELLED, 0, (S.SUCCEEDED, "Exited 0")),  # a target counts only when stopping
])
def test_final_state(state: JobState, target: JobState | None, code: int,
                     want: tuple[JobState, str]) -> None:
    assert T._final_state(job(state, stop_target=target), code, "why") == want


# -- requeued and lose -----------------------------------------------------------------------


def _ended(*outcomes: JobState) -> tuple[Attempt, ...]:
    """Attempts 1.. that ended so, one second each."""
    return tuple(Attempt(i, (), float(i), float(i) + 1, o.value)
                 for i, o in enumerate(outcomes, start=1))


L, P = S.LOST, S.PREEMPTED


@pytest.mark.parametrize(("state", "ended", "limits", "want_state"), [
    (S.PREEMPTED, (P,), (5, 100), S.PENDING),
    (S.PREEMPTED, (P,) * 5, (5, 100), S.PENDING),  # a preemption is not a loss
    (S.PREEMPTED, (L,) * 4 + (P,), (5, 100), S.PENDING),  # nor a loss before it, a preemption
    (S.PREEMPTED, (P,) * 99, (5, 100), S.PENDING),
    (S.PREEMPTED, (P,) * 100, (5, 100), S.FAILED),  # its own, higher limit
    (S.LOST, (L,), (5, 100), S.PENDING),
    (S.LOST, (L,) * 4, (5, 100), S.PENDING),
    (S.LOST, (P,) * 4 + (L,), (5, 100), S.PENDING),  # preempted four times and lost once
    (S.LOST, (L,) * 5, (5, 100), S.FAILED),
    (S.LOST, (P, L, P, L, L, L, L), (5, 100), S.FAILED),
    (S.LOST, (L,) * 2, (2, 100), S.FAILED),
])
def test_requeued(state: JobState, ended: tuple[JobState, ...], limits: tuple[int, int],
                  want_state: JobState) -> None:
    attempt = len(ended)
    before = replace(job(state, attempt=attempt, stop_target=S.PREEMPTED, parts_exited=((0, 1),),
                         exit_code=1, started_at=20.0), attempts=_ended(*ended))
    new = T.requeued(before, NOW, *limits)
    want_attempt = attempt + 1 if want_state is S.PENDING else attempt
    assert (new.state, new.attempt) == (want_state, want_attempt)
    assert new.history[-1].attempt == want_attempt
    if want_state is S.PENDING:
        assert (new.allocations, new.parts_exited, new.stop_target, new.exit_code,
                new.started_at) == ((), (), None, None, None)
        assert new.history[-1].reason == f"Requeued after {state.value.lower()} attempt {attempt}"
        assert new.attempts == before.attempts  # the past placement stays on record
    else:
        assert new.finished_at == NOW
        n = sum(1 for o in ended if o is state)
        what = ("lost attempts (max_attempts" if state is S.LOST
                else "preemptions (max_preemptions")
        assert new.history[-1].reason.startswith(f"Gave up after {n} {what}")


@pytest.mark.parametrize(("state", "attempt", "lost_before", "want_state"), [
    (S.STARTING, 1, 0, S.PENDING), (S.RUNNING, 2, 1, S.PENDING), (S.STOPPING, 1, 0, S.PENDING),
    (S.RUNNING, 3, 2, S.FAILED),  # its third loss, with max_attempts 3
    (S.RUNNING, 5, 1, S.PENDING),  # attempts 2-4 were preempted: a second loss only
])
def test_lose(state: JobState, attempt: int, lost_before: int, want_state: JobState) -> None:
    before = job(state, GANG, attempt=attempt)
    earlier = _ended(*([S.LOST] * lost_before + [S.PREEMPTED] * (attempt - 1 - lost_before)))
    before = replace(before, attempts=(*earlier, *before.attempts))
    change = T.lose(before, NOW, "Node n1 lease expired", max_attempts=3)
    new = change.job
    assert (new.state, new.version, change.expected_version) == (want_state, 5, 4)
    assert change.release == keys("n1/g0", "n2/g5", "n2/g6")
    assert change.release_owner == f"j-1:{attempt}" and change.claim == ()
    assert new.history[1] == HistoryEntry(S.LOST, NOW, "Node n1 lease expired", attempt)
    assert new.attempts[-1].outcome == "LOST" and new.attempts[-1].ended_at == NOW
    assert new.attempt == (attempt + 1 if want_state is S.PENDING else attempt)


# -- cancel and preempt ----------------------------------------------------------------------


@pytest.mark.parametrize(("before", "want_state", "want_target", "history_added"), [
    (job(S.PENDING), S.CANCELLED, None, [S.CANCELLED]),
    (job(S.PREEMPTED), S.CANCELLED, None, [S.PENDING, S.CANCELLED]),
    (job(S.LOST), S.CANCELLED, None, [S.PENDING, S.CANCELLED]),
    (job(S.STARTING), S.STOPPING, S.CANCELLED, [S.STOPPING]),
    (job(S.RUNNING), S.STOPPING, S.CANCELLED, [S.STOPPING]),
    (job(S.STOPPING, stop_target=S.PREEMPTED), S.STOPPING, S.CANCELLED, []),
    (job(S.STOPPING, stop_target=S.FAILED), S.STOPPING, S.CANCELLED, []),
    (job(S.STOPPING, stop_target=S.CANCELLED), None, None, None),
    (job(S.SUCCEEDED), None, None, None),
    (job(S.FAILED), None, None, None),
    (job(S.CANCELLED), None, None, None),
], ids=lambda v: v.state.value if isinstance(v, Job) else None)
def test_cancel(before: Job, want_state: JobState | None, want_target: JobState | None,
                history_added: list[JobState] | None) -> None:
    change = T.cancel(before, NOW, "user asked")
    if want_state is None:
        assert change is None
        return
    assert change is not None
    new = change.job
    assert (new.state, new.stop_target, new.version) == (want_state, want_target, 5)
    assert (change.expected_version, change.claim, change.release) == (4, (), ())
    assert [h.state for h in new.history[len(before.history):]] == history_added
    if want_state is S.CANCELLED:
        assert new.finished_at == NOW and new.history[-1].reason == "user asked"


@pytest.mark.parametrize(("before", "attempt", "outcome"), [
    (job(S.STARTING), 1, S.STOPPING),
    (job(S.RUNNING), 1, S.STOPPING),
    (job(S.STOPPING, stop_target=S.CANCELLED), 1, None),
    (job(S.RUNNING), 2, StaleAttempt),
    (job(S.PENDING), 1, StaleAttempt),
    (job(S.SUCCEEDED), 1, StaleAttempt),
])
def test_preempt(before: Job, attempt: int, outcome: Any) -> None:
    if outcome is StaleAttempt:
        with pytest.raises(StaleAttempt):
            T.preempt(before, attempt, NOW, "room")
        return
    change = T.preempt(before, attempt, NOW, "room")
    if outcome is None:
        assert change is None
        return
    assert change is not None
    new = change.job
    assert (new.state, new.stop_target, new.version, change.expected_version) == (
        S.STOPPING, S.PREEMPTED, 5, 4)
    assert new.history[-1] == HistoryEntry(S.STOPPING, NOW, "room", 1, EvictionKind.PRIORITY)
    assert change.release == () and change.claim == ()
