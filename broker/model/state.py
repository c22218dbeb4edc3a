"""Job states and the explicit transition table.

Every change of a job's state goes through :func:`transition`, which refuses an edge that
is not in :data:`TRANSITIONS` and appends ``(state, time, reason)`` to the job's history.
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    PENDING = "PENDING"  # queued, waiting for a placement
    STARTING = "STARTING"  # placed; GPUs allocated; start command sent to the node(s)
    RUNNING = "RUNNING"  # the agent has the job's process running
    STOPPING = "STOPPING"  # cancel or preemption asked; waiting for the process to exit
    SUCCEEDED = "SUCCEEDED"  # exited 0
    FAILED = "FAILED"  # exited non-zero, could not start, hit its time limit, or ran out of retries
    CANCELLED = "CANCELLED"  # a user cancelled it
    PREEMPTED = "PREEMPTED"  # evicted to make room; goes back to PENDING with attempt + 1
    LOST = "LOST"  # its node's lease expired; goes back to PENDING with attempt + 1

    def __str__(self) -> str:
        return self.value


class EvictionKind(str, Enum):
    """Why a running job was stopped to make room (on its Preempt and in its history)."""

    PRIORITY = "priority"  # a class that may preempt took the GPUs of a lower-ranked job
    QUOTA = "quota"  # a team below its guaranteed GPUs reclaimed them from a borrower
    SCAVENGE = "scavenge"  # it used a reservation's idle GPUs; the reservation is due
    MOVE = "move"  # defragmentation: restarts at once elsewhere to make whole nodes
    RELIEF = "relief"  # a short job starved far past its runtime needed its GPUs
    SPOT = "spot"  # the cloud is reclaiming its spot instance (an interruption notice)
    BUDGET = "budget"  # its team's hard budget ran out
    CARBON = "carbon"  # a checkpointed deferrable job pauses through a dirty-power peak
    SPOT_MOVE = "spot-move"  # it leaves on-demand for a spot machine launched for it
    MARKET = "market"  # a job with a deadline leaves on-demand for spot, or to wait for it
    HOME = "home"  # it leaves a rented machine for on-prem GPUs that stand idle

    def __str__(self) -> str:
        return self.value


#: Evictions after which a job goes back to the front of the queue: it lost its GPUs only for
#: the sake of one other job (or to move to a spot machine launched for it, or home to idle
#: on-prem GPUs), and restarts as soon as GPUs free up (policies/evict/defrag.py, relief.py,
#: burst_spot_move.py, burst_home.py)
RESUMES_FIRST = frozenset({EvictionKind.MOVE, EvictionKind.RELIEF, EvictionKind.SPOT_MOVE,
                           EvictionKind.HOME})

#: Evictions after which the job's rented machine drains at once: it leaves it on purpose
#: (for spot, or for on-prem), and the machine would otherwise idle until the idle timeout
LEAVES_MACHINE = frozenset({EvictionKind.SPOT_MOVE, EvictionKind.HOME})

#: Evictions that do not count toward ``max_preemptions`` (broker/store/transitions.py
#: ``counted_preemptions``): the job's own plan, a checkpointed deferrable job pausing through a
#: dirty-power peak (a multi-week job pauses about twice a day); and spot interruptions, which
#: the market makes, not a scheduling loop (a month-long job on spot machines that go 0.5-1.2
#: times an hour held is interrupted hundreds of times and resumes from its checkpoint each
#: time, as SkyPilot's managed jobs recover without limit; the two months of seed 0 failed such
#: a job at its 100th eviction, most of them spot)
UNCOUNTED_STOPS = frozenset({EvictionKind.CARBON, EvictionKind.SPOT})


S = JobState

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.PENDING: frozenset(
        {
            S.STARTING,  # a scheduling cycle placed it and claimed its GPUs
            S.CANCELLED,  # cancelled while queued
            S.FAILED,  # can never run (e.g. gave up after too many attempts)
        }
    ),
    S.STARTING: frozenset(
        {
            S.RUNNING,  # the agent started its process
            S.FAILED,  # the agent could not start it (bad command, missing workdir)
            S.STOPPING,  # cancelled or preempted before the agent started it
            S.LOST,  # the node died before the job started
            S.SUCCEEDED,  # a very short job exited before its RUNNING report was written
        }
    ),
    S.RUNNING: frozenset(
        {
            S.SUCCEEDED,  # every part exited 0
            S.FAILED,  # a part exited non-zero or hit the time limit
            S.STOPPING,  # cancel or preemption asked; SIGTERM sent, grace running
            S.LOST,  # the node's lease expired
        }
    ),
    S.STOPPING: frozenset(
        {
            S.CANCELLED,  # stopped on a user's request
            S.PREEMPTED,  # stopped to make room
            S.SUCCEEDED,  # finished on its own before the stop landed
            S.FAILED,  # a gang part failed and the others were stopped
            S.LOST,  # the node died while stopping
        }
    ),
    S.PREEMPTED: frozenset(
        {
            S.PENDING,  # requeued, attempt + 1
            S.FAILED,  # evicted max_preemptions times: it gives up
        }
    ),
    S.LOST: frozenset(
        {
            S.PENDING,  # requeued, attempt + 1
            S.FAILED,  # its node died under it max_attempts times: it gives up
        }
    ),
    S.SUCCEEDED: frozenset(),  # terminal
    S.FAILED: frozenset(),  # terminal
    S.CANCELLED: frozenset(),  # terminal
}

TERMINAL: frozenset[JobState] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
ACTIVE: frozenset[JobState] = frozenset({S.STARTING, S.RUNNING, S.STOPPING})
"""States in which a job holds GPUs."""


def can_move(src: JobState, dst: JobState) -> bool:
    return dst in TRANSITIONS[src]
