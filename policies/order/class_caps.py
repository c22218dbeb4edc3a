"""Per-team caps on the GPUs held in each priority class, checked when a job is admitted.

A team's ``class_caps`` (the configuration's ``teams: [{name, class_caps: {high: 16}}]``;
broker/model/classes.py ``Team``) bound the GPUs its jobs of a class hold at once: those
STARTING or RUNNING (a STOPPING job is giving its GPUs back) and those this cycle starts. A job
that would take its team past the cap of its class stays PENDING with a reason that names the
cap, what the team holds and what the job asks; it is neither placed nor given a reservation,
and nothing is rented for it. It is admitted again once the team's jobs of that class end.

This holds whatever the ``admit`` policy: the queue walk (policies/place/queue.py) asks it first.
With no cap configured it refuses nothing and costs a dictionary lookup per job.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from broker.model import Job, Reason
from broker.model.state import JobState
from policies.cycle import Cycle

CODE = "ClassCap"
_HOLDING = (JobState.STARTING, JobState.RUNNING)


@dataclass
class _Held:
    """A cycle's memo: GPUs held per (team, class), and how many of the cycle's starts are
    counted in it."""

    gpus: Counter[tuple[str, str]] | None = None
    counted: int = 0


def over_cap(cycle: Cycle, job: Job) -> Reason | None:
    """Why ``job`` may not start now under its team's cap for its class; None if it may."""
    team = cycle.snap.team_by_name.get(job.team)
    cap = team.class_cap(job.priority) if team is not None and team.class_caps else None
    if cap is None:
        return None
    held = _held(cycle)[(job.team, job.priority)]
    asked = job.res.total_gpus
    if held + asked <= cap:
        return None
    return Reason(CODE, f"team {job.team!r} may hold at most {cap} GPU(s) of class "
                        f"{job.priority!r} at once (teams[{job.team}].class_caps."
                        f"{job.priority}); it holds {held} (starting and running) and this job "
                        f"asks {asked}: it waits for the team's {job.priority} jobs to end")


def _held(cycle: Cycle) -> Counter[tuple[str, str]]:
    """GPUs held per (team, class): the snapshot's starting and running jobs, then the jobs
    this cycle started so far (counted once each, as the walk goes)."""
    memo = cycle.memo(_Held)
    held = memo.gpus
    if held is None:
        held = memo.gpus = Counter()
        for j in cycle.snap.active:
            if j.state in _HOLDING:
                held[(j.team, j.priority)] += j.res.total_gpus
    for j, _ in cycle.started[memo.counted:]:
        held[(j.team, j.priority)] += j.res.total_gpus
    memo.counted = len(cycle.started)
    return held
