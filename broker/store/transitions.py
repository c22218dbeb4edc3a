"""Pure job-record updates shared by every store backend.

Each function takes a Job and returns the new Job plus the GPU claims and releases the
backend must apply atomically with it. Backends only provide compare-and-set persistence.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from broker.cycle.plan import Start
from broker.errors import StaleAttempt
from broker.model import Allocation, Attempt, Job
from broker.model.state import ACTIVE, TERMINAL, UNCOUNTED_STOPS, EvictionKind, JobState
from broker.store.events import STOPPED, Exited, JobEvent, Started

S = JobState
GpuKey = tuple[str, str]  # (node id, GPU id)


@dataclass(frozen=True)
class Change:
    """One atomic write: the new job record, guarded by the version it was computed from."""

    job: Job
    expected_version: int  # 0: the job must not exist yet
    claim: tuple[GpuKey, ...] = ()  # must be free; become owned by job:attempt
    release: tuple[GpuKey, ...] = ()  # freed when owned by ``release_owner``
    release_owner: str = ""
    # the SHA-1 (hex) of the stored document this change was computed from, when the backend
    # applies it to a copy it did not read again ("": not checked): the commit refuses it
    # (CHANGED) if the record was rewritten meanwhile, even without a new version
    expected_doc: str = ""

    @property
    def owner(self) -> str:
        return owner_of(self.job.id, self.job.attempt)


def owner_of(job_id: str, attempt: int) -> str:
    return f"{job_id}:{attempt}"


def _bump(job: Job) -> Job:
    return replace(job, version=job.version + 1)


def _keys(allocs: tuple[Allocation, ...], ranks: set[int] | None = None) -> tuple[GpuKey, ...]:
    return tuple(
        (a.node_id, g) for a in allocs if ranks is None or a.rank in ranks for g in a.gpu_ids
    )


def _close_attempt(job: Job, now: float, outcome: str) -> tuple[Attempt, ...]:
    if not job.attempts or job.attempts[-1].number != job.attempt:
        return job.attempts
    last = replace(job.attempts[-1], ended_at=now, outcome=outcome)
    return (*job.attempts[:-1], last)


def start(job: Job, plan_start: Start, now: float) -> Change:
    """PENDING -> STARTING: claim the planned GPUs for this attempt."""
    if job.state is not S.PENDING or job.attempt != plan_start.attempt:
        raise StaleAttempt(job.id, plan_start.attempt, job.attempt, job.state.value)
    new = job.with_state(
        S.STARTING,
        now,
        "Scheduled on " + ",".join(a.node_id for a in plan_start.allocations),
        allocations=plan_start.allocations,
        attempts=(*job.attempts, Attempt(job.attempt, plan_start.allocations, now)),
        parts_exited=(),
        exit_code=None,
        pending_reason=None,
    )
    return Change(_bump(new), job.version, claim=_keys(plan_start.allocations))


def check_attempt(job: Job, attempt: int) -> None:
    """Fencing: only the current attempt of an active job may act."""
    if job.attempt != attempt or job.state not in ACTIVE:
        raise StaleAttempt(job.id, attempt, job.attempt, job.state.value)


def report(job: Job, attempt: int, event: JobEvent, now: float,
           max_preemptions: int = 10**9) -> Change | None:
    """Apply an agent's report; None when it changes nothing (a repeated message)."""
    check_attempt(job, attempt)
    if isinstance(event, Started):
        if job.state is not S.STARTING:
            return None  # already RUNNING or STOPPING: repeated or late report
        why = f"Started; {event.note}" if event.note else "Started"
        return Change(_bump(job.with_state(S.RUNNING, now, why, started_at=now)), job.version)
    rank = event.rank
    if any(r == rank for r, _ in job.parts_exited):
        return None  # this part's exit was already recorded
    if all(a.rank != rank for a in job.allocations):
        return None  # no such part in this attempt: ignore rather than finish the job
    code = event.exit_code if isinstance(event, Exited) else 127
    why = event.reason if isinstance(event, Exited) else f"StartFailed: {event.message}"
    parts = (*job.parts_exited, (rank, code))
    release = _keys(job.allocations, {rank})
    owner = owner_of(job.id, job.attempt)
    done = len(parts) == len(job.allocations)
    if not done:
        new = replace(job, parts_exited=parts)
        if code != 0 and job.state is not S.STOPPING:
            # one part of a gang failed: stop the others, the job fails
            new = new.with_state(S.STOPPING, now, f"Part {rank} failed ({why}, exit {code})",
                                 stop_target=S.FAILED)
        return Change(_bump(new), job.version, release=release, release_owner=owner)
    worst = next((c for _, c in parts if c != 0), 0)
    final, reason = _final_state(job, worst, why)
    new = job.with_state(
        final,
        now,
        reason,
        parts_exited=parts,
        exit_code=worst,
        attempts=_close_attempt(job, now, final.value),
        finished_at=now if final in TERMINAL else None,
    )
    if final is S.PREEMPTED:
        new = requeued(new, now, max_attempts=10**9, max_preemptions=max_preemptions)
    return Change(_bump(new), job.version, release=release, release_owner=owner)


