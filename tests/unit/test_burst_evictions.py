"""Preempt or burst reads who an eviction makes room for from ``Preempt.for_job``, not from its
reason text (policies/burst/evictions.py, policies/burst/forecast.py ``made_room_for``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.cycle.plan import Preempt
from broker.model.state import EvictionKind
from policies.burst.evictions import PREEMPTIONS, drop_evictions_for, preempted_for
from policies.burst.forecast import made_room_for
from policies.cycle import Memos

K = EvictionKind


@dataclass
class _Cycle(Memos):
    """What the two functions read of a cycle: its evictions (and its memos)."""

    evictions: list[Preempt] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()


def ev(victim: str, kind: EvictionKind, for_job: str | None, reason: str = "") -> Preempt:
    return Preempt(victim, 1, reason or f"preempted by {for_job} (critical, team a)", 30.0,
                   kind, for_job)


ROWS: list[tuple[Preempt, str | None]] = [
    (ev("v1", K.PRIORITY, "p"), "p"),
    (ev("v2", K.QUOTA, "q"), "q"),
    (ev("v3", K.MOVE, "h", "moved to make whole nodes for h"), None),  # not a preemption
    (ev("v4", K.RELIEF, "h", "yielded to h"), None),
    (ev("v5", K.SCAVENGE, "h", "backfill window closed"), None),
    (ev("v6", K.PRIORITY, None, "preempted by x (critical, team a)"), None),  # text not read
    (ev("v7", K.CARBON, None, "pausing for cleaner power"), None),
]


def test_preempted_for_each_kind() -> None:
    assert [preempted_for(p) for p, _ in ROWS] == [want for _, want in ROWS]
    assert {K.PRIORITY, K.QUOTA} == PREEMPTIONS


def test_made_room_for_follows_the_evictions() -> None:
    cycle: Any = _Cycle([p for p, _ in ROWS])
    assert made_room_for(cycle) == {"p", "q"}
    cycle.evictions.append(ev("v8", K.PRIORITY, "r"))
    assert made_room_for(cycle) == {"p", "q", "r"}  # (memo kept per count of evictions)


def test_a_burst_drops_only_the_preemptions_made_for_it() -> None:
    cycle: Any = _Cycle([p for p, _ in ROWS])
    drop_evictions_for(cycle, {"p", "h", "x"})
    assert [p.job_id for p in cycle.evictions] == ["v2", "v3", "v4", "v5", "v6", "v7"]
