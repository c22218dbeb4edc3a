"""Priority classes and teams: what the configuration names and the policies read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PriorityClass:
    """A priority class: its rank orders the queue; its SLA is the longest wait it accepts."""

    name: str
    rank: int
    sla_s: float
    may_preempt: bool = False
    preemptible: bool = True
    may_burst: bool = True
    spot_allowed: bool = True
    flexible: bool = False  # its jobs may wait for cleaner power within the SLA (defer)


@dataclass(frozen=True)
class Team:
    """A team: its fair-share weight and the on-prem GPUs it is guaranteed (others may borrow
    them while idle; the owner reclaims them, by preemption where the borrowers allow it)."""

    name: str
    weight: float = 1.0
    quota_gpus: int = 0