def _final_state(job: Job, code: int, why: str) -> tuple[JobState, str]:
    target = job.stop_target if job.state is S.STOPPING else None
    if target is S.CANCELLED:
        return S.CANCELLED, "Cancelled"
    if target is S.PREEMPTED and (code != 0 or why == STOPPED):
        return S.PREEMPTED, "Preempted"  # exit 0 after SIGTERM: a checkpoint, not the end
    if target is S.FAILED:
        return S.FAILED, "GangPartFailed"
    if code == 0:
        return S.SUCCEEDED, "Exited 0"
    return S.FAILED, f"{why} (exit {code})"


def outcomes(job: Job, outcome: JobState) -> int:
    """How many of the job's attempts ended so (LOST: its node died; PREEMPTED: evicted)."""
    return sum(1 for a in job.attempts if a.outcome == outcome.value)


def counted_preemptions(job: Job) -> int:
    """The job's preemptions that count toward ``max_preemptions``: its attempts that ended
    PREEMPTED, less its own pauses through dirty-power peaks and its spot interruptions
    (:data:`~broker.model.state.UNCOUNTED_STOPS`), each found by the kind on the STOPPING entry
    before a PREEMPTED one in its history."""
    uncounted, kind = 0, None
    for h in job.history:
        if h.state is S.STOPPING:
            kind = h.kind
        elif h.state is S.PREEMPTED:
            uncounted += kind in UNCOUNTED_STOPS
            kind = None
    return outcomes(job, S.PREEMPTED) - uncounted


def requeued(job: Job, now: float, max_attempts: int, max_preemptions: int = 10**9) -> Job:
    """PREEMPTED or LOST -> PENDING with the attempt raised. A job lost ``max_attempts``
    times fails, and so does one preempted ``max_preemptions`` times: each limit counts its
    own kind of ending (a preemption is not a loss; a carbon pause is neither)."""
    if job.state is S.LOST and (n := outcomes(job, S.LOST)) >= max_attempts:
        return job.with_state(S.FAILED, now, f"Gave up after {n} lost attempts "
                                             f"(max_attempts {max_attempts})", finished_at=now)
    if job.state is S.PREEMPTED and (n := counted_preemptions(job)) >= max_preemptions:
        return job.with_state(S.FAILED, now, f"Gave up after {n} preemptions "
                                             f"(max_preemptions {max_preemptions})",
                              finished_at=now)
    return job.with_state(
        S.PENDING,
        now,
        f"Requeued after {job.state.value.lower()} attempt {job.attempt}",
        attempt=job.attempt + 1,
        allocations=(),
        parts_exited=(),
        stop_target=None,
        exit_code=None,
        started_at=None,
    )


def lose(job: Job, now: float, reason: str, max_attempts: int) -> Change:
    """An active job whose node died: LOST, its GPUs released, then requeued in one write."""
    owner = owner_of(job.id, job.attempt)
    lost = job.with_state(S.LOST, now, reason, attempts=_close_attempt(job, now, "LOST"))
    return Change(_bump(requeued(lost, now, max_attempts)), job.version,
                  release=_keys(job.allocations), release_owner=owner)


def cancel(job: Job, now: float, reason: str) -> Change | None:
    """Cancel: a queued job ends at once; a placed one goes to STOPPING (target CANCELLED)."""
    if job.state in TERMINAL:
        return None
    if job.state in (S.PENDING, S.PREEMPTED, S.LOST):
        base = job if job.state is S.PENDING else requeued(job, now, 10**9)
        new = base.with_state(S.CANCELLED, now, reason, finished_at=now)
        return Change(_bump(new), job.version)
    if job.state is S.STOPPING:
        if job.stop_target is S.CANCELLED:
            return None
        return Change(_bump(replace(job, stop_target=S.CANCELLED)), job.version)
    new = job.with_state(S.STOPPING, now, reason, stop_target=S.CANCELLED)
    return Change(_bump(new), job.version)


def preempt(job: Job, attempt: int, now: float, reason: str,
            kind: EvictionKind = EvictionKind.PRIORITY) -> Change | None:
    check_attempt(job, attempt)
    if job.state is S.STOPPING:
        return None
    new = job.with_state(S.STOPPING, now, reason, kind, stop_target=S.PREEMPTED)
    return Change(_bump(new), job.version)
