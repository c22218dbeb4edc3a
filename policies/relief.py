"""Relief: a short job starved far past its runtime may make room by evicting long
checkpointable jobs, when what it gains outweighs what they lose many times over.

EASY backfill gives the first blocked job a reservation at the time enough GPUs of one model
free up on enough nodes. When every node is held by jobs running for days, a wide job that runs
for minutes gets a reservation days away: a 32-GPU job of 6 minutes may wait 30 hours, a
slowdown of 300, while evicting the 1-GPU jobs of 20 hours on its four nodes would cost each of
them a checkpoint and a wait of about 6 minutes (a slowdown of 1.005). Defragmentation cannot
help on a full cluster (the moved jobs have nowhere to land), and class preemption does not
apply between jobs of the same class. This is the trade that Tiresias (Gu et al., NSDI 2019)
and Gandiva's time-slicing (Xiao et al., OSDI 2018) make for deep-learning jobs, which
checkpoint: a job that has had little service goes ahead of one that has had much, by
preemption. Spillway makes it only where the trade is lopsided, by a documented test:

- only for the job holding the reservation (one per cycle), when nothing else is being evicted
  or moved in the cycle, and when its reservation is at least ``defrag_min_gain_s`` away;
- its *gain* is the slowdown it is spared: ``(reservation start - now - grace) / e``, with
  ``e`` its runtime estimate (at least ``min_estimate_s``); it must be at least
  ``relief_slowdown``;
- victims: running, checkpointable, of a preemptible class of any rank (the classes that share
  spillway's queue are not ranked against each other there, so neither are they here),
  started at least ``min_runtime_s`` ago (no thrashing) and not expected to end within
  ``defrag_min_gain_s`` anyway; chosen by the preemption rule's order (``policies/preemption.py``:
  fewest victims, least work lost, ...);
- each victim's *cost* is the slowdown it takes by waiting for the holder: ``(e + grace) / r``,
  with ``r`` its own runtime estimate; the eviction happens only if the gain is at least
  ``relief_ratio`` times the victims' summed cost;
- a victim is evicted like any preempted job (SIGTERM, grace to checkpoint, requeue with its
  attempt raised and ``SPILLWAY_RESUME=1``), with a reason that starts with :data:`YIELDED`, and
  it goes back to the front of the queue, right after the reservation holder (as jobs moved by
  defragmentation do), so it restarts as soon as GPUs free up: usually on the same GPUs, when
  the holder ends.

The test is deterministic and knows nothing of sites: it holds on cloud nodes as on-prem.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.model import Job
from broker.state import JobState
from policies.defrag import MOVED

YIELDED = "yielded to"  # how a relief eviction's reason starts


def _last_stop_reason(job: Job) -> str | None:
    for h in reversed(job.history):
        if h.state is JobState.STOPPING:
            return h.reason
    return None


def resumes_first(job: Job) -> bool:
    """Was the job requeued by a move (defragmentation) or by relief? Either way it lost its
    GPUs only for another job's sake, and it goes back to the front of the queue."""
    if job.attempt <= 1:
        return False
    why = _last_stop_reason(job)
    return why is not None and (why.startswith(MOVED) or why.startswith(YIELDED))


def gain(start_at: float, now: float, grace_s: float, estimate_s: float) -> float:
    """The slowdown a holder is spared by starting after ``grace_s`` instead of at its
    reservation's start."""
    return max(0.0, start_at - now - grace_s) / estimate_s


def cost(holder_estimate_s: float, grace_s: float, victim_estimates: Iterable[float]) -> float:
    """The slowdown the victims take in all: each waits about the holder's runtime and a
    grace period, against its own runtime."""
    return sum((holder_estimate_s + grace_s) / r for r in victim_estimates)


def worth_it(gain_: float, cost_: float, min_slowdown: float, ratio: float) -> bool:
    """The relief test: a large enough gain, and at least ``ratio`` times the cost."""
    return gain_ >= min_slowdown and gain_ >= ratio * cost_


__all__ = ["YIELDED", "cost", "gain", "resumes_first", "worth_it"]
