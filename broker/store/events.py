"""What an agent reports about one part (rank) of one attempt of a job."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Started:
    rank: int = 0
    pid: int | None = None


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
