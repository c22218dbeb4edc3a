"""The cleanest window for a job within its deadline, from a carbon-intensity forecast.

Pure arithmetic over a forecast, for the carbon deferral policy (policies/carbon/defer.py) and its
benchmark. Time is cut into *slots* of ``step`` seconds from ``now``; a slot's intensity is the
forecast's mean over it (forecasts are step functions: a ``(t, g)`` step holds until the next
one). Power is taken as constant while a job runs, so a job's emissions are proportional to the
sum of the intensities of the slots it runs in.

- :func:`cleanest_start`: a job that cannot stop (no checkpoint) runs ``k`` consecutive slots;
  the start with the lowest total over its run wins (ties: the earliest).
- :func:`cleanest_slots`: a checkpointable job may pause, so it runs in the ``k`` cleanest
  slots of its window (ties: the earliest), with at least one of them no later than the slot
  it must have started by (its class SLA).

Both are what "Let's Wait Awhile" (Wiesner et al., Middleware'21, section 5) calls the
optimum under a perfect forecast: jobs do not compete for capacity there, so the best choice
for each job alone is the best for all.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence

Steps = Sequence[tuple[float, float]]


def slot_means(steps: Steps, start: float, slots: int, step: float) -> list[float]:
    """The forecast's mean over each of ``slots`` slots of ``step`` seconds from ``start``.

    ``steps`` are ``(t, g)`` sorted by time, each holding until the next; time before the
    first step takes its value, time after the last keeps the last value."""
    if slots <= 0:
        return []
    if not steps:
        raise ValueError("a forecast needs at least one (time, intensity) step")
    fast = _aligned(steps, start, slots, step)
    if fast is not None:
        return fast
    out: list[float] = []
    i, n = 0, len(steps)
    for s in range(slots):
        lo, hi = start + s * step, start + (s + 1) * step
        while i + 1 < n and steps[i + 1][0] <= lo:
            i += 1
        total, t, j = 0.0, lo, i
        while t < hi:  # integrate the step function over [lo, hi)
            nxt = steps[j + 1][0] if j + 1 < n else math.inf
            seg_end = min(hi, nxt)
            total += steps[j][1] * (seg_end - t)
            t = seg_end
            j += 1
        out.append(total / step)
    return out


def _aligned(steps: Steps, start: float, slots: int, step: float) -> list[float] | None:
    """The slot means when the forecast's steps are the slots themselves (the usual case:
    a half-hourly forecast and half-hour slots from a step's time), else None."""
    i = bisect.bisect_left(steps, start, key=lambda s: s[0]) if steps[0][0] <= start else -1
    if i < 0 or i + slots > len(steps) or steps[i][0] != start:
        return None
    if any(steps[i + s][0] != start + s * step for s in range(1, slots)):
        return None
    if i + slots < len(steps) and steps[i + slots][0] < start + slots * step:
        return None  # (a finer step right after the window would not matter; be strict)
    return [float(g) for _, g in steps[i:i + slots]]


def slots_for(seconds: float, step: float) -> int:
    """How many whole slots ``seconds`` of work needs (at least one)."""
    return max(1, math.ceil(seconds / step - 1e-9))


def cleanest_start(means: Sequence[float], k: int, latest: int) -> tuple[int, float]:
    """(first slot, total) of the ``k`` consecutive slots with the lowest total, starting at
    slot 0 .. ``latest`` (ties: the earliest). ``means`` must hold ``latest + k`` slots."""
    if k < 1 or latest < 0 or len(means) < latest + k:
        raise ValueError(f"need k >= 1, latest >= 0 and {latest + k} slots, got k={k}, "
                         f"latest={latest}, {len(means)} slots")
    window = math.fsum(means[:k])
    best, best_at = window, 0
    for s in range(1, latest + 1):
        window += means[s + k - 1] - means[s - 1]
        if window < best - 1e-9 * abs(best):
            best, best_at = window, s
    return best_at, math.fsum(means[best_at:best_at + k])


def cleanest_slots(means: Sequence[float], k: int, start_by: int | None = None
                   ) -> list[int]:
    """The ``k`` cleanest slots (sorted; ties: the earliest), at least one of them at or before
    slot ``start_by`` (None: no such bound). ``means`` must hold at least ``k`` slots."""
    if k < 1 or len(means) < k:
        raise ValueError(f"need k >= 1 and at least k slots, got k={k}, {len(means)} slots")
    chosen = heapq.nsmallest(k, range(len(means)), key=lambda s: (means[s], s))
    if start_by is not None and min(chosen) > start_by:
        # it must start by then: the cleanest slot up to start_by, and the k-1 cleanest others
        first = min(range(min(start_by, len(means) - 1) + 1), key=lambda s: (means[s], s))
        rest = heapq.nsmallest(k - 1, (s for s in range(len(means)) if s != first),
                               key=lambda s: (means[s], s))
        chosen = [first, *rest]
    return sorted(chosen)


def smoothed(values: Sequence[float], half: int) -> list[float]:
    """The centred moving average over ``2 * half + 1`` values (fewer at the ends)."""
    if half <= 0:
        return list(values)
    n, out = len(values), []
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    for i in range(n):
        lo, hi = max(0, i - half), min(n, i + half + 1)
        out.append((prefix[hi] - prefix[lo]) / (hi - lo))
    return out


def runs_of(slots: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted slot numbers as runs ``[first, end)`` of consecutive slots."""
    out: list[tuple[int, int]] = []
    for s in slots:
        if out and out[-1][1] == s:
            out[-1] = (out[-1][0], s + 1)
        else:
            out.append((s, s + 1))
    return out
