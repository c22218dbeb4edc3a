"""What an agent reports about one part (rank) of one attempt of a job."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Started:
    rank: int = 0
    pid: int | None = None
    note: str = ""  # why it runs elsewhere than its workdir; in the job's history


STOPPED = "Stopped"
"""``Exited.reason`` when the process ended after the agent sent it SIGTERM (cancel or
preemption). A preempted job that exits 0 after SIGTERM has checkpointed; it is requeued."""


@dataclass(frozen=True)
class Exited:
    """The part's process ended. ``reason`` says how (Exited, TimeLimit, Signal, Preempted...)."""

    rank: int
    exit_code: int
    reason: str = "Exited"


@dataclass(frozen=True)
class StartFailed:
    rank: int
    message: str


JobEvent = Started | Exited | StartFailed
